"""Dynamic evaluation (Krause et al., 2018), RMS variant with a global prior, for any static LM.

While a test document is read in segments of ``segment_len`` tokens, the model keeps adapting
to it: each segment is scored first (that score is what the metrics count), then the weights
take one step on that segment's mean NLL::

    theta <- theta - lr * grad / (rms + eps) + decay * decay_rate * (theta_0 - theta)

``rms`` is the root-mean-square gradient of each weight collected on training data
(:func:`collect_grad_stats`), ``decay_rate = rms / mean(rms)`` (over all weights, clipped at
``1 / decay``) pulls often-changing weights back faster towards the trained ``theta_0``.

Documents are independent articles: theta is reset to theta_0 (and the recurrent state to
zero) at the start of every document. Each document of a batch is therefore read on its own
(batch size 1, in order); the metrics are those of :func:`dynlm.training.evaluate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from dynlm.config import Config, ConfigError
from dynlm.losses import token_nll
from dynlm.metrics import MetricAccumulator
from dynlm.modules.fast_weights import select_rows, slice_columns


@dataclass
class DynamicEvalConfig(Config):
    """Hyper-parameters of dynamic evaluation.

    Attributes:
        lr: eta, the step size (applied to grad / (rms + eps)).
        decay: lambda, the strength of the pull back to the trained weights.
        eps: added to the RMS gradient statistics.
        segment_len: tokens per segment (one update per segment).
    """

    lr: float = 2e-5
    decay: float = 0.02
    eps: float = 1e-3
    segment_len: int = 20

    def validate(self) -> None:
        if self.lr < 0 or self.decay < 0 or self.eps <= 0:
            raise ConfigError(f"dynamic eval: need lr >= 0, decay >= 0, eps > 0 (got {self.lr}, {self.decay}, {self.eps})")
        if self.segment_len <= 0:
            raise ConfigError(f"dynamic eval: segment_len must be positive, got {self.segment_len}")


def _trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


@torch.backends.cudnn.flags(enabled=False)  # cuDNN RNN backward refuses eval mode
def collect_grad_stats(model: nn.Module, batches: Iterable, *, segment_len: int = 20,
                       max_segments: int | None = None) -> dict[str, torch.Tensor]:
    """RMS of each weight's gradient over segments of training data (model in eval mode).

    Every sentence step of each batch is cut into chunks of ``segment_len`` positions; the
    gradient of each chunk's mean NLL (all documents of the batch together) is squared and
    averaged over chunks. The recurrent state flows through the document but is detached
    between chunks.

    Args:
        model: a static LM (stateful interface of :mod:`dynlm.models`).
        batches: ``DocumentBatch`` objects of training data.
        segment_len: chunk length in positions.
        max_segments: stop after this many chunks (None: read every batch).

    Returns:
        name -> ``sqrt(mean(grad ** 2))`` with the parameter's shape (``named_parameters`` names).
    """
    params = _trainable(model)
    sums = {name: torch.zeros_like(p) for name, p in params.items()}
    count = 0
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        with torch.enable_grad():
            for doc_batch in batches:
                state = model.init_state(doc_batch.batch_size, device)
                for sentence in doc_batch.sentences:
                    sentence = sentence.to(device)
                    for start in range(0, sentence.tokens.size(1), segment_len):
                        chunk = slice_columns(sentence, start, start + segment_len)
                        output, state = model(chunk, state)
                        tokens = int(chunk.mask.sum())
                        if tokens > 0:
                            loss = token_nll(output.logits, chunk.targets, chunk.mask).sum() / tokens
                            grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
                            for name, g in zip(params, grads):
                                if g is not None:
                                    sums[name] += g.detach() ** 2
                            count += 1
                        state = model.detach_state(state)
                        if max_segments is not None and count >= max_segments:
                            return {name: (s / count).sqrt() for name, s in sums.items()}
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("collect_grad_stats: the batches hold no tokens")
    return {name: (s / count).sqrt() for name, s in sums.items()}


@torch.backends.cudnn.flags(enabled=False)  # cuDNN RNN backward refuses eval mode
def dynamic_evaluate(model: nn.Module, batches: Iterable, cfg: DynamicEvalConfig,
                     stats: dict[str, torch.Tensor]) -> dict[str, float]:
    """Evaluate ``model`` with dynamic evaluation; the model's weights are restored afterwards.

    Args:
        model: a trained static LM (stateful interface of :mod:`dynlm.models`).
        batches: ``DocumentBatch`` objects (whole documents; each is read on its own).
        cfg: step size, decay, eps and segment length.
        stats: :func:`collect_grad_stats` output for this model.

    Returns:
        The metrics of :func:`dynlm.training.evaluate` (``loss``, ``ppl``, ``ppl_*``, ``tokens`` ...),
        every token scored before the update that uses it.
    """
    params = _trainable(model)
    missing = sorted(set(params) - set(stats))
    if missing:
        raise ValueError(f"dynamic_evaluate: no gradient statistics for {missing[:3]} "
                         f"({len(missing)} parameters); run collect_grad_stats on this model")
    theta0 = {name: p.detach().clone() for name, p in params.items()}
    rms = {name: stats[name].to(p.device, p.dtype) for name, p in params.items()}
    mean_rms = torch.cat([r.flatten() for r in rms.values()]).mean().clamp_min(1e-12)
    max_rate = 1.0 / cfg.decay if cfg.decay > 0 else float("inf")
    decay_rate = {name: (r / mean_rms).clamp(max=max_rate) for name, r in rms.items()}
    denominators = {name: r + cfg.eps for name, r in rms.items()}
    names = list(params)
    device = next(model.parameters()).device
    metrics = MetricAccumulator()
    was_training = model.training
    model.eval()

    def restore() -> None:
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(theta0[name])

    def step(segment_loss: torch.Tensor) -> None:
        grads = torch.autograd.grad(segment_loss, [params[n] for n in names], allow_unused=True)
        with torch.no_grad():
            for name, g in zip(names, grads):
                p = params[name]
                if g is not None:
                    p.sub_(cfg.lr * g / denominators[name])
                p.add_(cfg.decay * decay_rate[name] * (theta0[name] - p))

    try:
        with torch.enable_grad():
            for doc_batch in batches:
                for row in range(doc_batch.batch_size):
                    restore()  # theta = theta_0 at each document start
                    state = model.init_state(1, device)
                    seg_loss, seg_tokens, seg_pos = None, 0, 0
                    for sentence in doc_batch.sentences:
                        length = int(sentence.lengths[row])
                        if length == 0:
                            continue
                        doc_sentence = slice_columns(select_rows(sentence, [row]), 0, length).to(device)
                        pos = 0
                        while pos < length:
                            take = min(cfg.segment_len - seg_pos, length - pos)
                            chunk = slice_columns(doc_sentence, pos, pos + take)
                            output, state = model(chunk, state)
                            nll = token_nll(output.logits, chunk.targets, chunk.mask)  # [1, take]
                            metrics.update_from_nll(nll, chunk)
                            seg_loss = nll.sum() if seg_loss is None else seg_loss + nll.sum()
                            seg_tokens += take
                            seg_pos += take
                            pos += take
                            if seg_pos == cfg.segment_len:
                                step(seg_loss / seg_tokens)
                                state = model.detach_state(state)
                                seg_loss, seg_tokens, seg_pos = None, 0, 0
    finally:
        restore()
        model.train(was_training)
    return metrics.compute()
