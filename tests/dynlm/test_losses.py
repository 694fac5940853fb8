"""Tests of dynlm.losses."""

from __future__ import annotations

import math

import torch

from dynlm.losses import chunk_loss, lm_loss_sum, token_nll
from dynlm.models.outputs import LMOutput


def test_token_nll_values_and_padding():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = math.log(3.0)  # p(2) = 3/6
    targets = torch.tensor([[2, 1, 0]])
    mask = torch.tensor([[True, True, False]])
    nll = token_nll(logits, targets, mask)
    torch.testing.assert_close(nll, torch.tensor([[math.log(2.0), math.log(4.0), 0.0]]))
    total, count = lm_loss_sum(logits, targets, mask)
    assert count.item() == 2
    torch.testing.assert_close(total, torch.tensor(math.log(8.0)))


def test_token_nll_at_real_positions_equals_the_padded_form():
    """A model may score only the real positions (``LMOutput.positions``): the NLL per position,
    its sum and the count are those of the padded [B, L, V] scores."""
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    targets = torch.tensor([[1, 4, 0], [2, 0, 0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    positions = torch.tensor([0, 1, 2, 3])  # b * 3 + l of the real positions
    packed = logits.view(6, 5)[positions]
    torch.testing.assert_close(token_nll(packed, targets, mask, positions), token_nll(logits, targets, mask))
    (total, count), (dense_total, dense_count) = lm_loss_sum(packed, targets, mask, positions), lm_loss_sum(
        logits, targets, mask)
    torch.testing.assert_close(total, dense_total)
    assert count == dense_count == 4
    output = LMOutput(logits=packed, hidden=torch.zeros(2, 3, 1), positions=positions)
    assert torch.equal(output.padded_logits()[mask], logits[mask]) and output.padded_logits()[1, 1:].eq(0).all()


class _Sentence:
    def __init__(self, targets, mask):
        self.targets, self.mask = targets, mask


def test_chunk_loss_is_token_mean_plus_mean_aux():
    a = LMOutput(logits=torch.zeros(1, 2, 4), hidden=torch.zeros(1, 2, 1), aux_loss=torch.tensor(1.0))
    b = LMOutput(logits=torch.zeros(1, 1, 4), hidden=torch.zeros(1, 1, 1), aux_loss=torch.tensor(3.0))
    sentences = [_Sentence(torch.tensor([[1, 2]]), torch.tensor([[True, True]])),
                 _Sentence(torch.tensor([[1]]), torch.tensor([[True]]))]
    loss, nll_sum, count = chunk_loss([a, b], sentences)
    assert count.item() == 3
    torch.testing.assert_close(nll_sum, torch.tensor(3 * math.log(4.0)))
    torch.testing.assert_close(loss, torch.tensor(math.log(4.0) + 2.0))
