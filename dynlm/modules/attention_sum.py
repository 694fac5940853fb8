"""Attention-sum (Kadlec et al., 2016): a candidate's probability is the total attention on the
document positions where it occurs.

    P(c | d, q) = Σ_{i : d_i = c} s_i,   s = softmax over the document positions

Used by the gated-attention reader (:mod:`dynlm.models.ga_reader`) over the CBT candidate list,
or over every word type of the document when any document word can be the answer (CMRC-2017).
"""

from __future__ import annotations

import torch

TINY = 1e-30  # log(0) of a candidate that never occurs: finite, so its gradient stays defined


def attention_sum(attention: torch.Tensor, candidate_of_token: torch.Tensor, candidate_mask: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of the candidates.

    Args:
        attention: ``[B, L]`` probabilities over the document positions (0 at padding; rows sum to 1).
        candidate_of_token: ``[B, L]`` long index of the candidate at each position, -1 where none.
        candidate_mask: ``[B, C]`` bool, True for the real candidates of each row.

    Returns:
        ``[B, C]`` ``log P(c)``; ``-inf`` at padded candidates.
    """
    is_candidate = candidate_of_token >= 0
    index = torch.where(is_candidate, candidate_of_token, torch.zeros_like(candidate_of_token))  # [B, L]
    mass = attention.new_zeros(candidate_mask.shape).scatter_add(1, index, attention * is_candidate)  # [B, C]
    log_p = mass.clamp_min(TINY).log()
    return log_p.masked_fill(~candidate_mask, float("-inf"))
