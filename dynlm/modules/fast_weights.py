"""Per-document fast weights: layers whose weights in use are theta + theta_hat[b].

theta (the module's parameters) is shared by the batch; theta_hat holds one delta per document
``[B, *param.shape]``. The layers below apply ``theta + theta_hat`` in a batched way (one
``baddbmm`` / gather / ``bmm`` per call) instead of looping over documents, so a batch of B
documents costs about what B separate static models would cost in the fast layer and nothing
more elsewhere. With ``theta_hat == 0`` every function returns the static layer's output.

Memory: a fast output layer is ``B * V * H`` floats (e.g. 16 docs * 10k words * 128 = 80 MB).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F


def zero_fast_weights(params: dict[str, torch.Tensor], batch_size: int) -> dict[str, torch.Tensor]:
    """theta_hat = 0 for every named parameter.

    Args:
        params: name -> static parameter ``[*shape]``.
        batch_size: B documents.

    Returns:
        name -> zeros ``[B, *shape]`` (same dtype/device as the parameter, no grad history).
    """
    return {name: torch.zeros((batch_size,) + tuple(p.shape), dtype=p.dtype, device=p.device)
            for name, p in params.items()}


def fast_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                delta_weight: torch.Tensor, delta_bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ (W + dW[b])^T + (bias + db[b])`` for every document b.

    Args:
        x: [B, L, H] inputs.
        weight: [V, H] static weight; bias: [V] or None.
        delta_weight: [B, V, H]; delta_bias: [B, V] or None.

    Returns:
        [B, L, V].
    """
    effective = weight.unsqueeze(0) + delta_weight  # [B, V, H]
    if bias is None and delta_bias is None:
        return torch.bmm(x, effective.transpose(1, 2))
    total_bias = torch.zeros(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    if bias is not None:
        total_bias = total_bias + bias
    if delta_bias is not None:
        total_bias = total_bias + delta_bias
    return torch.baddbmm(total_bias.unsqueeze(1), x, effective.transpose(1, 2))  # [B, L, V]


def fast_embedding(tokens: torch.Tensor, weight: torch.Tensor, delta: torch.Tensor,
                   padding_idx: int | None = None) -> torch.Tensor:
    """Embedding lookup in ``E + dE[b]``.

    Args:
        tokens: [B, L] ids.
        weight: [V, E] static table; delta: [B, V, E].
        padding_idx: rows of this id stay the static row (no fast update reaches them).

    Returns:
        [B, L, E].
    """
    static = F.embedding(tokens, weight, padding_idx=padding_idx)  # [B, L, E]
    rows = torch.arange(tokens.shape[0], device=tokens.device).unsqueeze(1).expand_as(tokens)
    fast = delta[rows, tokens]  # [B, L, E]
    if padding_idx is not None:
        fast = fast * (tokens != padding_idx).unsqueeze(-1).to(fast.dtype)
    return static + fast


def fast_lstm_layer(x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor],
                    weight_ih: torch.Tensor, weight_hh: torch.Tensor,
                    bias_ih: torch.Tensor | None, bias_hh: torch.Tensor | None,
                    delta_hh: torch.Tensor, active: torch.Tensor | None = None,
                    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One LSTM layer (PyTorch gate order i, f, g, o) with a per-document fast recurrent matrix.

    Args:
        x: [B, L, I] inputs; state: (h [B, H], c [B, H]).
        weight_ih: [4H, I]; weight_hh: [4H, H]; bias_ih / bias_hh: [4H] or None.
        delta_hh: [B, 4H, H] fast part of the recurrent matrix.
        active: [B, L] bool or None; at inactive (padded) positions the state is kept and the
            output is zero (like ``RNNLM.run_rnn`` with lengths).

    Returns:
        (outputs [B, L, H], (h, c)).
    """
    h, c = state
    projected = F.linear(x, weight_ih, bias_ih)  # [B, L, 4H], input part for all steps at once
    recurrent = weight_hh.unsqueeze(0) + delta_hh  # [B, 4H, H]
    outputs = []
    for t in range(x.shape[1]):
        gates = projected[:, t] + torch.bmm(recurrent, h.unsqueeze(2)).squeeze(2)  # [B, 4H]
        if bias_hh is not None:
            gates = gates + bias_hh
        i, f, g, o = gates.chunk(4, dim=1)
        c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h_new = torch.sigmoid(o) * torch.tanh(c_new)
        if active is None:
            h, c = h_new, c_new
            outputs.append(h)
        else:
            on = active[:, t].unsqueeze(1)  # [B, 1]
            h, c = torch.where(on, h_new, h), torch.where(on, c_new, c)
            outputs.append(h_new * on.to(h_new.dtype))
    return torch.stack(outputs, dim=1), (h, c)


def fast_gru_layer(x: torch.Tensor, h: torch.Tensor, weight_ih: torch.Tensor, weight_hh: torch.Tensor,
                   bias_ih: torch.Tensor | None, bias_hh: torch.Tensor | None,
                   delta_hh: torch.Tensor, active: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One GRU layer (PyTorch gate order r, z, n) with a per-document fast recurrent matrix.

    Args:
        x: [B, L, I]; h: [B, H]; weight_ih: [3H, I]; weight_hh: [3H, H]; delta_hh: [B, 3H, H].
        active: [B, L] bool or None (see :func:`fast_lstm_layer`).

    Returns:
        (outputs [B, L, H], h [B, H]).
    """
    projected = F.linear(x, weight_ih, bias_ih)  # [B, L, 3H]
    recurrent = weight_hh.unsqueeze(0) + delta_hh  # [B, 3H, H]
    outputs = []
    for t in range(x.shape[1]):
        hidden_part = torch.bmm(recurrent, h.unsqueeze(2)).squeeze(2)  # [B, 3H]
        if bias_hh is not None:
            hidden_part = hidden_part + bias_hh
        x_r, x_z, x_n = projected[:, t].chunk(3, dim=1)
        h_r, h_z, h_n = hidden_part.chunk(3, dim=1)
        r = torch.sigmoid(x_r + h_r)
        z = torch.sigmoid(x_z + h_z)
        n = torch.tanh(x_n + r * h_n)
        h_new = (1 - z) * n + z * h
        if active is None:
            h = h_new
            outputs.append(h)
        else:
            on = active[:, t].unsqueeze(1)  # [B, 1]
            h = torch.where(on, h_new, h)
            outputs.append(h_new * on.to(h_new.dtype))
    return torch.stack(outputs, dim=1), h


# --- slicing sentence batches into segments -------------------------------------------------
# Per-position fields of a SentenceBatch ([B, L]) and per-document fields ([B]); the subword
# fields (unique_words, subword_ids, subword_lengths) are shared by the batch and never sliced.
POSITION_FIELDS = ("tokens", "targets", "mask", "entity_ids", "target_entity_ids", "target_kind",
                   "token_to_unique")
DOCUMENT_FIELDS = ("doc_active", "new_doc", "doc_end")


def slice_columns(batch, start: int, end: int):
    """The positions ``[start, end)`` of every document of a ``SentenceBatch`` (a new batch)."""
    changes = {name: getattr(batch, name)[:, start:end] for name in POSITION_FIELDS
               if getattr(batch, name, None) is not None}
    if _is_field(batch, "lengths") and batch.lengths is not None:  # [B] real positions of each row
        changes["lengths"] = (batch.lengths - start).clamp(min=0, max=end - start)
    return dataclasses.replace(batch, **changes)


def _is_field(batch, name: str) -> bool:
    return any(f.name == name for f in dataclasses.fields(batch))


def select_rows(batch, rows: torch.Tensor | list[int]):
    """The documents ``rows`` of a ``SentenceBatch`` (a new batch; subword tables are shared)."""
    index = torch.as_tensor(rows, dtype=torch.long, device=batch.tokens.device)
    names = POSITION_FIELDS + DOCUMENT_FIELDS + (("lengths",) if _is_field(batch, "lengths") else ())
    changes = {name: getattr(batch, name).index_select(0, index.to(getattr(batch, name).device))
               for name in names if getattr(batch, name, None) is not None}
    return dataclasses.replace(batch, **changes)
