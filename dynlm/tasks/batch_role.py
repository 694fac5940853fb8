"""The batching role of a :class:`dynlm.tasks.Task`: encoded rows -> batches, laid out so that
every DDP rank takes the same optimizer steps.

A task author writes (required): ``collate`` (rows -> one batch with ``to(device)``,
``num_documents`` and ``num_padded``) and, for sorting, ``row_length``. Everything else has a
default for a task whose batch is one optimizer step: ``batches`` (shuffled, sorted by
``row_length``, cut), ``stream_batches`` (bounded buffers of a stream), one layout, the lockstep
members. A task that cuts a batch into a varying number of chunks (the LM) overrides
``lockstep_size`` / ``pad_batch`` / ``steps_per_epoch`` (and ``batch_layout`` when it has several).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Iterable, Iterator


class TaskBatching(ABC):
    """The batching role (module docstring)."""

    name: ClassVar[str]

    @abstractmethod
    def collate(self, rows: list[dict], spec) -> Any:
        """Encoded rows (dicts of ``encoded_schema``) -> one batch: ``to(device)``, and
        ``num_documents`` / ``num_padded`` (what a training step reports: its active records and
        padded positions)."""

    def row_length(self, row: dict) -> int:
        """How long an encoded row is (the default :meth:`batches` groups rows of similar
        length, so that a batch pads little). Default: 0 (no sorting)."""
        return 0

    def batches(self, rows: Iterable[dict], spec, batch_size: int, *, sort_by_length: bool = True,
                seed: int | None = 0, layout: Any = None) -> Iterator[Any]:
        """Batches of ``batch_size`` records (``seed`` shuffles, None keeps the order), laid out
        as ``layout`` (what :meth:`batch_layout` returned) says. Default: shuffled, then
        (``sort_by_length``) stably sorted by :meth:`row_length`, cut, and the batches shuffled."""
        rows = list(rows)
        if seed is not None:
            random.Random(seed).shuffle(rows)
        if sort_by_length:
            rows.sort(key=self.row_length)
        starts = list(range(0, len(rows), batch_size))
        if seed is not None:
            random.Random(seed + 1).shuffle(starts)  # an epoch does not go from short to long
        for start in starts:
            yield self.collate(rows[start : start + batch_size], spec)

    def batch_layout(self, train_cfg, model_cfg) -> Any:
        """How a run of ``train_cfg`` and ``model_cfg`` lays its batches out, passed as ``layout``
        to :meth:`batches` / :meth:`stream_batches` / :meth:`steps_per_epoch` (opaque to the
        runner; default None: the task has one layout). The LM: sentence lockstep or chunks."""
        return None

    def evaluation_layout(self, model_cfg) -> Any:
        """The layout a model of ``model_cfg`` must be evaluated in (``dynlm evaluate``, validation
        during training), passed as ``layout`` to :meth:`batches`; None (the default): every layout
        gives the same metrics (evaluation then reads the default layout, validation the
        training layout)."""
        return None

    def stream_batches(self, rows: Iterable[dict], spec, batch_size: int, *, seed: int,
                       buffer_rows: int, layout: Any = None) -> Iterator[Any]:
        """Batches of a stream of rows (a Ray Data shard): ``buffer_rows`` rows at a time go
        through :meth:`batches` (seed ``seed + k`` for the k-th buffer), so memory stays bounded.
        ``layout`` is passed on when it is not None (a task with one layout need not take it)."""
        extra = {} if layout is None else {"layout": layout}
        buffer: list[dict] = []
        chunk = 0
        for row in rows:
            buffer.append(row)
            if len(buffer) == buffer_rows:
                yield from self.batches(buffer, spec, batch_size, seed=seed + chunk, **extra)
                buffer, chunk = [], chunk + 1
        if buffer:
            yield from self.batches(buffer, spec, batch_size, seed=seed + chunk, **extra)

    def steps_per_batch(self, batch, train_cfg) -> int:
        """Chunks the loop backpropagates on ``batch``: its ``chunks`` (the cosine schedule's length)."""
        return sum(1 for _ in self.chunks(batch, train_cfg))

    def steps_per_epoch(self, prepared, train_cfg, world_size: int, layout: Any = None) -> int:
        """Chunks per rank of one epoch over ``prepared``'s train split, read from the Parquet
        metadata only (default: one per global batch); the loop divides by
        ``train.accumulate_steps`` (:func:`dynlm.training.optimizer_steps`)."""
        from dynlm.data.batching import per_worker_batch_size

        per_step = per_worker_batch_size(train_cfg.batch_size, world_size) * world_size
        return max(1, -(-prepared.num_documents("train") // per_step))

    def lockstep_size(self, batch) -> int:
        """How long the step runs on ``batch`` in the unit :meth:`pad_batch` pads in; the
        ranks of a DDP run agree on the longest before every step (default: 1, one step)."""
        return 1

    def pad_batch(self, batch, size: int, spec) -> Any:
        """``batch`` padded to ``size`` (inactive positions: zero loss, zero gradient) so that
        every rank runs the same optimizer steps; ``batch`` None: an inactive batch of that size
        for a rank that ran out of data. Default: the batch itself, and ``collate([], spec)`` for
        a rank without data (a task whose ``collate`` cannot build an empty batch overrides this)."""
        return self.collate([], spec) if batch is None else batch
