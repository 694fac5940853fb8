"""Tests of dynlm.modules.nce against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from dynlm.models.naming import NCEScores
from dynlm.modules.nce import nce_loss


def test_nce_loss_matches_the_hand_computed_case():
    # k = 2, so log(k · q) = log 2 + log q.
    # Event 0: target s = 1.0, q = 0.25  -> Δ = 1 − log 0.5 = 1 + log 2, softplus(−Δ) = log(1 + e^{-1}/2) = 0.1688476
    #          noise  s = 0.0, q = 0.5   -> Δ = 0 − log 1 = 0,            softplus(Δ)  = log 2            = 0.6931472
    #          noise  s = 2.0, q = 0.25  -> Δ = 2 + log 2,                softplus(Δ)  = log(1 + 2 e^2)   = 2.7586237
    #          loss = 3.6206185
    # Event 1: every score 0 and q = 0.5 -> every Δ = 0: loss = 3 log 2 = 2.0794415
    scores = NCEScores(target_scores=torch.tensor([1.0, 0.0]),
                       noise_scores=torch.tensor([[0.0, 2.0], [0.0, 0.0]]),
                       target_log_noise=torch.tensor([0.25, 0.5]).log(),
                       noise_log_noise=torch.tensor([[0.5, 0.25], [0.5, 0.5]]).log())
    loss = nce_loss(scores)
    assert loss.shape == (2,)
    assert loss[0].item() == pytest.approx(3.6206185, abs=1e-6)
    assert loss[1].item() == pytest.approx(3 * math.log(2), abs=1e-6)


def test_nce_loss_falls_as_the_target_outscores_the_noise():
    def loss_at(target_score: float) -> float:
        return nce_loss(NCEScores(torch.tensor([target_score]), torch.zeros(1, 4), torch.tensor([-2.0]),
                                  torch.full((1, 4), -2.0))).item()

    assert loss_at(3.0) < loss_at(0.0) < loss_at(-3.0)


def test_nce_loss_needs_noise():
    empty = NCEScores(torch.zeros(3), torch.zeros(3, 0), torch.zeros(3), torch.zeros(3, 0))
    with pytest.raises(ValueError, match="at least one noise sample"):
        nce_loss(empty)
