"""DDP helpers that stay Ray-free (used by the Ray Train workers and scripts/device_check.py).

* :class:`EveryParameterUsed`: the anchor that keeps DDP's reducer in step;
* collectives (``all_reduce_values``, ``all_gather_*``, ``reduce_evaluation``) that are the
  identity without a process group, so one training loop serves one and many processes;
* lockstep padding (``pad_to_steps``, ``dummy_batch``): every rank runs the same steps.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from dynlm.data.batching import DocumentBatch, SentenceBatch, collate_documents
from dynlm.metrics import MetricAccumulator
from dynlm.vocab_spec import VocabSpec


class EveryParameterUsed(torch.nn.Module):
    """Wrap an LM so every forward touches every parameter (with a zero-valued term).

    DDP's reducer needs the same set of parameters to receive gradients on every rank at
    every step. A DNTM chunk without entity mentions (or an inactive padding chunk) leaves the
    entity modules out of the graph; when that happens on one rank only, DDP's collectives
    go out of step and the ranks hang or crash (even with ``find_unused_parameters=True``,
    since DDP cannot see the tensors inside the ``LMOutput`` dataclass).
    Adding ``0 * sum(first element of each parameter)`` to the first output's logits puts
    every parameter in every graph at a negligible cost, so plain DDP
    (``find_unused_parameters=False``) works. The state methods pass through to ``lm``.
    """

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    @property
    def needs_grad_at_eval(self) -> bool:
        return bool(getattr(self.lm, "needs_grad_at_eval", False))

    def init_state(self, batch_size: int, device=None):
        return self.lm.init_state(batch_size, device)

    def detach_state(self, state):
        return self.lm.detach_state(state)

    def reset_state(self, state, keep):
        return self.lm.reset_state(state, keep)

    def forward(self, batch, state):
        outputs, state = self.lm(batch, state)
        anchor = sum(p.reshape(-1)[:1].sum() for p in self.lm.parameters() if p.requires_grad) * 0.0
        first = outputs[0] if isinstance(outputs, list) else outputs
        touched = dataclasses.replace(first, logits=first.logits + anchor.to(first.logits.dtype))
        if isinstance(outputs, list):
            return [touched] + outputs[1:], state
        return touched, state


# ---------------------------------------------------------------------------------------------
# Collectives: identity without a process group, so one code path serves 1 and N processes
# ---------------------------------------------------------------------------------------------


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_values(values: list[float], device: torch.device, op: str = "max") -> list[float]:
    """All-reduce a few numbers (``op``: ``"max"`` or ``"sum"``) in float64."""
    if not _distributed():
        return [float(v) for v in values]
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return tensor.tolist()


def all_gather_floats(value: float, device: torch.device) -> list[float]:
    """Every rank's ``value``, in rank order."""
    if not _distributed():
        return [float(value)]
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    out = [torch.zeros_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor)
    return [float(t.item()) for t in out]


def all_gather_strings(value: str) -> list[str]:
    """Every rank's ``value``, in rank order."""
    if not _distributed():
        return [value]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return [str(item) for item in out]


def parameter_checksum(model: torch.nn.Module) -> float:
    """Sum of every parameter in float64 (equal across ranks iff DDP kept them in sync)."""
    with torch.no_grad():
        return float(sum(p.detach().double().sum().item() for p in model.parameters()))


def reduce_evaluation(local: dict, device: torch.device, metrics_cls: type = MetricAccumulator) -> dict:
    """Sum a task's evaluation over the ranks and recompute its metrics (equal on every rank).

    Args:
        local: the task's ``evaluate`` of this rank's part of the validation set.
        device: where the collective runs (the rank's device: NCCL needs CUDA tensors).
        metrics_cls: the task's accumulator (``from_metrics``, ``as_tensor``, ``from_tensor``,
            ``compute``); the LM's :class:`MetricAccumulator` by default.
    """
    values = metrics_cls.from_metrics(local).as_tensor(device)
    if _distributed():
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return metrics_cls.from_tensor(values).compute()


# ---------------------------------------------------------------------------------------------
# Lockstep: every rank runs the same number of steps (see dynlm.training.train_one_epoch)
# ---------------------------------------------------------------------------------------------


def inactive_like(step: SentenceBatch) -> SentenceBatch:
    """A copy of a sentence step where every document is inactive (no target, zero loss)."""
    return dataclasses.replace(
        step,
        mask=torch.zeros_like(step.mask),
        lengths=torch.zeros_like(step.lengths),
        doc_active=torch.zeros_like(step.doc_active),
        new_doc=torch.zeros_like(step.new_doc),
        doc_end=torch.zeros_like(step.doc_end),
        target_kind=torch.zeros_like(step.target_kind),
        doc_start=torch.zeros_like(step.doc_start),
        step_sentence_lengths=torch.zeros_like(step.step_sentence_lengths),
        step_mention_repeats=torch.zeros_like(step.step_mention_repeats),
        reset_columns=step.reset_columns[:0],
    )


def pad_to_steps(batch: DocumentBatch, num_steps: int) -> DocumentBatch:
    """``batch`` with inactive sentence steps appended up to ``num_steps`` steps."""
    missing = num_steps - len(batch.sentences)
    if missing <= 0:
        return batch
    blank = inactive_like(batch.sentences[-1])
    return DocumentBatch(batch.sentences + [blank] * missing, batch.doc_ids, batch.num_tokens, batch.num_padded)


def dummy_batch(spec: VocabSpec, num_steps: int) -> DocumentBatch:
    """A one-document batch of ``num_steps`` inactive steps, for a rank that ran out of data."""
    row = {"doc_id": "<inactive>", "source_file": "", "num_tokens": 2, "sentence_lengths": [2],
           "word_ids": [spec.bos_id, spec.eos_id], "entity_ids": [0, 0],
           "subword_ids": [spec.subword_pad_id, spec.subword_pad_id], "subword_lengths": [1, 1]}
    template = collate_documents([row], spec)
    blank = inactive_like(template.sentences[0])
    return DocumentBatch([blank] * num_steps, ["<inactive>"], 0, 0)
