"""The paper metrics: perplexity over all tokens, entity first mentions, re-appearing entity
mentions, tokens after an entity mention, out-of-short-list words, and the accumulation analysis
(re-appearing entity mentions by how often their entity was mentioned before: 1, 2, 3-5, 6+;
Kobayashi et al., 2017, the ``KIND_REAPPEAR_*`` flags of :mod:`dynlm.data.batching`).

Everything is kept as sums of NLL (nats) and token counts so batches and DDP workers
aggregate exactly: all-reduce :meth:`MetricAccumulator.as_tensor` and rebuild with
:meth:`MetricAccumulator.from_tensor`, or add accumulators with :meth:`merge`.
"""

from __future__ import annotations

import math

import torch

from dynlm.data.batching import (
    KIND_AFTER_ENTITY,
    KIND_FIRST_MENTION,
    KIND_OOV,
    KIND_REAPPEAR,
    KIND_REAPPEAR_1,
    KIND_REAPPEAR_2,
    KIND_REAPPEAR_3_5,
    KIND_REAPPEAR_6_PLUS,
)
from dynlm.losses import token_nll

# name -> KIND_* bit (None: all tokens)
CATEGORIES: dict[str, int | None] = {
    "all": None,
    "first_mention": KIND_FIRST_MENTION,
    "reappearing": KIND_REAPPEAR,
    "after_entity": KIND_AFTER_ENTITY,
    "oov": KIND_OOV,
    "reappearing_1": KIND_REAPPEAR_1,  # the entity was mentioned once before in the document
    "reappearing_2": KIND_REAPPEAR_2,
    "reappearing_3_5": KIND_REAPPEAR_3_5,
    "reappearing_6_plus": KIND_REAPPEAR_6_PLUS,
}


def perplexity(nll_sum: float, count: float) -> float:
    """``exp(nll_sum / count)``; NaN when there are no tokens, inf on overflow."""
    if count <= 0:
        return float("nan")
    mean = nll_sum / count
    return math.exp(mean) if mean < 700 else float("inf")


