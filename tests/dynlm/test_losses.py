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
