"""Context encoder of the Dynamic Neural Text Model (Kobayashi et al., 2017, Sec. 3.1).

A bidirectional RNN reads the current sentence. For a mention spanning positions s..t its
context vector is built from the state just before and the state just after the mention::

    d'_e = ReLU(W_hd [h_fwd(s - 1); h_bwd(t + 1)] + b_d)

After anonymization every mention is a single token (s = t = p), so the encoder returns a
context vector for EVERY position p of the sentence; the caller picks the mention positions.
Outside the sentence the states are zero: h_fwd(-1) = 0 and h_bwd(n) = 0 (n = its length).

The encoder has its own parameters (it does not share the language model's RNN).

Each direction runs as one fused recurrent call over the padded rows: the forward direction
reads the left-aligned sentences as they are (padding comes after the real tokens), the
backward direction reads every row's real tokens reversed (a gather, padding left in place), so
both start at the right token without packing. A packed call would run PyTorch's per-step
kernel on the CPU, whose backward zero-fills a full-size gradient for every time step (it made
the DNTM's encoder cost several times its LM), and needs the lengths on the host.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

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
        hidden = self.cfg.hidden_dim
        lengths = mask.sum(dim=1, keepdim=True)  # [B, 1]
        positions = torch.arange(length, device=inputs.device).unsqueeze(0)  # [1, L]
        # position p <-> lengths - 1 - p inside each sentence, padding in place (an involution)
        reverse = torch.where(positions < lengths, lengths - 1 - positions, positions)  # [B, L]
        forward_states = self._direction(inputs, "")  # [B, L, H]
        reversed_inputs = inputs.gather(1, reverse.unsqueeze(-1).expand_as(inputs))
        backward_states = self._direction(reversed_inputs, "_reverse")  # [B, L, H], in reversed order
        backward_states = backward_states.gather(1, reverse.unsqueeze(-1).expand(-1, -1, hidden))
        states = torch.cat([forward_states, backward_states], dim=-1)  # [B, L, 2H]
        states = states * mask.unsqueeze(-1).to(states.dtype)  # zero beyond each sentence
        forward_states, backward_states = states[..., :hidden], states[..., hidden:]  # [B, L, H] each
        zeros = forward_states.new_zeros(batch_size, 1, hidden)
        before = torch.cat([zeros, forward_states[:, :-1]], dim=1)  # h_fwd(p - 1), [B, L, H]
        after = torch.cat([backward_states[:, 1:], zeros], dim=1)  # h_bwd(p + 1), [B, L, H]
        context = F.relu(self.proj(torch.cat([before, after], dim=-1)))  # [B, L, output_dim]
        return context * mask.unsqueeze(-1).to(context.dtype)

    def _direction(self, inputs: torch.Tensor, suffix: str) -> torch.Tensor:
        """One direction of ``self.rnn`` (its weights ``*_l0{suffix}``) over ``inputs [B, L, E]``
        read left to right from a zero state, as one fused call: ``[B, L, H]``."""
        rnn = self.rnn
        params = [getattr(rnn, f"{name}_l0{suffix}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        zeros = inputs.new_zeros(1, inputs.size(0), self.cfg.hidden_dim)
        with warnings.catch_warnings():  # cuDNN: the direction's weights are not one flat buffer (copied)
            warnings.filterwarnings("ignore", message=".*not part of single contiguous chunk of memory.*")
            if self.cfg.cell == "lstm":
                out, _, _ = torch.ops.aten.lstm.input(inputs, [zeros, zeros], params, True, 1, 0.0, self.training,
                                                      False, True)
            else:
                out, _ = torch.ops.aten.gru.input(inputs, zeros, params, True, 1, 0.0, self.training, False, True)
        return out
