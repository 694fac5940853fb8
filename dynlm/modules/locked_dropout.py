"""Locked (variational) dropout: one dropout mask per sequence, shared across time steps.

Gal & Ghahramani (2016); the awd-lstm-lm ``LockedDropout``. Dropping the same units at every
position regularises recurrent models better than a fresh mask per token.
"""

from __future__ import annotations

import torch
from torch import nn


class LockedDropout(nn.Module):
    """Dropout with a mask of shape ``[B, 1, D]`` broadcast over the length dimension.

    Args:
        p: drop probability in ``[0, 1)``.
    """

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"LockedDropout: p must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Args: x ``[B, L, D]``. Returns: ``[B, L, D]`` (unchanged in eval mode or p == 0)."""
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty(x.size(0), 1, x.size(2)).bernoulli_(keep) / keep  # [B, 1, D]
        return x * mask

    def extra_repr(self) -> str:
        return f"p={self.p}"
