"""Ray-free training of every task: THE step (:func:`train_step`) and THE loop (:func:`fit`).

The loop owns the step: ``zero_grad``, autocast, ``backward``, gradient accumulation (with
DDP's ``no_sync`` on the accumulating chunks), clipping, the optimizer and schedule steps, the
lockstep of DDP ranks, validation, early stopping. A task
(:class:`dynlm.tasks.Task`) only cuts a batch into chunks and computes one chunk's loss
(:class:`StepLoss`); it never steps an optimizer. The same code runs in one process (``dynlm
train --local``, benchmarks, tests) and on every DDP rank of a Ray Train run
(``pipelines/train.py`` only restores, calls it with per-rank hooks, and reports).

Works unchanged on a ``DistributedDataParallel``-wrapped model: the task's loss calls the
forward through the wrapper once per chunk, and its state methods go to ``model.module``.
Every rank must take the same number of optimizer steps: ``model.join()`` is not enough with
Adam (a rank that finished early stops stepping and the replicas drift apart), so
:func:`train_one_epoch` pads shorter batches (``task.pad_batch``; the LM: inactive sentences,
:mod:`dynlm.distributed`), and the task may wrap the model so that every rank's graph uses
every parameter (``task.wrap_for_ddp``).

A task's ``evaluate`` runs on the unwrapped module (no collectives); ``fit`` all-reduces its
metric sums (:func:`dynlm.distributed.reduce_evaluation`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NamedTuple

import numpy as np
import torch
from torch import nn

from dynlm.distributed import all_gather_floats, all_reduce_values, parameter_checksum, reduce_evaluation
from dynlm.metrics import perplexity
from dynlm.optim import LRSchedule, build_optimizer
from dynlm.train_config import TrainConfig


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel wrapper (or the model itself)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def model_device(model: nn.Module) -> torch.device:
    return next(unwrap_model(model).parameters()).device


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float,
                   scheduler=None) -> torch.Tensor | None:
    """After ``loss.backward()``: clip the gradients to norm ``grad_clip`` (0: no clipping), step
    the optimizer, then ``scheduler`` (if any). Returns the pre-clip gradient norm (a device
    scalar: no host sync), or None without clipping."""
    norm = torch.nn.utils.clip_grad_norm_(unwrap_model(model).parameters(), grad_clip) if grad_clip > 0 else None
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return norm


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class StepLoss(NamedTuple):
    """What a task's ``loss`` returns for one chunk of a batch (:meth:`dynlm.tasks.base.Task.loss`).

    Attributes:
        loss: the scalar the loop backpropagates (the mean over the chunk's targets, plus any
            auxiliary losses; an NCE loss for the naming task).
        nll_sum: the detached sum of the targets' negative log-likelihood (train perplexity is
            ``exp(sum nll_sum / sum count)``); a tensor or a float.
        count: the targets ``nll_sum`` is over (tokens, questions, names); a tensor or an int.
        state: carried to the batch's next chunk (the LM's recurrent state); the loop hands it to
            ``task.detach_state`` after the optimizer step. None for a task without state.
        stats: optional ``{name: 1-D tensor of observations}``; the step's result holds each
            one's mean over all the batch's chunks (the dynamical LM's ``gate_*`` statistics,
            one observation per sentence step).
    """

    loss: torch.Tensor
    nll_sum: Any
    count: Any
    state: Any = None
    stats: dict | None = None


def optimizer_steps(chunks: int, accumulate_steps: int) -> int:
    """Optimizer steps of ``chunks`` chunks with ``accumulate_steps`` chunks a step (the last
    group of an epoch may be shorter: it steps too)."""
    return -(-chunks // accumulate_steps)


class Accumulation:
    """Where a run stands between two optimizer steps: the gradients of ``every`` chunks
    (``train.accumulate_steps``) are summed into one step, each chunk's loss divided by
    ``every`` (the step follows the mean of their losses). On a DDP-wrapped model the backward
    of every chunk but a group's last runs under ``no_sync()``: the ranks all-reduce once per
    optimizer step. One object lives for an epoch (:func:`train_one_epoch`), so a group may span
    batches; :meth:`finish` steps on a group the epoch cut short."""

    def __init__(self, every: int):
        if every < 1:
            raise ValueError(f"accumulate_steps must be >= 1, got {every}")
        self.every = every
        self.pending = 0  # chunks backpropagated since the last optimizer step

    def closes_group(self) -> bool:
        """True when the next chunk is its group's last (the optimizer steps after it)."""
        return self.pending + 1 == self.every

    def chunk_context(self, model: nn.Module):
        """Around the next chunk's forward AND backward (DDP decides at the forward whether
        the backward all-reduces): ``no_sync()`` on a DDP model unless the chunk closes a group."""
        if isinstance(model, nn.parallel.DistributedDataParallel) and not self.closes_group():
            return model.no_sync()
        return nullcontext()

    def backward(self, loss: torch.Tensor) -> bool:
        """Backpropagate one chunk's ``loss`` (inside :meth:`chunk_context`); True when it
        closed a group (step now)."""
        last = self.closes_group()
        (loss if self.every == 1 else loss / self.every).backward()
        self.pending = 0 if last else self.pending + 1
        return last

    def finish(self, model: nn.Module) -> bool:
        """Make the gradients of an unfinished group (its chunks' backward ran under
        ``no_sync``) the mean over its ``pending`` chunks, all-reduced across DDP ranks; True
        when there was one (the caller steps), False when nothing is pending."""
        if self.pending == 0:
            return False
        params = [p for p in unwrap_model(model).parameters() if p.requires_grad]
        scale = self.every / self.pending
        if isinstance(model, nn.parallel.DistributedDataParallel):
            import torch.distributed as dist

            scale /= dist.get_world_size()  # DDP averages over ranks: so does this
            for p in params:  # every rank walks the same parameters: one all-reduce each
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(scale)
        self.pending = 0
        return True


