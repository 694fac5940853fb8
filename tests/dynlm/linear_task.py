"""A least-squares task with the members the training loop calls: the accumulation tests of
test_training.py use it in this process and in their DDP ranks (which import it by name)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dynlm.training import StepLoss


@dataclass
class PointBatch:
    """``x`` [B, 3] inputs, ``y`` [B] targets."""

    x: torch.Tensor
    y: torch.Tensor
    num_padded: int = 0

    @property
    def num_documents(self) -> int:
        return len(self.y)


class LinearTask:
    """What the loop calls of a task, for a least-squares model: one chunk per batch."""

    def chunks(self, batch, cfg):
        return (batch,)

    def initial_state(self, model, batch):
        return None

    def loss(self, model, chunk, state):
        error = (model(chunk.x).squeeze(-1) - chunk.y) ** 2  # [B]
        return StepLoss(error.mean(), error.sum().detach(), torch.tensor(len(chunk.y)))

    def detach_state(self, model, state):
        return state

    def lockstep_size(self, batch):
        return 1

    def pad_batch(self, batch, size, spec):
        return batch


def point_batches(seed: int, count: int, size: int = 4) -> list:
    g = torch.Generator().manual_seed(seed)
    return [PointBatch(torch.randn(size, 3, generator=g), torch.randn(size, generator=g)) for _ in range(count)]


def linear_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)
