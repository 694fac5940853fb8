"""Context encoder of the Dynamic Neural Text Model (Kobayashi et al., 2017, Sec. 3.1).

A bidirectional RNN reads the current sentence. For a mention spanning positions s..t its
context vector is built from the state just before and the state just after the mention::

    d'_e = ReLU(W_hd [h_fwd(s - 1); h_bwd(t + 1)] + b_d)

After anonymization every mention is a single token (s = t = p), so the encoder returns a
context vector for EVERY position p of the sentence; the caller picks the mention positions.
Outside the sentence the states are zero: h_fwd(-1) = 0 and h_bwd(n) = 0 (n = its length).

The encoder has its own parameters (it does not share the language model's RNN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from dynlm.config import Config, ConfigError


@dataclass
class ContextEncoderConfig(Config):
    """Sizes of the context encoder.

    Attributes:
        input_dim: size of the token vectors it reads (the LM's input embeddings).
        hidden_dim: size of each direction of the bidirectional RNN.
        output_dim: size of the context vectors d' (= the entity representation size).
        cell: recurrent cell of both directions.
    """

    input_dim: int
    hidden_dim: int
    output_dim: int
    cell: Literal["lstm", "gru"] = "lstm"

    def validate(self) -> None:
        for name in ("input_dim", "hidden_dim", "output_dim"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"context_encoder.{name} must be positive, got {getattr(self, name)}")


class ContextEncoder(nn.Module):
    """Bidirectional RNN + ``ReLU(W_hd [h_fwd(p-1); h_bwd(p+1)] + b_d)`` at every position."""

    def __init__(self, cfg: ContextEncoderConfig):
        super().__init__()
        self.cfg = cfg
        rnn_cls = nn.LSTM if cfg.cell == "lstm" else nn.GRU
        self.rnn = rnn_cls(cfg.input_dim, cfg.hidden_dim, batch_first=True, bidirectional=True)
        self.proj = nn.Linear(2 * cfg.hidden_dim, cfg.output_dim)  # W_hd, b_d

    def forward(self, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Context vectors of every position.

        Args:
            inputs: [B, L, input_dim] token vectors; each row is a left-aligned sentence.
            mask: [B, L] bool, True on the real tokens (a prefix of each row; rows may be empty).

        Returns:
            [B, L, output_dim] context vectors d'; rows/positions where ``mask`` is False are 0.
        """
        if inputs.dim() != 3 or inputs.shape[-1] != self.cfg.input_dim:
            raise ValueError(
                f"ContextEncoder: inputs must be [B, L, {self.cfg.input_dim}], got {tuple(inputs.shape)}"
            )
        if mask.shape != inputs.shape[:2]:
            raise ValueError(f"ContextEncoder: mask {tuple(mask.shape)} does not match inputs {tuple(inputs.shape[:2])}")
        batch_size, length, _ = inputs.shape
        lengths = mask.sum(dim=1)  # [B]
        # Packing runs each direction over exactly the real tokens of each row, so the backward
        # direction starts at the last real token (not at padding). Empty rows get length 1 and
        # are masked out below.
        packed = pack_padded_sequence(
            inputs, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False
        )
        states, _ = self.rnn(packed)
        states, _ = pad_packed_sequence(states, batch_first=True, total_length=length)  # [B, L, 2H]
        hidden = self.cfg.hidden_dim
        states = states * mask.unsqueeze(-1).to(states.dtype)  # zero beyond each sentence
        forward_states, backward_states = states[..., :hidden], states[..., hidden:]  # [B, L, H] each
        zeros = forward_states.new_zeros(batch_size, 1, hidden)
        before = torch.cat([zeros, forward_states[:, :-1]], dim=1)  # h_fwd(p - 1), [B, L, H]
        after = torch.cat([backward_states[:, 1:], zeros], dim=1)  # h_bwd(p + 1), [B, L, H]
        context = F.relu(self.proj(torch.cat([before, after], dim=-1)))  # [B, L, output_dim]
        return context * mask.unsqueeze(-1).to(context.dtype)
