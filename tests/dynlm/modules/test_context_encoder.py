"""Tests of the DNTM context encoder: ReLU(W_hd [h_fwd(p-1); h_bwd(p+1)] + b_d)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dynlm.config import ConfigError
from dynlm.modules.context_encoder import ContextEncoder, ContextEncoderConfig


def _encoder(cell="lstm") -> ContextEncoder:
    torch.manual_seed(0)
    return ContextEncoder(ContextEncoderConfig(input_dim=4, hidden_dim=3, output_dim=5, cell=cell))


def _reference(encoder: ContextEncoder, sentence: torch.Tensor) -> torch.Tensor:
    """Step-by-step reference for ONE unpadded sentence [n, input_dim], written out by hand."""
    rnn, hidden = encoder.rnn, encoder.cfg.hidden_dim
    cell_fwd = torch.nn.LSTMCell(rnn.input_size, hidden)
    cell_bwd = torch.nn.LSTMCell(rnn.input_size, hidden)
    for cell, suffix in ((cell_fwd, ""), (cell_bwd, "_reverse")):
        cell.weight_ih.data = getattr(rnn, f"weight_ih_l0{suffix}").data
        cell.weight_hh.data = getattr(rnn, f"weight_hh_l0{suffix}").data
        cell.bias_ih.data = getattr(rnn, f"bias_ih_l0{suffix}").data
        cell.bias_hh.data = getattr(rnn, f"bias_hh_l0{suffix}").data
    n = sentence.shape[0]
    fwd, bwd = [None] * n, [None] * n
    h = c = torch.zeros(1, hidden)
    for p in range(n):
        h, c = cell_fwd(sentence[p : p + 1], (h, c))
        fwd[p] = h[0]
    h = c = torch.zeros(1, hidden)
    for p in reversed(range(n)):
        h, c = cell_bwd(sentence[p : p + 1], (h, c))
        bwd[p] = h[0]
    zero = torch.zeros(hidden)
    rows = []
    for p in range(n):
        before = fwd[p - 1] if p > 0 else zero
        after = bwd[p + 1] if p + 1 < n else zero
        rows.append(F.relu(encoder.proj(torch.cat([before, after]))))
    return torch.stack(rows)


def test_shapes_masking_and_reference_values():
    encoder = _encoder()
    inputs = torch.randn(3, 6, 4)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [0] * 6], dtype=torch.bool)
    out = encoder(inputs, mask)
    assert out.shape == (3, 6, 5)
    assert torch.all(out[1, 4:] == 0) and torch.all(out[2] == 0)
    for row, n in ((0, 6), (1, 4)):
        torch.testing.assert_close(out[row, :n], _reference(encoder, inputs[row, :n]), rtol=1e-5, atol=1e-6)


def test_seeded_expected_values():
    torch.manual_seed(3)
    encoder = ContextEncoder(ContextEncoderConfig(input_dim=4, hidden_dim=3, output_dim=5))
    torch.manual_seed(1)
    inputs = torch.randn(1, 3, 4)
    out = encoder(inputs, torch.ones(1, 3, dtype=torch.bool))
    expected = torch.tensor(
        [[0.0, 0.246559, 0.0, 0.0, 0.451127],
         [0.0, 0.199406, 0.0, 0.04139, 0.483088],
         [0.101382, 0.307257, 0.0, 0.0, 0.390213]]
    )
    torch.testing.assert_close(out[0], expected, rtol=1e-4, atol=1e-5)


def test_context_excludes_the_mention_itself_and_padding_is_ignored():
    encoder = _encoder()
    inputs = torch.randn(1, 5, 4)
    mask = torch.ones(1, 5, dtype=torch.bool)
    base = encoder(inputs, mask)
    changed = inputs.clone()
    changed[0, 2] = 10.0  # the token at p = 2 (the mention) does not enter its own context
    out = encoder(changed, mask)
    torch.testing.assert_close(out[0, 2], base[0, 2])
    assert not torch.allclose(out[0, 1], base[0, 1]) and not torch.allclose(out[0, 3], base[0, 3])
    # The same sentence padded with garbage in a larger batch gives the same vectors.
    padded = torch.cat([inputs, torch.full((1, 3, 4), 7.0)], dim=1)
    batch = torch.cat([padded, torch.randn(1, 8, 4)])
    batch_mask = torch.tensor([[1] * 5 + [0] * 3, [1] * 8], dtype=torch.bool)
    torch.testing.assert_close(encoder(batch, batch_mask)[0, :5], base[0], rtol=1e-5, atol=1e-6)


def test_gru_cell_and_gradients():
    encoder = _encoder("gru")
    encoder.proj.bias.data.fill_(1.0)  # keep the ReLU active so every weight gets a gradient
    inputs = torch.randn(2, 4, 4, requires_grad=True)
    out = encoder(inputs, torch.ones(2, 4, dtype=torch.bool))
    out.sum().backward()
    assert encoder.proj.weight.grad.abs().sum() > 0
    assert encoder.rnn.weight_ih_l0_reverse.grad.abs().sum() > 0
    assert inputs.grad.abs().sum() > 0


def test_bad_input_is_rejected():
    encoder = _encoder()
    with pytest.raises(ValueError, match="inputs must be"):
        encoder(torch.randn(2, 3, 7), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        encoder(torch.randn(2, 3, 4), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ConfigError, match="hidden_dim"):
        ContextEncoderConfig.from_dict({"input_dim": 4, "hidden_dim": 0, "output_dim": 5})

