"""Per-document adaptation of the entity output rows, learned: the model's own dynamic evaluation of ``<unk{k}>``.

Dynamic evaluation's gain on re-appearing entities comes from the output layer: after each
segment, a gradient step moves the output vector b^y_k of ``<unk{k}>`` by
``eta * sum_i (1[y_i = k] - p_i(k)) h_i`` (RMS-scaled), so chain k gains probability where the
context resembles its mentions and loses it where it was predicted but did not come
(benchmarks/results/dntm_quality.md, "2026-12-05 (later)"). This module makes that step part of
the model, trained end to end, for the K entity rows only:

    after sentence j:   Δb_k <- Δb_k + w ⊙ sum_{i in sentence j} (1[y_i = k] - p_i(k)) h_i
    at position t:      logit of <unk{k}> += h_t · Δb_k       (Δb_k as it was before t's sentence)

with ``w [H]`` a learned per-coordinate rate (zero at the start: the model without it, bit for
bit) and ``p_i`` the model's own final distribution at position i (so an over-predicted chain is
pushed down, which a plain cache of hidden states cannot do). Δb is per document, ``[B, K, H]``,
empty at a document's start. The update is per sentence, so the scores do not depend on how
sentences are grouped into steps. As in dynamic evaluation, every identifier that had
probability gets the ``- p_i(k) h_i`` part, also ``<unk{n+1}>`` before its chain appears (the
"new chain" slot); identifiers masked out (probability 0) get nothing.

When the new chain's logit is not the row's (``model.dntm.new_entity_replaces_static``: the
logit of ``<unk{n+1}>`` is the new-entity score alone), the row b_k is not in that logit and
its gradient there is zero: the ``- p_i(k) h_i`` part is then taken only over chains already
seen (``row_in_logit``), so the new-entity score's probability mass, large wherever a new chain
is likely, does not pile up as a negative shift on the row that the next chain will own. The
first mention still writes ``+ h_i`` (its observed term), as a cache of the chain's first
context would.

Inside a sentence (``model.dntm.entity_row_step: token``) the shift can also move after every
position: position t then reads Δb_k + w ⊙ sum_{i < t in its sentence} e_i(k) h_i, with the error
terms e_i(k) = 1[y_i = k] - p_i(k) of the sentence's own update (p_i from the rows as they were
before the sentence, so that the whole sentence stays one parallel product). In LitBank 42-51 % of
re-appearing mentions have their chain's previous mention in the same sentence, which a
per-sentence step cannot use. At the sentence's end the shift is the per-sentence one, exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class EntityRowAdaptation(nn.Module):
    """Scores from, and the update of, the per-document shift Δb ``[B, K, H]`` of the entity rows.

    Args:
        hidden_dim: H.
    """

    def __init__(self, hidden_dim: int):
        super().__init__()
        self.rate = nn.Parameter(torch.zeros(hidden_dim))  # w: starts as the model without the adaptation

    @staticmethod
    def scores(hidden: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """``h [R, P, H] · Δb [R, K, H]`` -> ``[R, P, K]``: what the shift adds to each entity logit."""
        return torch.bmm(hidden, shift.transpose(1, 2))

    def errors(self, entity_logits: torch.Tensor, word_log_norm: torch.Tensor, target_entities: torch.Tensor,
               mask: torch.Tensor, row_in_logit: torch.Tensor | None = None) -> torch.Tensor:
        """The error terms ``e_i(k) = 1[y_i = k] - p_i(k)`` ``[R, P, K]`` of one sentence of R documents.

        Args:
            entity_logits: ``[R, P, K]`` the final entity logits there (shift included; ``-inf``
                where an identifier cannot come next).
            word_log_norm: ``[R, P]`` log-sum-exp of the word logits there.
            target_entities: ``[R, P]`` long chain 1..K of each target, 0 for words and padding.
            mask: ``[R, P]`` bool, real positions (elsewhere the error is 0).
            row_in_logit: ``[R, P, K]`` bool, where identifier k's logit contains its row (None:
                everywhere); elsewhere only the observed term counts (see the module docstring).
        """
        log_norm = torch.logaddexp(word_log_norm, torch.logsumexp(entity_logits, dim=-1))  # [R, P]
        probs = torch.exp(entity_logits - log_norm.unsqueeze(-1))  # [R, P, K]  p_i(k)
        observed = F.one_hot(target_entities, entity_logits.size(-1) + 1)[..., 1:].to(probs.dtype)  # [R, P, K]
        if row_in_logit is not None:
            probs = probs * row_in_logit.to(probs.dtype)
        return (observed - probs) * mask.unsqueeze(-1).to(probs.dtype)  # [R, P, K]

    def change(self, hidden: torch.Tensor, error: torch.Tensor) -> torch.Tensor:
        """``w ⊙ sum_i e_i(k) h_i`` ``[R, K, H]``: the change of Δb after a sentence (``hidden [R, P, H]``)."""
        return torch.bmm(error.transpose(1, 2), hidden) * self.rate  # [R, K, H]

    def within_sentence_scores(self, hidden: torch.Tensor, error: torch.Tensor) -> torch.Tensor:
        """``sum_{i < t} e_i(k) (w ⊙ h_i) · h_t`` ``[R, P, K]``: what the sentence's own earlier
        positions add to the entity logits at t (``hidden [R, P, H]``, ``error [R, P, K]``)."""
        affinity = torch.bmm(hidden, (hidden * self.rate).transpose(1, 2)).tril(-1)  # [R, P(t), P(i)], i < t only
        return torch.bmm(affinity, error)  # [R, P, K]

    def step(self, hidden: torch.Tensor, entity_logits: torch.Tensor, word_log_norm: torch.Tensor,
             target_entities: torch.Tensor, mask: torch.Tensor,
             row_in_logit: torch.Tensor | None = None) -> torch.Tensor:
        """The change of Δb ``[R, K, H]`` after one sentence of R documents (``hidden [R, P, H]``
        the hidden states of its positions; the other arguments as in :meth:`errors`)."""
        return self.change(hidden, self.errors(entity_logits, word_log_norm, target_entities, mask, row_in_logit))
