"""A cache of the hidden states that predicted each chain's mentions (a neural cache over entities).

Dynamic evaluation's gain on re-appearing entities comes from the output layer: every mention
of chain k moves the output vector b^y_k of ``<unk{k}>`` towards the hidden state h_i that had to
predict it, so later positions whose hidden state resembles those h_i give the chain more
probability (benchmarks/results/dntm_quality.md, "2026-12-05 (later)"). This module does that
inside the model, for every document, without a gradient step at test time (Grave et al.'s
neural cache, 2017, over the entity identifiers only):

    c_k(t)  = sum of h_i over the positions i < t of the document whose target is <unk{k}>
    s_k(t)  = (w ⊙ h_t) · c_k(t)          (w [H] learned, zero at the start)

and s_k(t) is added to the logit of ``<unk{k}>``. It is causal (the target of position i is the
input at i + 1 <= t), it is zero for a chain not seen yet, and c_k grows with every mention, so
a chain mentioned often gets a larger score where the context resembles its earlier mentions.
``w = 0`` is the model without the cache, bit for bit.

The cache of a document is carried between steps as ``[B, K, H]``; within one step the
positions before t are read from a ``[B, L, L]`` product masked to the earlier positions of the
same document (rows may hold several documents: ``doc_start``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MentionCache(nn.Module):
    """``(h [B, L, H], target chains [B, L], doc_start [B, L], cache [B, K, H])`` ->
    ``(scores [B, L, K], cache after the step [B, K, H])``.

    Args:
        hidden_dim: H.
    """

    def __init__(self, hidden_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_dim))  # w: starts as the model without the cache

    def forward(self, hidden: torch.Tensor, target_entities: torch.Tensor, doc_start: torch.Tensor | None,
                cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores of every chain at every position of one step, and the cache after it.

        Args:
            hidden: ``[B, L, H]`` the (dropped-out) hidden states the logits are computed from.
            target_entities: ``[B, L]`` long chain 1..K of each position's target, 0 for words and padding.
            doc_start: ``[B, L]`` bool, a document starts at the position (its cache is empty
                there); None when no document starts in the step.
            cache: ``[B, K, H]`` c_k before the step (zero rows for documents just reset).
        """
        width, num_entities = hidden.size(1), cache.size(1)
        # [B, L, K]: which chain each position's target is (padding and words: none)
        targets = F.one_hot(target_entities.to(hidden.device), num_entities + 1)[..., 1:].to(hidden.dtype)
        earlier = torch.ones(width, width, dtype=torch.bool, device=hidden.device).tril(-1)  # [t, i]: i < t
        query = hidden * self.weight  # [B, L, H]
        if doc_start is None:
            allowed = earlier.unsqueeze(0)  # [1, L, L]
            before_step = None
            last_document = None
        else:
            document = doc_start.to(hidden.device).long().cumsum(dim=1)  # [B, L]: 0 = the document the step began in
            allowed = earlier & (document.unsqueeze(2) == document.unsqueeze(1))  # [B, L, L]
            before_step = (document == 0).unsqueeze(-1).to(hidden.dtype)  # [B, L, 1]: may read the carried cache
            last_document = (document == document[:, -1:]).unsqueeze(-1).to(hidden.dtype)  # [B, L, 1]
        pairs = torch.bmm(query, hidden.transpose(1, 2)).masked_fill(~allowed, 0.0)  # [B, L(t), L(i)]
        carried = torch.bmm(query, cache.transpose(1, 2))  # [B, L, K]
        if before_step is not None:
            carried = carried * before_step
        scores = torch.bmm(pairs, targets) + carried  # [B, L, K]
        if last_document is None:
            cache = cache + torch.bmm(targets.transpose(1, 2), hidden)
        else:  # the row's last document: its mentions in this step, on top of the carried cache if it began before
            began_before = before_step[:, -1:, :]  # [B, 1, 1]
            cache = cache * began_before + torch.bmm((targets * last_document).transpose(1, 2), hidden)
        return scores, cache