def train_step(task, model: nn.Module, batch, optimizer: torch.optim.Optimizer, cfg: TrainConfig, *,
               scheduler=None, after_chunk: Callable[[dict], None] | None = None, autocast_dtype=None,
               accumulation: Accumulation | None = None) -> dict:
    """THE training step of every task: the chunks of ``batch``, one optimizer step per
    ``cfg.accumulate_steps`` of them.

    The loop owns the step; the task computes a loss. For each chunk of ``task.chunks(batch,
    cfg)`` (the LM: its truncated-BPTT chunks; every other task: the batch itself):
    ``zero_grad`` (at a group's first chunk) -> ``task.loss(model, chunk, state)`` (under
    autocast when ``autocast_dtype`` is given) -> ``backward`` (:class:`Accumulation`: DDP
    synchronises a group's last chunk only) -> ``state = task.detach_state(model, state)``;
    after a group's last chunk: clip to ``cfg.grad_clip`` -> optimizer step -> ``scheduler``
    step. The state starts as ``task.initial_state(model, batch)``.

    Works unchanged on a ``DistributedDataParallel``-wrapped model (the task's loss calls the
    forward through the wrapper once per chunk; state methods go to ``model.module``).

    Args:
        task: the :class:`dynlm.tasks.Task`.
        model: the task's model (or a DDP wrapper around it).
        batch: one batch of ``task.batches`` (CPU or already on the model's device), with
            ``num_documents`` and ``num_padded``.
        optimizer / cfg: the optimizer and the training settings.
        scheduler: optional object with ``step()`` called after every optimizer step.
        after_chunk: optional, called after every optimizer step with this batch's running sums:
            ``steps`` (int), ``tokens`` and ``nll_sum`` (scalar tensors on the model's device, so
            the call costs no device synchronisation; a hook converts them only when it needs
            them, and copies them to keep them: they are updated in place).
        autocast_dtype: e.g. ``torch.bfloat16`` on CUDA; None: full precision.
        accumulation: the epoch's :class:`Accumulation` (a group may then end in a later batch);
            None: this call's own, and a group the batch leaves unfinished steps at its end.

    Returns:
        ``loss`` (mean NLL per target), ``ppl``, ``tokens`` (targets), ``num_padded``,
        ``documents``, ``steps`` (optimizer steps taken in this call), ``nll_sum``,
        ``grad_norm`` (mean pre-clip norm), ``lr``; ``stats``: the mean of each of the chunks'
        ``StepLoss.stats`` (the dynamical LM's ``gate_*``; empty for a task without them).
    """
    core = unwrap_model(model)
    model.train()
    device = model_device(core)
    own_accumulation = accumulation is None
    accumulation = Accumulation(cfg.accumulate_steps) if own_accumulation else accumulation
    state = task.initial_state(model, batch)
    nll_total = torch.zeros((), dtype=torch.float64, device=device)
    count_total = torch.zeros((), dtype=torch.long, device=device)
    grad_norms, stats = [], []
    steps = 0

    def take_step() -> None:
        nonlocal steps
        if (norm := optimizer_step(core, optimizer, cfg.grad_clip, scheduler)) is not None:
            grad_norms.append(norm)
        steps += 1
        if after_chunk is not None:
            after_chunk({"steps": steps, "tokens": count_total, "nll_sum": nll_total})

    for chunk in task.chunks(batch, cfg):
        if accumulation.pending == 0:
            optimizer.zero_grad(set_to_none=True)
        step, group_done = _backward_chunk(task, model, chunk, state, accumulation, autocast_dtype, device)
        state = task.detach_state(model, step.state)
        nll_total += torch.as_tensor(step.nll_sum, device=device).detach().double()
        count_total += torch.as_tensor(step.count, device=device).long()
        if step.stats:
            stats.append(step.stats)
        if group_done:
            take_step()
    if own_accumulation and accumulation.finish(model):  # a group this batch left unfinished
        take_step()
    return _step_result(batch, float(nll_total), int(count_total), steps, grad_norms, stats, optimizer)


