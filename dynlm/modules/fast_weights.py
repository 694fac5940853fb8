"""Per-document fast weights: layers whose weights in use are theta + theta_hat[b].

theta (a module's own parameters) is shared by the batch; theta_hat holds one delta per
document ``[B, *param.shape]``. The output layer and the word embedding apply the *unchanged*
static module with per-document weights::

    torch.func.vmap(                                        # over the B documents
        lambda delta_b, static, x_b: torch.func.functional_call(
            module, {name: static[name] + delta_b[name]}, (x_b,)),
        in_dims=(0, None, 0))(delta, static, x)

so the module's own forward (``F.linear``, ``F.embedding``) defines the layer; its parameters
are never replaced or deleted (``functional_call`` swaps them only for the call), and autograd
(including ``create_graph=True`` for second-order meta-gradients) flows through vmap to both the
static parameter and the delta. vmap turns the per-document ``F.linear`` into one batched
matmul: measured in ``DynamicalLM`` (fast output layer, E=H=128, 10k words, 8 documents, 1
thread) eval speed and train step time were those of the former hand-written ``baddbmm``
within noise (~5%). The embedding keeps pad positions static by hand (a torch vmap bug, see
:func:`fast_embedding`). With ``theta_hat == 0`` the layers return the static module's output.

The recurrent matrices (``weight_hh`` of ``nn.LSTM`` / ``nn.GRU``) are the exception: they use
the explicit batched cells :func:`fast_lstm_layer` / :func:`fast_gru_layer` (one ``bmm`` per
position), because in torch 2.13 (checked when this was written):

* ``vmap`` over ``functional_call(nn.LSTM / nn.GRU, ...)`` fails: "Batching rule not
  implemented for aten::lstm.input / aten::gru.input. We could not generate a fallback."
* ``vmap`` over ``functional_call(nn.LSTMCell, ...)`` per position fails the same way
  (``aten::lstm_cell``), so the default LSTM backbone cannot use it at all;
* ``vmap`` over ``nn.GRUCell`` runs, but through the slow per-example fallback (a warning says
  so): forward+backward of 32 positions, B=8, H=128, 1 thread took 149 ms vs. 28 ms for the
  batched cell (5x slower).

Memory: a fast layer materializes ``static + delta`` per document, ``B * V * H`` floats
(e.g. 16 docs * 10k words * 128 = 80 MB for the output layer; the same for a fast embedding,
where a gather of the used rows would be cheaper: in the layer alone ~7x, in the whole model
~5% slower eval, as the meta-learner update over the same ``B * V * E`` numbers dominates).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap


def zero_fast_weights(params: dict[str, torch.Tensor], batch_size: int) -> dict[str, torch.Tensor]:
    """theta_hat = 0 for every named parameter.

    Args:
        params: name -> static parameter ``[*shape]``.
        batch_size: B documents.

    Returns:
        name -> zeros ``[B, *shape]`` (same dtype/device as the parameter, no grad history): one
        ``[*shape]`` zero tensor expanded over the documents (no ``[B, *shape]`` memory is written
        until an update makes the first real theta_hat; read-only, like any expanded tensor).
    """
    return {name: torch.zeros(tuple(p.shape), dtype=p.dtype, device=p.device).expand((batch_size,) + tuple(p.shape))
            for name, p in params.items()}


def per_document_call(module: nn.Module, deltas: dict[str, torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
    """``module(inputs[b])`` with weights ``param + deltas[name][b]``, for every document b.

    ``torch.func.functional_call`` runs the module's own forward with the given weights
    (parameters not named in ``deltas`` stay the module's); ``torch.func.vmap`` maps it over the
    documents: dim 0 of the deltas and the inputs, the static parameters shared (``in_dims=None``).
    Equivalent to ``torch.stack([functional_call(module, {n: p + d[b]}, x[b]) for b in ...])``.

    Args:
        module: the static layer (its parameters are theta; it is not modified).
        deltas: parameter name (as in ``module.named_parameters()``) -> ``[B, *param.shape]``.
        inputs: ``[B, ...]`` tensors, one document per row.

    Returns:
        ``[B, ...]`` the module's output per document.
    """
    params = dict(module.named_parameters())
    static = {name: params[name] for name in deltas}  # name -> [*shape]

    def one_document(delta_b, static_params, *inputs_b):
        weights = {name: static_params[name] + delta_b[name] for name in delta_b}  # theta + theta_hat[b]
        return functional_call(module, weights, inputs_b)

    in_dims = (0, None) + (0,) * len(inputs)
    return vmap(one_document, in_dims=in_dims)(deltas, static, *inputs)


def fast_linear(linear: nn.Linear, x: torch.Tensor, delta_weight: torch.Tensor,
                delta_bias: torch.Tensor | None) -> torch.Tensor:
    """``x[b] @ (W + dW[b])^T + (bias + db[b])`` for every document b, through ``linear``.

    Computed as ``linear(x) + x[b] @ dW[b]^T + db[b]``: a linear map is linear in its weights, so
    the static and the fast part are two products (one ``baddbmm`` adds the fast product to the
    static output) and the ``[B, V, H]`` tensor ``W + dW`` is never built: the form for ``dW`` that
    changes at every call (training). Where ``W + dW`` is kept across calls,
    :func:`per_document_linear` makes one product.

    Args:
        linear: the static ``nn.Linear`` (weight ``[V, H]``, bias ``[V]`` or None).
        x: [B, L, H] inputs.
        delta_weight: [B, V, H]; delta_bias: [B, V] or None (no fast bias).

    Returns:
        [B, L, V].
    """
    out = linear(x)  # [B, L, V]
    if delta_bias is not None:
        if linear.bias is None:
            raise ValueError("fast_linear: delta_bias given but the linear layer has no bias")
        out = out + delta_bias.unsqueeze(1)
    return torch.baddbmm(out, x, delta_weight.transpose(1, 2))  # [B, L, V]


def per_document_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x[b] @ weight[b]^T + bias[b]`` for every document b: one ``baddbmm``.

    For weights that are already ``W + dW`` per document (``[B, V, H]``): one product where
    :func:`fast_linear` makes two. The dynamical LM keeps that sum at evaluation, where it changes
    only once per segment.

    Args:
        x: [B, L, H] inputs.
        weight: [B, V, H]; bias: [B, V] or None.

    Returns:
        [B, L, V].
    """
    if bias is None:
        return torch.bmm(x, weight.transpose(1, 2))
    return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))  # [B, L, V]


