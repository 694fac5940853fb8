"""A learned "a new entity comes next" score, routed to the one identifier a new chain can take.

Anonymization numbers chains in order of first appearance, so after n chains the next new
chain is exactly ``<unk{n+1}>`` (:mod:`dynlm.modules.entity_mask`). Its static output vector
b^y_{n+1} has to say two things at once: "chain n+1 is mentioned for the first time here" and,
at other positions of other documents, "chain n+1 is mentioned again". This module gives the
first a score of its own, ``s_new = w · h + b`` from the hidden state, added to the logit of
``<unk{n+1}>`` only (and nowhere when all K identifiers are taken). The softmax stays a proper
distribution over the vocabulary: one logit per position moves, none is added.

With ``replace_static`` the logit of ``<unk{n+1}>`` is ``s_new + c_n`` alone, with a learned bias
c_n per number n of chains seen (how likely one more chain is after n; without ``replace_static``,
``b^y_{n+1} . h`` can carry that). The static vector b^y_k of an identifier then only ever scores
re-mentions of chain k (once chain k has appeared), and a first mention's gradient reaches
``s_new`` and c_n only, not the vector that must score the chain's later mentions.
"""

from __future__ import annotations

import torch
from torch import nn


class NewEntityScore(nn.Module):
    """``h [B, L, H]`` -> a score added to (``replace_static``: put in place of) the logit of
    ``<unk{n+1}>`` at every position.

    Args:
        hidden_dim: H.
        replace_static: the logit of ``<unk{n+1}>`` is ``s_new + c_n`` (see the module docstring).
        num_entities: K, the entity identifiers (the size of c; with ``replace_static`` only).
    """

    def __init__(self, hidden_dim: int, replace_static: bool = False, num_entities: int = 0):
        super().__init__()
        self.replace_static = replace_static
        self.score = nn.Linear(hidden_dim, 1)  # w, b
        nn.init.zeros_(self.score.weight)  # starts as the model without it (s_new = 0)
        nn.init.zeros_(self.score.bias)  # (with replace_static: the new chain's logit starts at 0)
        if replace_static:
            # c_n: how likely a new chain is after n chains (what b^y_{n+1} . h carried without replace_static)
            self.count_bias = nn.Parameter(torch.zeros(num_entities))

    def forward(self, logits: torch.Tensor, hidden: torch.Tensor, entities_seen: torch.Tensor,
                entity_offset: int) -> torch.Tensor:
        """``logits [B, L, V_out]`` with ``s_new`` added to (``replace_static``: ``s_new + c_n`` put in)
        column ``entity_offset + n``; the column of ``<unk{K}>`` stays where all K are taken.

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
        has_new = seen < num_entities  # [B, L]; False when all K are taken
        next_new = seen.clamp(max=num_entities - 1)  # [B, L] 0-based identifier of the next new chain
        index = (entity_offset + next_new).unsqueeze(-1)  # [B, L, 1]
        score = self.score(hidden).squeeze(-1).to(logits.dtype)  # [B, L]
        if self.replace_static:
            score = score + self.count_bias[next_new].to(logits.dtype)
            kept = logits.gather(-1, index).squeeze(-1)  # [B, L]
            return logits.scatter(-1, index, torch.where(has_new, score, kept).unsqueeze(-1))
        return logits.scatter_add(-1, index, (score * has_new.to(score.dtype)).unsqueeze(-1))
