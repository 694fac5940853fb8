"""Tests of dynlm.optim: parameter groups and the LR schedule."""

from __future__ import annotations

import math

import pytest
import torch

from dynlm.optim import LRSchedule, build_optimizer, param_groups
from dynlm.training import TrainConfig


def _optimizer(lr=1.0):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def test_param_groups_decay_only_matrices():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    groups = param_groups(model, 0.1)
    assert [len(g["params"]) for g in groups] == [2, 2]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert isinstance(build_optimizer(model, TrainConfig(bptt_tokens=0, optimizer="sgd")), torch.optim.SGD)


def test_warmup_then_cosine():
    opt = _optimizer()
    schedule = LRSchedule(opt, "cosine", warmup_steps=2, total_steps=6)
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(6):
        schedule.step()
        lrs.append(opt.param_groups[0]["lr"])
    expected = [0.5, 1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4)), 0.0]
    assert lrs == pytest.approx(expected)


def test_plateau_halves_on_no_improvement_only():
    opt = _optimizer()
    schedule = LRSchedule(opt, "plateau")
    schedule.step_validation(10.0)
    schedule.step()
    assert opt.param_groups[0]["lr"] == 1.0
    schedule.step_validation(11.0)
    assert opt.param_groups[0]["lr"] == 0.5
    schedule.step_validation(9.0)
    assert opt.param_groups[0]["lr"] == 0.5
    restored = LRSchedule(_optimizer(), "plateau")
    restored.load_state_dict(schedule.state_dict())
    assert restored.get_last_lr() == [0.5]


def test_constant_ignores_validation():
    opt = _optimizer(0.3)
    schedule = LRSchedule(opt, "constant")
    for _ in range(3):
        schedule.step()
        schedule.step_validation(1.0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.3)


def test_build_optimizer_uses_a_models_own_groups(tiny_spec):
    from dynlm.models import build_model
    from dynlm.models.config import ModelConfig
    from dynlm.optim import build_optimizer
    from dynlm.training import TrainConfig

    cfg = ModelConfig.from_dict({"type": "dynamical", "embed_dim": 8, "hidden_dim": 8, "dynamical": {"meta_lr": 0.05}})
    model = build_model(cfg, tiny_spec)
    optimizer = build_optimizer(model, TrainConfig.from_dict({"lr": 0.001}))
    lrs = sorted(group["lr"] for group in optimizer.param_groups)
    assert lrs == [0.001, 0.05]
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
