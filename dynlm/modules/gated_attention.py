"""Gated attention (Dhingra et al., 2017): each document token is gated, element-wise, by the
query summary it attends to.

    α_i = softmax_j(q_j · d_i)   (over the real query positions),   q̃_i = Σ_j α_ij q_j,   x_i = d_i ⊙ q̃_i
"""

from __future__ import annotations

import torch


def gated_attention(document: torch.Tensor, query: torch.Tensor, query_mask: torch.Tensor) -> torch.Tensor:
    """One gated-attention layer (no parameters: the BiGRUs around it have them).

    Args:
        document: ``[B, Ld, H]`` token states of the document.
        query: ``[B, Lq, H]`` token states of the query.
        query_mask: ``[B, Lq]`` bool, True at real query positions (at least one per row).

    Returns:
        ``[B, Ld, H]`` the gated document states ``d_i ⊙ q̃_i``.
    """
    scores = torch.bmm(document, query.transpose(1, 2))  # [B, Ld, Lq]
    scores = scores.masked_fill(~query_mask[:, None, :], float("-inf"))
    alpha = torch.softmax(scores, dim=-1)  # [B, Ld, Lq]
    return document * torch.bmm(alpha, query)  # [B, Ld, H]