def _backward_chunk(task, model: nn.Module, chunk, state, accumulation: Accumulation, autocast_dtype,
                    device: torch.device) -> tuple[StepLoss, bool]:
    """One chunk's forward (under autocast when ``autocast_dtype`` is given) and backward, inside
    the accumulation's DDP context: ``(the task's StepLoss, whether the chunk closed a group)``."""
    with accumulation.chunk_context(model):
        with torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else nullcontext():
            step = task.loss(model, chunk, state)
        return step, accumulation.backward(step.loss)


def _step_result(batch, nll: float, tokens: int, steps: int, grad_norms: list[torch.Tensor], stats: list[dict],
                 optimizer: torch.optim.Optimizer) -> dict:
    """:func:`train_step`'s result dict (its Returns)."""
    return {
        "loss": nll / tokens if tokens else float("nan"),
        "ppl": perplexity(nll, tokens),
        "tokens": tokens,
        "num_padded": int(batch.num_padded),
        "documents": int(batch.num_documents),
        "steps": steps,
        "nll_sum": nll,
        "grad_norm": float(torch.stack(grad_norms).mean()) if grad_norms else float("nan"),
        "lr": optimizer.param_groups[0]["lr"],
        "stats": {key: float(torch.cat([s[key].reshape(-1) for s in stats]).mean()) for key in (stats[0] if stats else {})},
    }


def _count_steps(task, batches: Iterable[Any], cfg: TrainConfig) -> int:
    """Optimizer steps of one epoch over ``batches``."""
    return optimizer_steps(sum(task.steps_per_batch(batch, cfg) for batch in batches), cfg.accumulate_steps)


def seed_everything(seed: int, epoch: int, rank: int) -> None:
    """Seed torch's CPU and CUDA RNGs from (seed, epoch, rank): resumed epochs repeat exactly."""
    torch.manual_seed(seed * 1_000_003 + epoch * 1009 + rank)


