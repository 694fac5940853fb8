"""Tests of dynlm.modules.locked_dropout."""

from __future__ import annotations

import pytest
import torch

from dynlm.modules.locked_dropout import LockedDropout


def test_same_mask_at_every_position_and_scaled():
    dropout = LockedDropout(0.5).train()
    x = torch.ones(3, 7, 16)
    y = dropout(x)
    assert torch.equal(y, y[:, :1].expand_as(y))  # mask shared over the length dimension
    assert set(y.unique().tolist()) <= {0.0, 2.0}
    assert 0 < (y == 0).float().mean() < 1


def test_identity_in_eval_and_for_zero():
    x = torch.randn(2, 3, 4)
    assert torch.equal(LockedDropout(0.5).eval()(x), x)
    assert torch.equal(LockedDropout(0.0).train()(x), x)


def test_rejects_bad_probability():
    with pytest.raises(ValueError, match="p must be"):
        LockedDropout(1.0)
