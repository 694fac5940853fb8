"""THE runner: what one rank of a job trains with, built the same way everywhere.

A Ray Train worker (``pipelines/train.py: train_fn_per_worker``), ``dynlm train --local`` and
every benchmark build their model, optimizer, schedule and batch streams here, from a job
(:class:`dynlm.job.JobConfig`), the prepared data's spec, a rank and a world size; then they call
:func:`dynlm.training.fit` (:meth:`RankRun.fit`). What differs between them is only where the
rows come from (a Ray Data shard, or the prepared folder read in this process) and what happens
after each epoch (report and checkpoint, print, measure).

Seeds: the model is built right after ``set_seed(train.seed)`` (the same initial weights on every
rank; DDP also broadcasts rank 0's); the k-th train epoch of rank r is shuffled with seed
``train.seed * 7919 + k * 31 + r`` (:func:`train_shuffle_seed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from dynlm.data.batching import PACKED_GROUP_BATCHES, per_worker_batch_size
from dynlm.job import JobConfig
from dynlm.optim import LRSchedule, build_optimizer
from dynlm.training import FitHooks, FitState, fit, optimizer_steps, set_seed

# rows buffered for length sorting (or packed into one batch: ChunkLayout.pack_documents) = this x per-worker batch size
SORT_BUFFER_BATCHES = PACKED_GROUP_BATCHES


def train_shuffle_seed(train_seed: int, epoch: int, rank: int) -> int:
    """The shuffling seed of ``rank``'s train rows in ``epoch`` (numbered from 1)."""
    return train_seed * 7919 + epoch * 31 + rank


def total_steps(job: JobConfig, prepared) -> int:
    """Optimizer steps of the whole run on every rank (the cosine schedule's length), read from
    the prepared split's metadata: the task's steps per epoch for ``run.num_workers`` ranks,
    divided by ``train.accumulate_steps``. 1 for the other schedules (they do not need it)."""
    if job.train.lr_schedule != "cosine":
        return 1
    if prepared.num_documents("train") == 0:
        raise ValueError(f"{prepared.root}: the train split holds no documents")
    task = job.get_task()
    per_epoch = task.steps_per_epoch(prepared, job.train, job.run.num_workers,
                                     layout=task.batch_layout(job.train, job.model))
    return optimizer_steps(per_epoch, job.train.accumulate_steps) * job.train.epochs


@dataclass
class RankRun:
    """One rank's training: the task, its model (on ``device``, not DDP-wrapped), optimizer,
    schedule and batch streams. Build it with :func:`build_rank_run` (or :func:`local_run`).

    Attributes:
        train_batches: ``epoch -> this rank's batches`` (reshuffled with the epoch).
        valid_batches: ``() -> this rank's validation batches``: the rows ``index % world_size
            == rank`` of the whole validation split, in the task's evaluation layout.
    """

    job: JobConfig
    task: Any
    spec: Any
    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    train_batches: Callable[[int], Iterable[Any]]
    valid_batches: Callable[[], Iterable[Any]]
    rank: int = 0
    world_size: int = 1

    def fit(self, *, wrapped: nn.Module | None = None, state: FitState | None = None, hooks: FitHooks | None = None,
            on_epoch: Callable[[int, dict], bool | None] | None = None) -> dict:
        """:func:`dynlm.training.fit` of this run (``wrapped``: the DDP wrapper of ``model`` on a
        multi-rank run; ``state``: where a resumed run stands)."""
        hooks = hooks if hooks is not None else FitHooks(rank=self.rank, spec=self.spec)
        return fit(self.model if wrapped is None else wrapped, self.train_batches, self.valid_batches, self.job.train,
                   optimizer=self.optimizer, schedule=self.schedule, state=state, hooks=hooks, on_epoch=on_epoch,
                   task=self.task)


def build_rank_run(job: JobConfig, spec, *, train_rows: Callable[[int], Iterable[dict]],
                   valid_rows: Callable[[int], Iterable[dict]], steps: int, rank: int = 0, world_size: int = 1,
                   device: torch.device | str = "cpu") -> RankRun:
    """The :class:`RankRun` of ``rank`` of ``world_size``.

    Args:
        job: the job (its ``task``, ``model`` and ``train`` sections are read).
        spec: the prepared data's spec (what the model is built from besides its config).
        train_rows: ``buffer_rows -> this rank's train rows`` (a Ray Data shard read
            ``buffer_rows`` at a time, or the prepared split), read again every epoch.
        valid_rows: ``buffer_rows -> the whole validation split's rows`` in file order (every
            rank reads them and keeps its own).
        steps: optimizer steps of the whole run (:func:`total_steps`).
        device: where the model lives.
    """
    cfg, task = job.train, job.get_task()
    set_seed(cfg.seed)  # the same initial weights on every rank
    model = task.build_model(job.model, spec).to(device)
    optimizer = build_optimizer(model, cfg)
    schedule = LRSchedule(optimizer, cfg.lr_schedule, warmup_steps=cfg.warmup_steps, total_steps=steps)
    batch_size = per_worker_batch_size(cfg.batch_size, world_size)
    buffer_rows = batch_size * SORT_BUFFER_BATCHES
    layout = task.batch_layout(cfg, job.model)  # the LM: sentence lockstep or chunks of train.bptt_tokens
    valid_layout = task.evaluation_layout(job.model) or layout  # the dynamical LM: segments (batch-independent)

    def train_batches(epoch: int) -> Iterator[Any]:
        return task.stream_batches(train_rows(buffer_rows), spec, batch_size, seed=train_shuffle_seed(cfg.seed, epoch, rank),
                                   buffer_rows=buffer_rows, layout=layout)

    def valid_batches() -> Iterator[Any]:
        rows = (row for i, row in enumerate(valid_rows(buffer_rows)) if i % world_size == rank)
        return task.stream_batches(rows, spec, batch_size, seed=0, buffer_rows=buffer_rows, layout=valid_layout)

    return RankRun(job, task, spec, model, optimizer, schedule, train_batches, valid_batches, rank, world_size)


def local_run(job: JobConfig, prepared, *, device: torch.device | str = "cpu") -> RankRun:
    """The one-process :class:`RankRun` of ``job`` on a prepared folder read in this process
    (``dynlm train --local``, benchmarks): rank 0 of 1, every train and validation row."""
    one = job.replace(run=job.run.replace(num_workers=1))
    return build_rank_run(job, prepared.spec, train_rows=lambda _buffer: prepared.iter_rows("train"),
                          valid_rows=lambda _buffer: prepared.iter_rows("valid"), steps=total_steps(one, prepared),
                          device=device)