def train_one_epoch(model, optimizer, schedule: LRSchedule, cfg: TrainConfig, batches: Iterable[Any],
                    device: torch.device, *, task, spec=None, autocast_dtype=None, after_step=None) -> dict:
    """One epoch of :func:`train_step` calls, in lockstep across DDP ranks.

    Before each step the ranks agree (one all-reduce) on the longest batch
    (``task.lockstep_size``): a shorter batch is padded (``task.pad_batch``; the LM: inactive
    sentence steps) and a rank without data runs an inactive batch (zero loss, zero gradient), so
    every rank runs the same forward/backward/optimizer calls and the replicas stay bit-identical.
    Without a process group this is a plain loop. With ``cfg.accumulate_steps`` k > 1 an optimizer
    step sums the gradients of k chunks, across batch boundaries (:class:`Accumulation`); the
    epoch's last group may be shorter and steps at its end.

    Args:
        model: the DDP-wrapped model (or the bare model in one process).
        batches: this rank's batches.
        task: the :class:`dynlm.tasks.Task`.
        spec: the preprocessor's spec (builds the inactive batch of a rank that ran out of data).
        autocast_dtype: e.g. ``torch.bfloat16`` on CUDA; None: full precision.
        after_step: called after each optimizer step with this rank's running sums (fault
            injection and a progress bar hook in here; ``tokens`` / ``nll_sum`` may be device
            scalars).

    Returns:
        This rank's sums: ``nll_sum``, ``tokens``, ``num_padded``, ``documents``, ``steps``
        (optimizer steps, equal on every rank), ``idle_batches`` (inactive dummy batches run);
        ``stat_means``: the task's step statistics (``StepLoss.stats``: the dynamical LM's
        ``gate_input_mean`` ...) averaged over this rank's batches (empty for other tasks).
    """
    totals = {"nll_sum": 0.0, "tokens": 0, "num_padded": 0, "documents": 0, "steps": 0, "idle_batches": 0}
    batch_stats: list[dict] = []
    iterator = iter(batches)
    accumulation = Accumulation(cfg.accumulate_steps)  # a group may span batches
    while True:
        batch = next(iterator, None)
        any_batch, max_size = all_reduce_values(
            [float(batch is not None), float(task.lockstep_size(batch) if batch is not None else 0)], device, op="max")
        if not any_batch:
            if accumulation.finish(model):  # the epoch's last group, cut short: every rank steps on it
                optimizer_step(unwrap_model(model), optimizer, cfg.grad_clip, schedule)
                totals["steps"] += 1
            totals["stat_means"] = {key: sum(b[key] for b in batch_stats) / len(batch_stats)
                                    for key in (batch_stats[0] if batch_stats else {})}
            return totals
        totals["idle_batches"] += batch is None
        step_batch = task.pad_batch(batch, int(max_size), spec)
        hook = None if after_step is None else _epoch_hook(after_step, dict(totals), counted=batch is not None)
        out = train_step(task, model, step_batch, optimizer, cfg, scheduler=schedule, after_chunk=hook,
                         autocast_dtype=autocast_dtype, accumulation=accumulation)
        totals["steps"] += out["steps"]
        if batch is not None:
            totals["nll_sum"] += out["nll_sum"]
            totals["tokens"] += out["tokens"]
            totals["num_padded"] += out["num_padded"]
            totals["documents"] += out["documents"]
            if out["stats"]:
                batch_stats.append(out["stats"])


def _epoch_hook(after_step: Callable[[dict], None], before: dict, counted: bool) -> Callable[[dict], None]:
    """``train_step``'s ``after_chunk``: ``after_step`` with the epoch's running sums, ``before``
    this batch plus its chunks so far (its tokens and NLL only when ``counted``: not a lockstep pad)."""
    def call(part: dict) -> None:
        running = {**before, "steps": before["steps"] + part["steps"]}
        if counted:
            running["tokens"] = before["tokens"] + part["tokens"]
            running["nll_sum"] = before["nll_sum"] + part["nll_sum"]
        after_step(running)

    return call


@dataclass
class FitState:
    """Where a run stands after ``epoch`` completed epochs (numbered from 1): what a
    checkpoint must hold to continue it exactly (with the weights, optimizer and schedule)."""

    epoch: int = 0
    history: list[dict] = field(default_factory=list)
    best_valid_objective: float = math.inf
    best_epoch: int = 0
    bad_epochs: int = 0
    stopped: bool = False  # early stopping fired: no further epoch runs

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "FitState":
        data = dict(data)
        if "best_valid_ppl" in data:  # checkpoints written before the objective was task-named
            data["best_valid_objective"] = data.pop("best_valid_ppl")
        return cls(**data)


