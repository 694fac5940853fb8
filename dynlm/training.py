"""Ray-free training: ``TrainConfig``, ``train_step`` (truncated BPTT over sentences),
``evaluate`` (the paper metrics) and ``fit`` (a single-process loop with early stopping).

Works unchanged on a ``DistributedDataParallel``-wrapped model: the state methods are called
on ``model.module`` and the forward goes through the wrapper, once per truncated-BPTT chunk
(the model gets the chunk's sentences as a list). Every rank must take the same number of
optimizer steps: ``model.join()`` is not enough with Adam (a rank that finished early stops
stepping and the replicas drift apart), so the Ray Train workers pad shorter batches with
inactive sentences instead (``pipelines/train.py``), and wrap the model in
:class:`dynlm.distributed.EveryParameterUsed` so that every rank's graph uses every parameter.

``evaluate`` runs on the unwrapped module (no collectives); all-reduce its ``nll_sum_*`` /
``count_*`` values (see :class:`dynlm.metrics.MetricAccumulator`) to combine ranks.
"""

from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Literal

import numpy as np
import torch
from torch import nn

from dynlm.config import Config, ConfigError
from dynlm.data.batching import DocumentBatch
from dynlm.losses import chunk_loss, token_nll
from dynlm.metrics import MetricAccumulator, perplexity
from dynlm.optim import LRSchedule, build_optimizer


@dataclass
class TrainConfig(Config):
    lr: float = 2e-3
    epochs: int = 5
    batch_size: int = 16  # documents per batch
    bptt_sentences: int = 4  # sentences per truncated-BPTT chunk (one optimizer step)
    grad_clip: float = 0.25  # max global grad norm; 0 disables clipping
    weight_decay: float = 0.0
    lr_schedule: Literal["constant", "cosine", "plateau"] = "cosine"
    warmup_steps: int = 0
    early_stopping_patience: int = 3  # epochs without validation improvement; 0 disables
    seed: int = 0
    optimizer: Literal["adam", "sgd"] = "adam"

    def validate(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"train.lr must be positive, got {self.lr}")
        for name in ("epochs", "batch_size", "bptt_sentences"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("grad_clip", "weight_decay", "warmup_steps", "early_stopping_patience"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)}")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel wrapper (or the model itself)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def model_device(model: nn.Module) -> torch.device:
    return next(unwrap_model(model).parameters()).device


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def train_step(
    model: nn.Module,
    batch: DocumentBatch,
    optimizer: torch.optim.Optimizer,
    cfg: TrainConfig,
    *,
    scheduler=None,
) -> dict:
    """Train on one document batch with truncated BPTT over ``cfg.bptt_sentences`` sentences.

    For each chunk of sentence steps: one forward over the chunk, loss = summed token NLL /
    tokens (+ aux losses), backward, clip to ``cfg.grad_clip``, optimizer step, scheduler step,
    then the state is detached and carried to the next chunk.

    Args:
        model: an LM (or a DDP wrapper around one).
        batch: the documents (CPU or already on the model's device).
        optimizer: the optimizer.
        cfg: training settings.
        scheduler: optional object with ``step()`` called after every optimizer step.

    Returns:
        ``loss`` (mean NLL per token), ``ppl``, ``tokens``, ``num_padded``, ``steps``
        (optimizer steps), ``nll_sum``, ``grad_norm`` (mean pre-clip norm), ``lr``; plus, for a
        model whose outputs carry ``extras["gate_stats"]`` (the dynamical LM), those statistics
        averaged over the batch's chunks (``gate_input_mean`` ...).
    """
    core = unwrap_model(model)
    model.train()
    device = model_device(core)
    state = core.init_state(batch.batch_size, device)
    nll_total = torch.zeros((), dtype=torch.float64, device=device)
    count_total = torch.zeros((), dtype=torch.long, device=device)
    grad_norms, gate_stats = [], []
    steps = 0
    for start in range(0, len(batch.sentences), cfg.bptt_sentences):
        chunk = [s.to(device, non_blocking=True) for s in batch.sentences[start : start + cfg.bptt_sentences]]
        optimizer.zero_grad(set_to_none=True)
        outputs, state = model(chunk, state)  # one forward per chunk (DDP.join needs that)
        loss, nll_sum, count = chunk_loss(outputs, chunk)
        gate_stats += [o.extras["gate_stats"] for o in outputs if "gate_stats" in o.extras]
        loss.backward()
        if cfg.grad_clip > 0:
            grad_norms.append(torch.nn.utils.clip_grad_norm_(core.parameters(), cfg.grad_clip))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        state = core.detach_state(state)
        nll_total += nll_sum.double()
        count_total += count
        steps += 1
    nll, tokens = float(nll_total), int(count_total)
    return {
        "loss": nll / tokens if tokens else float("nan"),
        "ppl": perplexity(nll, tokens),
        "tokens": tokens,
        "num_padded": batch.num_padded,
        "steps": steps,
        "nll_sum": nll,
        "grad_norm": float(torch.stack(grad_norms).mean()) if grad_norms else float("nan"),
        "lr": optimizer.param_groups[0]["lr"],
        **{key: float(torch.stack([g[key] for g in gate_stats]).mean()) for key in (gate_stats[0] if gate_stats else {})},
    }


