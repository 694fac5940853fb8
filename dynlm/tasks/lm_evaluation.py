"""The language models' training chunks and evaluation: the LM task's loop-side code
(:class:`dynlm.tasks.lm.LMTask` uses it; the loop itself, :mod:`dynlm.training`, is task-blind).

Truncated BPTT: a document batch is read in chunks, one optimizer step each; a chunk is one
step of a batch built with a :class:`~dynlm.data.batching.ChunkLayout` (``train.bptt_tokens >
0``), or ``train.bptt_sentences`` sentence steps of a lockstep batch. The recurrent state is
carried from chunk to chunk and detached between them.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from dynlm.data.batching import DocumentBatch
from dynlm.losses import token_nll
from dynlm.metrics import MetricAccumulator
from dynlm.train_config import TrainConfig
from dynlm.training import model_device, unwrap_model


def steps_per_chunk(cfg: TrainConfig) -> int:
    """Batch steps per truncated-BPTT chunk (optimizer step): 1 in the chunk layout, else ``bptt_sentences``."""
    return 1 if cfg.bptt_tokens > 0 else cfg.bptt_sentences


def bptt_chunks(batch: DocumentBatch, cfg: TrainConfig) -> list[list]:
    """The batch's sentence steps, ``steps_per_chunk(cfg)`` of them a chunk (one optimizer step each)."""
    stride = steps_per_chunk(cfg)
    return [batch.sentences[start : start + stride] for start in range(0, len(batch.sentences), stride)]


def evaluate_lm(model: nn.Module, batches: Iterable[DocumentBatch]) -> dict:
    """The paper metrics over ``batches`` (each document read from its start, state carried).

    Runs on the unwrapped model in eval mode under ``torch.no_grad()``, unless the model sets
    ``needs_grad_at_eval = True`` (it computes gradients in its forward): then gradients are
    enabled and the state is detached after every sentence.

    Returns:
        :meth:`dynlm.metrics.MetricAccumulator.compute` of all batches: ``loss``, ``ppl``,
        ``ppl_first_mention``, ``ppl_reappearing``, ``ppl_after_entity``, ``ppl_oov``,
        ``ppl_reappearing_1`` / ``_2`` / ``_3_5`` / ``_6_plus`` (accumulation analysis),
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
                    nll = token_nll(output.logits.detach(), sentence.targets, sentence.mask, output.positions)
                    accumulator.update_from_nll(nll, sentence)
                    if needs_grad:
                        state = core.detach_state(state)
    finally:
        core.train(was_training)
    return accumulator.compute()