def epoch_record(epoch: int, totals: list[float], steps: int, seconds: float, valid: dict, lr: float,
                 state: FitState, checksums: list[float], stat_means: dict | None = None, *,
                 objective_metric: str = "ppl") -> dict:
    """The one epoch record (console, MLflow, Tune, checkpoints): ``totals`` are the all-ranks
    sums ``[nll, tokens, padded positions, documents, idle batches]``; ``valid_objective`` is
    ``valid[objective_metric]`` (the task's primary metric, lower is better: what checkpoints
    are kept by, registration compares and Tune optimises by default)."""
    nll, tokens, padded, documents, idle = totals
    return {
        "epoch": epoch,
        "train_loss": nll / tokens if tokens else float("nan"),
        "train_ppl": perplexity(nll, int(tokens)),
        "train_tokens": int(tokens),
        "train_documents": int(documents),
        "train_padding_fraction": padded / (padded + tokens) if tokens else float("nan"),
        "train_tokens_per_s": tokens / seconds if seconds > 0 else float("nan"),
        "train_steps_per_rank": steps,
        "train_idle_batches": int(idle),
        "train_seconds": seconds,
        "lr": lr,
        **{f"train_{k}": v for k, v in (stat_means or {}).items()},  # this rank's step statistics (the dynamical LM's gates)
        **{f"valid_{k}": v for k, v in valid.items() if not k.startswith("nll_sum_")},  # counts kept
        "valid_objective": valid[objective_metric],
        "objective_metric": objective_metric,
        "best_valid_objective": state.best_valid_objective,
        "param_checksum": checksums[0],
        "param_checksum_spread": max(checksums) - min(checksums),
        "stopped_early": float(state.stopped),
    }


def _validate_epoch(task, core: nn.Module, valid_batches: Iterable[Any], device: torch.device,
                    schedule: LRSchedule, state: FitState, epoch: int, patience: int) -> dict:
    """Evaluate (all ranks together), step the plateau schedule, update best/early stopping on
    ``task.primary_metric`` (lower is better)."""
    valid = reduce_evaluation(task.evaluate(core, valid_batches), device, task.metrics)
    if valid["tokens"] == 0:
        raise ValueError("the validation split holds no tokens; prepare with valid_fraction > 0")
    objective = valid[task.primary_metric]
    schedule.step_validation(objective)
    if objective < state.best_valid_objective:
        state.best_valid_objective, state.best_epoch, state.bad_epochs = objective, epoch, 0
    else:
        state.bad_epochs += 1
    state.stopped = bool(patience and state.bad_epochs >= patience)
    return valid


def _schedule_for(task, optimizer, cfg: TrainConfig, total_steps: int | None, train_batches_fn) -> LRSchedule:
    """``cfg``'s schedule; a cosine one over ``total_steps`` (counted from one epoch if None)."""
    if total_steps is None:
        total_steps = cfg.epochs * _count_steps(task, train_batches_fn(1), cfg) \
            if cfg.lr_schedule == "cosine" else 1
    return LRSchedule(optimizer, cfg.lr_schedule, warmup_steps=cfg.warmup_steps, total_steps=total_steps)


def _train_epoch(task, model, optimizer, schedule, cfg: TrainConfig, batches, device, epoch: int,
                 hooks: "FitHooks") -> tuple[dict, list[float], float]:
    """One epoch of :func:`train_one_epoch` with the rank's seed and hooks: ``(this rank's sums,
    all ranks' ``[nll, tokens, padded, documents, idle batches]``, seconds)``."""
    seed_everything(cfg.seed, epoch, hooks.rank)
    if hooks.on_epoch_start is not None:
        hooks.on_epoch_start(epoch)
    started = time.perf_counter()
    after_step = (lambda totals: hooks.after_step(epoch, totals)) if hooks.after_step else None
    local = train_one_epoch(model, optimizer, schedule, cfg, batches, device, task=task, spec=hooks.spec,
                            autocast_dtype=hooks.autocast_dtype, after_step=after_step)
    if after_step is not None:
        after_step(local)  # a rank without any batch still reaches it
    seconds = time.perf_counter() - started
    totals = all_reduce_values([local[k] for k in ("nll_sum", "tokens", "num_padded", "documents", "idle_batches")],
                               device, op="sum")
    return local, totals, seconds


