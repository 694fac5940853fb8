"""Optimizer parameter groups and the learning-rate schedule (kept off the model)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from dynlm.train_config import TrainConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices get ``weight_decay``; biases and other 1-d parameters do not.

    Tied parameters appear once (``model.parameters()`` de-duplicates them).
    """
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: nn.Module, cfg: "TrainConfig") -> torch.optim.Optimizer:
    """Adam or SGD over :func:`param_groups` with ``cfg.lr`` / ``cfg.weight_decay``.

    A model that defines ``param_groups(base_lr)`` (e.g. the meta-learned LM, whose
    meta-learner has its own learning rate) chooses its groups; weight decay is then applied to
    every group. A DDP wrapper is looked through.
    """
    core = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    if hasattr(core, "param_groups"):
        groups = [{**group, "weight_decay": cfg.weight_decay} for group in core.param_groups(cfg.lr)]
    else:
        groups = param_groups(core, cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(groups, lr=cfg.lr)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")


class LRSchedule:
    """Linear warmup, then constant / cosine decay per optimizer step, times a plateau factor.

    ``step()`` after every optimizer step; ``step_validation(value)`` after every validation
    (only ``lr_schedule="plateau"`` reacts: the LR halves when ``value`` did not improve).

    Args:
        optimizer: the optimizer whose group LRs are scaled (their initial LRs are the base).
        schedule: ``"constant"``, ``"cosine"`` or ``"plateau"``.
        warmup_steps: steps of linear warmup from ``1/warmup_steps`` of the base LR.
        total_steps: length of the cosine decay (ignored otherwise).
        min_factor: the cosine floor as a fraction of the base LR.
        plateau_factor: multiplier applied on a plateau.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        schedule: str,
        *,
        warmup_steps: int = 0,
        total_steps: int = 1,
        min_factor: float = 0.0,
        plateau_factor: float = 0.5,
    ):
        if schedule not in ("constant", "cosine", "plateau"):
            raise ValueError(f"LRSchedule: unknown schedule {schedule!r}")
        self.optimizer = optimizer
        self.schedule = schedule
        self.warmup_steps = warmup_steps
        self.total_steps = max(1, total_steps)
        self.min_factor = min_factor
        self.plateau_factor = plateau_factor
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        self.step_num = 0
        self.plateau_scale = 1.0
        self.best = math.inf
        self._apply()

    def factor(self) -> float:
        """The current multiplier of the base LRs."""
        factor = self.plateau_scale
        if self.warmup_steps > 0 and self.step_num < self.warmup_steps:
            factor *= (self.step_num + 1) / self.warmup_steps
        if self.schedule == "cosine":
            progress = min(1.0, max(0, self.step_num - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
            factor *= self.min_factor + (1 - self.min_factor) * 0.5 * (1 + math.cos(math.pi * progress))
        return factor

    def _apply(self) -> None:
        factor = self.factor()
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * factor

    def step(self) -> None:
        self.step_num += 1
        self._apply()

    def step_validation(self, value: float) -> None:
        if self.schedule != "plateau":
            return
        if value < self.best:
            self.best = value
        else:
            self.plateau_scale *= self.plateau_factor
            self._apply()

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {"step_num": self.step_num, "plateau_scale": self.plateau_scale, "best": self.best}

    def load_state_dict(self, state: dict) -> None:
        self.step_num = state["step_num"]
        self.plateau_scale = state["plateau_scale"]
        self.best = state["best"]
        self._apply()
