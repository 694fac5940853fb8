"""A learned "a new entity comes next" score, routed to the one identifier a new chain can take.

Anonymization numbers chains in order of first appearance, so after n chains the next new
chain is exactly ``<unk{n+1}>`` (:mod:`dynlm.modules.entity_mask`). Its static output vector
b^y_{n+1} has to say two things at once: "chain n+1 is mentioned for the first time here" and,
at other positions of other documents, "chain n+1 is mentioned again". This module gives the
first a score of its own, ``s_new = w · h + b`` from the hidden state, added to the logit of
``<unk{n+1}>`` only (and nowhere when all K identifiers are taken). The softmax stays a proper
distribution over the vocabulary: one logit per position moves, none is added.
"""

from __future__ import annotations

import torch
from torch import nn


class NewEntityScore(nn.Module):
    """``h [B, L, H]`` -> a score added to the logit of ``<unk{n+1}>`` at every position."""

    def __init__(self, hidden_dim: int):
        super().__init__()
        self.score = nn.Linear(hidden_dim, 1)  # w, b
        nn.init.zeros_(self.score.weight)  # starts as the model without it (s_new = 0)
        nn.init.zeros_(self.score.bias)

    def forward(self, logits: torch.Tensor, hidden: torch.Tensor, entities_seen: torch.Tensor,
                entity_offset: int) -> torch.Tensor:
        """``logits [B, L, V_out]`` with ``s_new`` added to column ``entity_offset + n``.

        Args:
            logits: ``[B, L, V_out]``; column ``entity_offset + k - 1`` scores ``<unk{k}>``.
            hidden: ``[B, L, H]`` the (dropped-out) hidden state the logits were computed from.
            entities_seen: ``[B, L]`` long n, chains seen up to and including each input position.
            entity_offset: the column of ``<unk1>``.
        """
        num_entities = logits.size(-1) - entity_offset
        if num_entities <= 0:
            return logits
        seen = entities_seen.to(logits.device)
        score = self.score(hidden).squeeze(-1) * (seen < num_entities).to(hidden.dtype)  # [B, L]; 0 when all K are taken
        index = (entity_offset + seen.clamp(max=num_entities - 1)).unsqueeze(-1)  # [B, L, 1]
        return logits.scatter_add(-1, index, score.unsqueeze(-1).to(logits.dtype))