class MetricAccumulator:
    """Sums of NLL and counts per category.

    Attributes:
        nll_sum: ``{category: float}`` summed NLL in nats.
        count: ``{category: int}`` number of target tokens.
    """

    def __init__(self):
        self.nll_sum = {name: 0.0 for name in CATEGORIES}
        self.count = {name: 0 for name in CATEGORIES}

    def update_from_nll(self, nll: torch.Tensor, batch) -> None:
        """Add per-token NLL ``[B, L]`` (any value at padding) of a ``SentenceBatch``."""
        nll = nll.detach().double()
        mask = batch.mask.to(nll.device)
        kind = batch.target_kind.to(nll.device)
        sums, counts = [], []
        for bit in CATEGORIES.values():
            selected = mask if bit is None else mask & ((kind & bit) != 0)
            sums.append(torch.where(selected, nll, torch.zeros_like(nll)).sum())
            counts.append(selected.sum().double())
        values = torch.stack(sums + counts).cpu().tolist()  # one device sync per sentence
        for i, name in enumerate(CATEGORIES):
            self.nll_sum[name] += values[i]
            self.count[name] += int(values[len(CATEGORIES) + i])

    def update(self, logits: torch.Tensor, batch, positions: torch.Tensor | None = None) -> None:
        """Add the NLL of ``logits [B, L, V]`` (or ``[N, V]`` at ``positions``, as in
        ``LMOutput``) against ``batch.targets``."""
        device = logits.device
        self.update_from_nll(token_nll(logits, batch.targets.to(device), batch.mask.to(device), positions), batch)

    def merge(self, other: "MetricAccumulator") -> "MetricAccumulator":
        for name in CATEGORIES:
            self.nll_sum[name] += other.nll_sum[name]
            self.count[name] += other.count[name]
        return self

    def as_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[2 * len(CATEGORIES)]`` float64: NLL sums then counts (all-reduce with SUM)."""
        return torch.tensor(
            [self.nll_sum[n] for n in CATEGORIES] + [float(self.count[n]) for n in CATEGORIES],
            dtype=torch.float64,
            device=device,
        )

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> "MetricAccumulator":
        acc = cls()
        values = values.detach().cpu().tolist()
        if len(values) != 2 * len(CATEGORIES):
            raise ValueError(f"MetricAccumulator.from_tensor: expected {2 * len(CATEGORIES)} values, got {len(values)}")
        for i, name in enumerate(CATEGORIES):
            acc.nll_sum[name] = values[i]
            acc.count[name] = int(round(values[len(CATEGORIES) + i]))
        return acc

    @classmethod
    def from_metrics(cls, metrics: dict) -> "MetricAccumulator":
        """The accumulator whose :meth:`compute` gave ``metrics`` (its ``nll_sum_*`` / ``count_*``)."""
        acc = cls()
        for name in CATEGORIES:
            acc.nll_sum[name] = float(metrics[f"nll_sum_{name}"])
            acc.count[name] = int(metrics[f"count_{name}"])
        return acc

    def compute(self) -> dict[str, float]:
        """Metrics dict.

        Returns:
            ``loss`` (mean NLL), ``ppl``, ``ppl_first_mention``, ``ppl_reappearing``,
            ``ppl_after_entity``, ``ppl_oov``, ``ppl_reappearing_1`` / ``_2`` / ``_3_5`` /
            ``_6_plus`` (NaN when a category is empty), ``tokens``,
            and the raw ``nll_sum_<category>`` / ``count_<category>`` values.
        """
        out: dict[str, float] = {}
        total = self.count["all"]
        out["loss"] = self.nll_sum["all"] / total if total else float("nan")
        out["ppl"] = perplexity(self.nll_sum["all"], total)
        for name in CATEGORIES:
            if name != "all":
                out[f"ppl_{name}"] = perplexity(self.nll_sum[name], self.count[name])
        out["tokens"] = total
        for name in CATEGORIES:
            out[f"nll_sum_{name}"] = self.nll_sum[name]
            out[f"count_{name}"] = self.count[name]
        return out


class NllSums:
    """The metrics of a task whose one figure is the likelihood of its targets: a NLL sum (nats)
    and a target count (the ``metrics`` class of :class:`dynlm.tasks.Task`; all-reduce
    :meth:`as_tensor` with SUM). ``compute`` gives ``loss`` (mean NLL), ``ppl``, ``tokens`` and
    the raw sums ``nll_sum_all`` / ``count_all``; a subclass may add figures in ``compute``."""

    def __init__(self, nll_sum: float = 0.0, count: int = 0):
        self.nll_sum, self.count = nll_sum, count

    @classmethod
    def from_nll(cls, nll_sum: float, count: int) -> "NllSums":
        return cls(nll_sum, count)

    def merge(self, other: "NllSums") -> "NllSums":
        self.nll_sum, self.count = self.nll_sum + other.nll_sum, self.count + other.count
        return self

    def as_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[2]`` float64: the NLL sum and the count."""
        return torch.tensor([self.nll_sum, float(self.count)], dtype=torch.float64, device=device)

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> "NllSums":
        nll_sum, count = values.detach().cpu().tolist()
        return cls(nll_sum, int(round(count)))

    @classmethod
    def from_metrics(cls, metrics: dict) -> "NllSums":
        """The sums whose :meth:`compute` gave ``metrics``."""
        return cls(float(metrics["nll_sum_all"]), int(metrics["count_all"]))

    def compute(self) -> dict[str, float]:
        return {"loss": self.nll_sum / self.count if self.count else math.nan, "ppl": perplexity(self.nll_sum, self.count),
                "tokens": self.count, "nll_sum_all": self.nll_sum, "count_all": self.count}
