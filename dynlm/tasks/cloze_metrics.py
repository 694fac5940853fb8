"""The cloze task's metrics: accuracy overall, on questions whose answer is out of vocabulary
(no own word embedding: off the short list, the SAW paper's OOV questions), and per answer class.

Fixed-size sums, so the DDP ranks all-reduce :meth:`ClozeMetrics.as_tensor` with SUM;
:meth:`ClozeMetrics.compute` gives ``loss`` (mean −log P(answer), nats), ``ppl`` = exp(loss),
``questions`` (and ``tokens``, the same count), ``accuracy``, ``error`` = 1 − accuracy (the
primary metric, lower is better), ``oov_questions`` / ``oov_accuracy``,
``<class>_questions`` / ``<class>_accuracy`` for each of :data:`ANSWER_CLASSES` (NaN when none),
and the raw sums ``sum_<key>`` that :meth:`ClozeMetrics.from_metrics` rebuilds it from.
"""

from __future__ import annotations

import math

import torch

from dynlm.data.cbt import ANSWER_CLASSES
from dynlm.metrics import perplexity

KEYS = ("nll_sum", "questions", "correct", "oov_questions", "oov_correct",
        *(f"{c}_{k}" for c in ANSWER_CLASSES for k in ("questions", "correct")))


class ClozeMetrics:
    """Sums over questions (module docstring)."""

    def __init__(self):
        self.sums = dict.fromkeys(KEYS, 0.0)

    def update(self, log_probs: torch.Tensor, answer: torch.Tensor, answer_oov: list[bool],
               answer_classes: list[str]) -> None:
        """Add a batch: ``log_probs`` ``[B, C]`` of the candidates, ``answer`` ``[B]`` (-1: an
        inactive row, skipped), per row whether its answer is OOV and its class."""
        predicted = log_probs.argmax(dim=1).tolist()
        picked = log_probs.gather(1, answer.clamp_min(0)[:, None]).squeeze(1).tolist()
        for guess, log_p, truth, oov, answer_class in zip(predicted, picked, answer.tolist(), answer_oov, answer_classes):
            if truth < 0:
                continue
            correct = float(guess == truth)
            self.sums["nll_sum"] -= log_p
            self.sums["questions"] += 1
            self.sums["correct"] += correct
            if oov:
                self.sums["oov_questions"] += 1
                self.sums["oov_correct"] += correct
            if answer_class in ANSWER_CLASSES:
                self.sums[f"{answer_class}_questions"] += 1
                self.sums[f"{answer_class}_correct"] += correct

    def merge(self, other: "ClozeMetrics") -> "ClozeMetrics":
        for key in KEYS:
            self.sums[key] += other.sums[key]
        return self

    def as_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[len(KEYS)]`` float64."""
        return torch.tensor([self.sums[k] for k in KEYS], dtype=torch.float64, device=device)

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> "ClozeMetrics":
        values = values.detach().cpu().tolist()
        if len(values) != len(KEYS):
            raise ValueError(f"ClozeMetrics.from_tensor: expected {len(KEYS)} values, got {len(values)}")
        metrics = cls()
        metrics.sums = {k: (v if k == "nll_sum" else float(round(v))) for k, v in zip(KEYS, values)}
        return metrics

    @classmethod
    def from_metrics(cls, metrics: dict) -> "ClozeMetrics":
        """The accumulator whose :meth:`compute` gave ``metrics`` (its ``sum_*`` keys)."""
        accumulator = cls()
        accumulator.sums = {k: float(metrics[f"sum_{k}"]) for k in KEYS}
        return accumulator

    def compute(self) -> dict[str, float]:
        sums = self.sums
        questions = sums["questions"]

        def ratio(correct: str, total: str) -> float:
            return sums[correct] / sums[total] if sums[total] else math.nan

        out: dict[str, float] = {"loss": sums["nll_sum"] / questions if questions else math.nan,
                                 "ppl": perplexity(sums["nll_sum"], questions), "questions": int(questions),
                                 "tokens": int(questions), "accuracy": ratio("correct", "questions")}
        out["error"] = 1.0 - out["accuracy"]
        out["oov_questions"] = int(sums["oov_questions"])
        out["oov_accuracy"] = ratio("oov_correct", "oov_questions")
        for answer_class in ANSWER_CLASSES:
            out[f"{answer_class}_questions"] = int(sums[f"{answer_class}_questions"])
            out[f"{answer_class}_accuracy"] = ratio(f"{answer_class}_correct", f"{answer_class}_questions")
        out.update({f"sum_{k}": sums[k] for k in KEYS})
        return out
