"""A learned per-position gate on the dynamic entity scores: ``g(h) · (h · W_dy d_e)``.

The DNTM's output dynamics add ``h · W_dy d_e`` to the logit of every seen chain e. Where no
seen entity is likely (before a first mention, in a description with no character in it) those
scores still pull probability towards the entities already seen. ``g = sigmoid(w · h + b)``
lets the model scale all of them down at such positions (one scalar per position, shared by
the chains). It starts at ``b = 4`` (g ≈ 0.98): the model starts as the ungated one.
"""

from __future__ import annotations

import torch
from torch import nn

INITIAL_BIAS = 4.0


class ScoreGate(nn.Module):
    """``(h [B, L, H], scores [B, L, K]) -> g(h) * scores``."""

    def __init__(self, hidden_dim: int):
        super().__init__()
        self.gate = nn.Linear(hidden_dim, 1)
        nn.init.zeros_(self.gate.weight)
        nn.init.constant_(self.gate.bias, INITIAL_BIAS)

    def forward(self, hidden: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.gate(hidden)) * scores  # [B, L, 1] * [B, L, K]
