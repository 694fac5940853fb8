"""The context vector of a log-bilinear model (Mnih & Hinton, 2007; Allamanis et al., 2015).

A log-bilinear (LBL) model scores a target ``t`` in a context ``c`` as ``s(t, c) = r̂_c · q_t + b_t``:
``q_t`` is the target's embedding, ``b_t`` its bias, and the context vector ``r̂_c`` is a sum of
context embeddings, each position weighted by its own diagonal matrix (a D-vector, applied
element-wise with ``⊙``):

    r̂_c = Σ_{f ∈ features} r_f  +  Σ_{0<|k|≤K} C_k ⊙ r_{t_{i+k}}  [ +  Σ_{j=1..M} H_j ⊙ r_{s_{-j}} ]

* ``features``: a set of ids (the identifiers of a method body, ...), an unweighted sum;
* ``t_{i+k}``: the tokens at distance ``k`` around the predicted position, ``K`` each side;
* ``s_{-j}``: optional history, the ``j``-th previous token of a sequence being generated (the
  subtoken naming model's previous ``M`` subtokens), each slot with its own ``H_j``.

Id 0 is padding everywhere: its embedding is zero and gets no gradient, so a padded feature,
context or history slot contributes nothing.
"""

from __future__ import annotations

import torch
from torch import nn

PADDING_ID = 0


def history_windows(tokens: torch.Tensor, history_size: int, start_id: int) -> torch.Tensor:
    """The previous ``history_size`` tokens before every position of ``tokens`` and after its end.

    Args:
        tokens: ``[..., T]`` long, a generated (or teacher-forced) sequence.
        history_size: M.
        start_id: the id that fills the slots before the first token.

    Returns:
        ``[..., T + 1, M]`` long: row ``i`` holds tokens ``i-1, i-2, ..., i-M`` (slot 0 = the
        previous token), ``start_id`` where that index is before the sequence.
    """
    leading = tokens.shape[:-1]
    if history_size == 0:
        return tokens.new_zeros(*leading, tokens.shape[-1] + 1, 0)
    starts = tokens.new_full((*leading, history_size), start_id)
    padded = torch.cat([starts, tokens], dim=-1)  # [..., M + T]
    return padded.unfold(-1, history_size, 1).flip(-1)  # [..., T + 1, M], window i = padded[i : i + M]


class LogBilinearContext(nn.Module):
    """Computes ``r̂_c`` (see the module docstring) from feature, context-token and history ids.

    Args:
        num_features: feature vocabulary size (id 0 = padding).
        num_context_tokens: context-token vocabulary size (id 0 = padding).
        embed_dim: D.
        context_size: K, the tokens used on each side.
        num_history_tokens: history vocabulary size (0: no history).
        history_size: M, the history slots (0: no history).
        init_std: standard deviation of the normal initialisation of the embeddings; the
            diagonal matrices start as ones (every position an unweighted sum).
    """

    def __init__(self, num_features: int, num_context_tokens: int, embed_dim: int, context_size: int,
                 num_history_tokens: int = 0, history_size: int = 0, init_std: float = 0.1):
        super().__init__()
        self.context_size = context_size
        self.history_size = history_size
        self.feature_embed = nn.Embedding(num_features, embed_dim, padding_idx=PADDING_ID)  # r_f
        self.token_embed = nn.Embedding(num_context_tokens, embed_dim, padding_idx=PADDING_ID)  # r_t
        # C_k: rows 0..K-1 are positions -K..-1, rows K..2K-1 are +1..+K
        self.position_scale = nn.Parameter(torch.ones(2 * context_size, embed_dim))
        embeddings = [self.feature_embed, self.token_embed]
        if history_size > 0:
            self.history_embed = nn.Embedding(num_history_tokens, embed_dim, padding_idx=PADDING_ID)  # r_s
            self.history_scale = nn.Parameter(torch.ones(history_size, embed_dim))  # H_j, row j-1
            embeddings.append(self.history_embed)
        with torch.no_grad():
            for embedding in embeddings:
                embedding.weight.normal_(0.0, init_std)
                embedding.weight[PADDING_ID].zero_()

    def nearest_context(self, context: torch.Tensor) -> torch.Tensor:
        """The K nearest tokens each side of a ``[B, 2 * K_max]`` context (-K_max..-1, +1..+K_max).

        Returns: ``[B, 2 * K]`` long, positions -K..-1 then +1..+K.
        """
        max_size = context.shape[-1] // 2
        if context.shape[-1] != 2 * max_size or max_size < self.context_size:
            raise ValueError(f"LogBilinearContext: the batch's context has {context.shape[-1]} columns, "
                             f"need 2 * K_max with K_max >= context_size {self.context_size}")
        return context[..., max_size - self.context_size : max_size + self.context_size]

    def forward(self, features: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """The features' and context tokens' part of ``r̂_c``.

        Args:
            features: ``[B, F]`` long feature ids (0 = padding).
            context: ``[B, 2 * K_max]`` long context-token ids (0 = padding).

        Returns:
            ``[B, D]``.
        """
        feature_sum = self.feature_embed(features).sum(dim=1)  # [B, D]
        tokens = self.token_embed(self.nearest_context(context))  # [B, 2K, D]
        return feature_sum + (tokens * self.position_scale).sum(dim=1)

    def history(self, history: torch.Tensor) -> torch.Tensor:
        """The history part ``Σ_j H_j ⊙ r_{s_{-j}}``.

        Args:
            history: ``[..., M]`` long, slot 0 = the previous token (:func:`history_windows`).

        Returns:
            ``[..., D]`` (zeros when the module has no history).
        """
        if self.history_size == 0:
            return self.token_embed.weight.new_zeros(*history.shape[:-1], self.token_embed.embedding_dim)
        return (self.history_embed(history) * self.history_scale).sum(dim=-2)