def fast_embedding(embedding: nn.Embedding, tokens: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Embedding lookup in ``E + dE[b]`` for every document b, through ``embedding``.

    The row ``embedding.padding_idx`` gets no fast part and no gradient (as in ``nn.Embedding``):
    pad positions read the static pad row, whatever the delta's pad row holds. This is done on
    the output (``torch.where`` over ``[B, L, E]``), not by masking the delta (a full
    ``[B, V, E]`` pass that doubled this layer's cost), and it is needed for the gradients too:
    in torch 2.13 the vmap rule of the embedding backward honours ``padding_idx`` only for
    document 0, so without it the pad rows of ``dE[b > 0]`` and of ``E`` would get gradient.
    Pad positions are those whose id equals ``padding_idx`` (a subclass may map other ids first,
    e.g. off-short-list ids to ``<unk>``; none may map to the pad id).

    Args:
        embedding: the static ``nn.Embedding`` (or a subclass whose forward maps the ids first).
        tokens: [B, L] ids.
        delta: [B, V, E].

    Returns:
        [B, L, E].
    """
    out = per_document_call(embedding, {"weight": delta}, tokens)  # [B, L, E]
    if embedding.padding_idx is None:
        return out
    pad = (tokens == embedding.padding_idx).unsqueeze(-1)  # [B, L, 1]
    static_pad_row = embedding.weight[embedding.padding_idx].detach()  # [E], no gradient (padding_idx)
    return torch.where(pad, static_pad_row.to(out.dtype), out)


def fast_lstm_layer(x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor],
                    weight_ih: torch.Tensor, weight_hh: torch.Tensor,
                    bias_ih: torch.Tensor | None, bias_hh: torch.Tensor | None,
                    delta_hh: torch.Tensor, active: torch.Tensor | None = None,
                    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One LSTM layer (PyTorch gate order i, f, g, o) with a per-document fast recurrent matrix.

    An explicit batched cell, not ``vmap(functional_call(nn.LSTM))``: torch has no batching rule
    for the fused LSTM ops (see the module docstring).

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

    An explicit batched cell: ``vmap`` over ``nn.GRU`` fails and over ``nn.GRUCell`` it takes a
    ~5x slower per-example fallback (see the module docstring).

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
                   "entities_seen", "token_to_unique", "sentence_id", "doc_start")
DOCUMENT_FIELDS = ("doc_active", "new_doc", "doc_end")


def slice_columns(batch, start: int, end: int):
    """The positions ``[start, end)`` of every document of a ``SentenceBatch`` (a new batch)."""
    changes = {name: getattr(batch, name)[:, start:end] for name in POSITION_FIELDS
               if getattr(batch, name, None) is not None}
    if _is_field(batch, "lengths") and batch.lengths is not None:  # [B] real positions of each row
        changes["lengths"] = (batch.lengths - start).clamp(min=0, max=end - start)
    if _is_field(batch, "reset_columns"):  # [R] CPU columns where a document starts
        columns = batch.reset_columns
        changes["reset_columns"] = columns[(columns >= start) & (columns < end)] - start
    if _is_field(batch, "step_sentence_lengths"):  # [B, S] CPU: each sentence's extent in the slice
        lengths = batch.step_sentence_lengths
        first = lengths.cumsum(dim=1) - lengths  # column of each sentence's first position
        last = torch.minimum(first + lengths, batch.lengths.view(-1, 1).clamp(max=end))  # one past its last kept
        kept = last > first.clamp(min=start)
        # a kept sentence's extent is counted from its first position, also when that is before ``start``
        changes["step_sentence_lengths"] = torch.where(kept, last - first, torch.zeros_like(lengths))
    return dataclasses.replace(batch, **changes)


def _is_field(batch, name: str) -> bool:
    return any(f.name == name for f in dataclasses.fields(batch))


def select_rows(batch, rows: torch.Tensor | list[int]):
    """The documents ``rows`` of a ``SentenceBatch`` (a new batch; subword tables are shared)."""
    index = torch.as_tensor(rows, dtype=torch.long, device=batch.tokens.device)
    per_row = ("lengths", "step_sentence_lengths", "step_mention_repeats")
    names = POSITION_FIELDS + DOCUMENT_FIELDS + tuple(name for name in per_row if _is_field(batch, name))
    changes = {name: getattr(batch, name).index_select(0, index.to(getattr(batch, name).device))
               for name in names if getattr(batch, name, None) is not None}
    return dataclasses.replace(batch, **changes)