def fit(
    model: nn.Module,
    train_batches_fn: Callable[[int], Iterable[Any]],
    valid_batches_fn: Callable[[], Iterable[Any]],
    cfg: TrainConfig,
    *,
    on_epoch: Callable[[int, dict], bool | None] | None = None,
    total_steps: int | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    schedule: LRSchedule | None = None,
    state: FitState | None = None,
    hooks: "FitHooks | None" = None,
    task,
) -> dict:
    """THE training loop, for one process and for every DDP rank of a Ray Train run.

    Epochs ``state.epoch + 1 .. cfg.epochs``: :func:`train_one_epoch` (lockstep), sums
    all-reduced, validation all-reduced, LR plateau step, early stopping on validation ppl,
    :func:`epoch_record`, then ``on_epoch(epoch, record)`` (log, checkpoint, report; True stops).
    Without a process group every collective is the identity.

    Args:
        model: the LM, on its device (DDP-wrapped on a rank).
        train_batches_fn: ``epoch -> this rank's batches`` (reshuffled with the epoch).
        valid_batches_fn: ``() -> this rank's validation batches``.
        cfg: training settings.
        on_epoch: called after each epoch with its record; ``state`` is already updated.
        total_steps: optimizer steps of the whole run (cosine schedule); counted from one pass
            over ``train_batches_fn(1)`` when None and no ``schedule`` is given.
        optimizer / schedule: built from ``cfg`` when None (a resumed run passes restored ones).
        state: where the run stands (a resumed run's); updated in place every epoch.
        hooks: per-rank settings (:class:`FitHooks`); default: one process, rank 0.
        task: the :class:`dynlm.tasks.Task` whose ``loss``, ``evaluate`` and ``metrics`` run;
            ``best_valid_objective`` is the best ``task.primary_metric``.

    Returns:
        ``best_valid_objective``, ``best_epoch``, ``epochs_run``, ``stopped_early``, ``history`` and
        ``param_checksums`` (one per rank). With ``hooks.restore_best`` the model ends with the
        weights of the best epoch.
    """
    hooks = hooks or FitHooks()
    core = unwrap_model(model)
    device = model_device(core)
    if state is None:
        set_seed(cfg.seed)
        state = FitState()
    optimizer = build_optimizer(core, cfg) if optimizer is None else optimizer
    schedule = _schedule_for(task, optimizer, cfg, total_steps, train_batches_fn) if schedule is None else schedule
    checksums = all_gather_floats(parameter_checksum(core), device)
    best_weights = None
    for epoch in range(state.epoch + 1, cfg.epochs + 1):
        if state.stopped:
            break
        local, totals, seconds = _train_epoch(task, model, optimizer, schedule, cfg, train_batches_fn(epoch),
                                              device, epoch, hooks)
        valid = _validate_epoch(task, core, valid_batches_fn(), device, schedule, state, epoch,
                                cfg.early_stopping_patience)
        if hooks.restore_best and state.best_epoch == epoch:
            best_weights = copy.deepcopy(core.state_dict())
        checksums = all_gather_floats(parameter_checksum(core), device)
        record = epoch_record(epoch, totals, local["steps"], seconds, valid, optimizer.param_groups[0]["lr"],
                              state, checksums, local["stat_means"], objective_metric=task.primary_metric)
        state.epoch = epoch
        state.history.append(record)
        if on_epoch is not None and on_epoch(epoch, record):
            break
    if best_weights is not None:
        core.load_state_dict(best_weights)
    return {"best_valid_objective": state.best_valid_objective, "best_epoch": state.best_epoch,
            "epochs_run": len(state.history), "stopped_early": state.stopped, "history": state.history,
            "param_checksums": checksums}


@dataclass
class FitHooks:
    """What a DDP rank adds to :func:`fit` (all optional for one process).

    Attributes:
        rank: this process's rank (seeds its RNG stream with the epoch).
        spec: the VocabSpec (for the dummy batch of a rank that runs out of data).
        autocast_dtype: e.g. ``torch.bfloat16`` on CUDA; None: full precision.
        on_epoch_start: ``epoch -> None`` before each epoch (a progress bar).
        after_step: ``(epoch, running sums) -> None`` after each optimizer step and once more at
            the end of each epoch (fault injection, a progress bar).
        restore_best: keep the best epoch's weights in memory and load them at the end (a Ray
            run keeps the best checkpoint instead).
    """

    rank: int = 0
    spec: Any = None
    autocast_dtype: Any = None
    on_epoch_start: Callable[[int], None] | None = None
    after_step: Callable[[int, dict], None] | None = None
    restore_best: bool = True