def evaluate(model: nn.Module, batches: Iterable[DocumentBatch]) -> dict:
    """The paper metrics over ``batches`` (each document read from its start, state carried).

    Runs on the unwrapped model in eval mode under ``torch.no_grad()``, unless the model sets
    ``needs_grad_at_eval = True`` (it computes gradients in its forward): then gradients are
    enabled and the state is detached after every sentence.

    Returns:
        :meth:`dynlm.metrics.MetricAccumulator.compute` of all batches: ``loss``, ``ppl``,
        ``ppl_first_mention``, ``ppl_reappearing``, ``ppl_after_entity``, ``ppl_oov``,
        ``tokens`` and the raw ``nll_sum_*`` / ``count_*``.
    """
    core = unwrap_model(model)
    was_training = core.training
    core.eval()
    device = model_device(core)
    needs_grad = bool(getattr(core, "needs_grad_at_eval", False))
    accumulator = MetricAccumulator()
    try:
        with torch.enable_grad() if needs_grad else torch.no_grad():
            for batch in batches:
                state = core.init_state(batch.batch_size, device)
                for sentence in batch.sentences:
                    sentence = sentence.to(device, non_blocking=True)
                    output, state = core(sentence, state)
                    nll = token_nll(output.logits.detach(), sentence.targets, sentence.mask)
                    accumulator.update_from_nll(nll, sentence)
                    if needs_grad:
                        state = core.detach_state(state)
    finally:
        core.train(was_training)
    return accumulator.compute()


def _count_steps(batches: Iterable[DocumentBatch], bptt_sentences: int) -> int:
    return sum(math.ceil(len(b.sentences) / bptt_sentences) for b in batches)


def fit(
    model: nn.Module,
    train_batches_fn: Callable[[int], Iterable[DocumentBatch]],
    valid_batches_fn: Callable[[], Iterable[DocumentBatch]],
    cfg: TrainConfig,
    *,
    on_epoch: Callable[[int, dict], bool | None] | None = None,
    total_steps: int | None = None,
) -> dict:
    """Single-process training loop with LR schedule and early stopping on validation ppl.

    Args:
        model: the LM (moved to its device by the caller).
        train_batches_fn: ``epoch -> iterable of DocumentBatch`` (reshuffle with the epoch).
        valid_batches_fn: ``() -> iterable of DocumentBatch``.
        cfg: training settings (seeded with ``cfg.seed``).
        on_epoch: called with ``(epoch, record)`` after each epoch; returning True stops.
        total_steps: optimizer steps of the whole run for the cosine schedule; counted from
            one pass over ``train_batches_fn(0)`` when None.

    Returns:
        ``best_valid_ppl``, ``best_epoch``, ``epochs_run``, ``stopped_early``, ``history``
        (one record per epoch). The model ends with the weights of the best epoch.
    """
    set_seed(cfg.seed)
    core = unwrap_model(model)
    optimizer = build_optimizer(core, cfg)
    if total_steps is None:
        total_steps = cfg.epochs * _count_steps(train_batches_fn(0), cfg.bptt_sentences) if cfg.lr_schedule == "cosine" else 1
    schedule = LRSchedule(optimizer, cfg.lr_schedule, warmup_steps=cfg.warmup_steps, total_steps=total_steps)
    best_ppl, best_epoch, best_weights = math.inf, -1, None
    history, bad_epochs, stopped_early = [], 0, False
    for epoch in range(cfg.epochs):
        started = time.perf_counter()
        nll, tokens, padded = 0.0, 0, 0
        for batch in train_batches_fn(epoch):
            metrics = train_step(model, batch, optimizer, cfg, scheduler=schedule)
            nll, tokens, padded = nll + metrics["nll_sum"], tokens + metrics["tokens"], padded + metrics["num_padded"]
        train_seconds = time.perf_counter() - started
        valid = evaluate(model, valid_batches_fn())
        if valid["tokens"] == 0:
            raise ValueError("fit: the validation batches hold no tokens")
        schedule.step_validation(valid["ppl"])
        record = {
            "epoch": epoch,
            "train_loss": nll / tokens if tokens else float("nan"),
            "train_ppl": perplexity(nll, tokens),
            "train_tokens": tokens,
            "train_padding_fraction": padded / (padded + tokens) if tokens else float("nan"),
            "train_tokens_per_s": tokens / train_seconds if train_seconds > 0 else float("nan"),
            "lr": optimizer.param_groups[0]["lr"],
            **{f"valid_{k}": v for k, v in valid.items()},
        }
        history.append(record)
        if valid["ppl"] < best_ppl:
            best_ppl, best_epoch, bad_epochs = valid["ppl"], epoch, 0
            best_weights = copy.deepcopy(core.state_dict())
        else:
            bad_epochs += 1
        if on_epoch is not None and on_epoch(epoch, record):
            break
        if cfg.early_stopping_patience and bad_epochs >= cfg.early_stopping_patience:
            stopped_early = True
            break
    if best_weights is not None:
        core.load_state_dict(best_weights)
    return {
        "best_valid_ppl": best_ppl,
        "best_epoch": best_epoch,
        "epochs_run": len(history),
        "stopped_early": stopped_early,
        "history": history,
    }
