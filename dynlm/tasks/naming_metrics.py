"""The naming task's metrics (Allamanis et al., 2015, section 5): F1 over subtokens, exact match,
neologisms and the suggestion-frequency curve.

Per function the model gives ranked suggestions (subtoken tuples with log-probabilities) and
the log-probability of the true name. :class:`NamingMetrics` keeps only fixed-size sums, so the
DDP ranks all-reduce :meth:`NamingMetrics.as_tensor` with SUM and :meth:`compute` turns them into:

* ``loss`` (mean −log p(true name) per function, nats), ``ppl`` = exp(loss), ``functions``
  (and ``tokens``, the same count: what the training loop checks for an empty split);
* ``exact_at_1`` / ``exact_at_5``: the fraction of functions whose true name is the top
  suggestion / among the top 5;
* ``precision_at_1``, ``recall_at_1``, ``f1_at_1``: of the top suggestion's subtokens against the
  true name's, as multisets (precision = |common| / |suggested|, recall = |common| / |true|,
  F1 = 2PR / (P + R); all 0 for a function without suggestions), averaged over the functions;
  ``f1_at_5``: the best F1 among the top 5; ``f1_error`` = 1 − f1_at_1 (the task's primary
  metric, lower is better);
* ``neologisms_suggested``: top-1 suggestions that are not a training name (counts);
  ``neologisms_correct``: those that are exactly the true name;
* the suggestion-frequency curve: the model abstains when its top-1 probability is below a
  threshold. For each of the :data:`THRESHOLDS` (index ``i``): ``curve{i}_suggested`` (the fraction
  of functions where it suggests), ``curve{i}_f1_at_1``, ``curve{i}_exact_at_1``,
  ``curve{i}_exact_at_5`` (means over those functions; NaN when there are none);
* the same for the functions whose name is not a dunder (``__init__``, ``__eq__``: names Python
  dictates, which are easy to guess and which a user never asks for): ``non_dunder_functions``,
  ``non_dunder_f1_at_1``, ``non_dunder_exact_at_1``, ``non_dunder_f1_at_5``,
  ``non_dunder_exact_at_5`` (means over those functions) and their curve,
  ``curve{i}_non_dunder_suggested`` (the fraction of them where it suggests),
  ``curve{i}_non_dunder_f1_at_1``, ``curve{i}_non_dunder_exact_at_1``;
* the raw sums, ``sum_<total>`` and ``curve{i}_sum_<field>``, from which :meth:`from_metrics`
  rebuilds the accumulator exactly.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Container, Sequence

import torch

from dynlm.metrics import perplexity

THRESHOLDS: tuple[float, ...] = tuple(i / 20 for i in range(20))  # top-1 probability: 0.0, 0.05, ..., 0.95
NON_DUNDER = "non_dunder_"  # the prefix of the sums over the functions whose name is not a dunder
NON_DUNDER_TOTALS = ("functions", "exact_at_1", "exact_at_5", "f1_at_1", "f1_at_5")
NON_DUNDER_CURVE = ("suggested", "f1_at_1", "exact_at_1")
TOTALS = ("nll_sum", "functions", "exact_at_1", "exact_at_5", "precision_at_1", "recall_at_1", "f1_at_1", "f1_at_5",
          "neologisms_suggested", "neologisms_correct", *(NON_DUNDER + k for k in NON_DUNDER_TOTALS))
CURVE_FIELDS = ("suggested", "f1_at_1", "exact_at_1", "exact_at_5", *(NON_DUNDER + k for k in NON_DUNDER_CURVE))
_COUNTS = {"functions", "exact_at_1", "exact_at_5", "neologisms_suggested", "neologisms_correct", "suggested",
           *(NON_DUNDER + k for k in ("functions", "exact_at_1", "exact_at_5", "suggested"))}


def subtoken_scores(suggested: tuple[str, ...], truth: tuple[str, ...]) -> tuple[float, float, float]:
    """``(precision, recall, F1)`` of a suggested name's subtokens against the true name's (multisets)."""
    common = sum((Counter(suggested) & Counter(truth)).values())
    if common == 0:
        return 0.0, 0.0, 0.0
    precision, recall = common / len(suggested), common / len(truth)
    return precision, recall, 2 * precision * recall / (precision + recall)


class NamingMetrics:
    """Sums over functions of the metrics in the module docstring (all-reduce :meth:`as_tensor` with SUM)."""

    def __init__(self):
        self.totals = dict.fromkeys(TOTALS, 0.0)
        self.curve_sums = [dict.fromkeys(CURVE_FIELDS, 0.0) for _ in THRESHOLDS]

    def update(self, suggestions: list[list[tuple[tuple[str, ...], float]]], truths: list[tuple[str, ...]],
               log_probs: list[float], known_names: Container[tuple[str, ...]], *, dunders: Sequence[bool]) -> None:
        """Add a batch of functions.

        Args:
            suggestions: per function its ranked suggestions ``(subtokens, log p)``, best first
                (may be empty).
            truths: per function the true name's subtokens.
            log_probs: per function the model's log p(true name).
            known_names: the training names (a suggestion outside them is a neologism).
            dunders: per function whether its name is a dunder
                (:func:`dynlm.data.python_functions.is_dunder`; the truths' subtokens no longer
                tell): the others are also summed apart (``non_dunder_*``).
        """
        if not len(suggestions) == len(truths) == len(log_probs) == len(dunders):
            raise ValueError(f"NamingMetrics.update: {len(suggestions)} suggestion lists, {len(truths)} truths, "
                             f"{len(log_probs)} log-probs and {len(dunders)} dunder flags (one each per function)")
        totals = self.totals
        for ranked, truth, log_prob, dunder in zip(suggestions, truths, log_probs, dunders):
            truth = tuple(truth)
            totals["nll_sum"] += -float(log_prob)
            totals["functions"] += 1
            totals[NON_DUNDER + "functions"] += 0.0 if dunder else 1.0
            if not ranked:
                continue
            top = tuple(ranked[0][0])
            exact_1 = float(top == truth)
            exact_5 = float(any(tuple(name) == truth for name, _ in ranked[:5]))
            precision, recall, f1 = subtoken_scores(top, truth)
            totals["exact_at_1"] += exact_1
            totals["exact_at_5"] += exact_5
            totals["precision_at_1"] += precision
            totals["recall_at_1"] += recall
            totals["f1_at_1"] += f1
            f1_5 = max(subtoken_scores(tuple(name), truth)[2] for name, _ in ranked[:5])
            totals["f1_at_5"] += f1_5
            if not dunder:
                for key, value in (("exact_at_1", exact_1), ("exact_at_5", exact_5), ("f1_at_1", f1), ("f1_at_5", f1_5)):
                    totals[NON_DUNDER + key] += value
            if top not in known_names:
                totals["neologisms_suggested"] += 1
                totals["neologisms_correct"] += exact_1
            top_prob = math.exp(ranked[0][1])
            for threshold, sums in zip(THRESHOLDS, self.curve_sums):
                if top_prob >= threshold:
                    sums["suggested"] += 1
                    sums["f1_at_1"] += f1
                    sums["exact_at_1"] += exact_1
                    sums["exact_at_5"] += exact_5
                    if not dunder:
                        sums[NON_DUNDER + "suggested"] += 1
                        sums[NON_DUNDER + "f1_at_1"] += f1
                        sums[NON_DUNDER + "exact_at_1"] += exact_1

    def merge(self, other: "NamingMetrics") -> "NamingMetrics":
        for key in TOTALS:
            self.totals[key] += other.totals[key]
        for mine, theirs in zip(self.curve_sums, other.curve_sums):
            for key in CURVE_FIELDS:
                mine[key] += theirs[key]
        return self

    def as_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[len(TOTALS) + len(THRESHOLDS) * len(CURVE_FIELDS)]`` float64: the totals, then the curve row by row."""
        values = [self.totals[k] for k in TOTALS] + [sums[k] for sums in self.curve_sums for k in CURVE_FIELDS]
        return torch.tensor(values, dtype=torch.float64, device=device)

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> "NamingMetrics":
        values = values.detach().cpu().tolist()
        expected = len(TOTALS) + len(THRESHOLDS) * len(CURVE_FIELDS)
        if len(values) != expected:
            raise ValueError(f"NamingMetrics.from_tensor: expected {expected} values, got {len(values)}")
        metrics = cls()
        metrics.totals = dict(zip(TOTALS, values[: len(TOTALS)]))
        rest = values[len(TOTALS):]
        metrics.curve_sums = [dict(zip(CURVE_FIELDS, rest[i * len(CURVE_FIELDS) : (i + 1) * len(CURVE_FIELDS)]))
                              for i in range(len(THRESHOLDS))]
        metrics._round_counts()
        return metrics

    @classmethod
    def from_metrics(cls, metrics: dict) -> "NamingMetrics":
        """The accumulator whose :meth:`compute` gave ``metrics`` (its ``sum_*`` / ``curve{i}_sum_*`` keys)."""
        accumulator = cls()
        accumulator.totals = {k: float(metrics[f"sum_{k}"]) for k in TOTALS}
        accumulator.curve_sums = [{k: float(metrics[f"curve{i}_sum_{k}"]) for k in CURVE_FIELDS}
                                  for i in range(len(THRESHOLDS))]
        return accumulator

    def _round_counts(self) -> None:  # counts travel as float64 sums: make them whole again
        for sums in (self.totals, *self.curve_sums):
            for key in sums:
                if key in _COUNTS:
                    sums[key] = float(round(sums[key]))

    def curve(self) -> list[dict]:
        """The suggestion-frequency curve, one dict per threshold: ``threshold``,
        ``suggestion_frequency`` (fraction of functions with a suggestion), ``f1_at_1``,
        ``exact_at_1``, ``exact_at_5`` (means over the functions where it suggests; NaN if none);
        the same of the non-dunder functions: ``non_dunder_suggestion_frequency``,
        ``non_dunder_f1_at_1``, ``non_dunder_exact_at_1``."""
        functions, plain = self.totals["functions"], self.totals[NON_DUNDER + "functions"]
        rows = []
        for threshold, sums in zip(THRESHOLDS, self.curve_sums):
            suggested, plain_suggested = sums["suggested"], sums[NON_DUNDER + "suggested"]
            rows.append({"threshold": threshold, "suggestion_frequency": suggested / functions if functions else math.nan,
                         **{k: sums[k] / suggested if suggested else math.nan for k in ("f1_at_1", "exact_at_1", "exact_at_5")},
                         NON_DUNDER + "suggestion_frequency": plain_suggested / plain if plain else math.nan,
                         **{NON_DUNDER + k: sums[NON_DUNDER + k] / plain_suggested if plain_suggested else math.nan
                            for k in ("f1_at_1", "exact_at_1")}})
        return rows

    def compute(self) -> dict[str, float]:
        """The metrics dict of the module docstring."""
        totals, functions = self.totals, self.totals["functions"]

        def mean(key: str) -> float:
            return totals[key] / functions if functions else math.nan

        out: dict[str, float] = {"loss": mean("nll_sum"), "ppl": perplexity(totals["nll_sum"], functions),
                                 "functions": int(functions), "tokens": int(functions)}
        for key in ("exact_at_1", "exact_at_5", "precision_at_1", "recall_at_1", "f1_at_1", "f1_at_5"):
            out[key] = mean(key)
        out["f1_error"] = 1.0 - out["f1_at_1"]
        plain = totals[NON_DUNDER + "functions"]
        out[NON_DUNDER + "functions"] = int(plain)
        for key in NON_DUNDER_TOTALS[1:]:
            out[NON_DUNDER + key] = totals[NON_DUNDER + key] / plain if plain else math.nan
        out["neologisms_suggested"] = int(totals["neologisms_suggested"])
        out["neologisms_correct"] = int(totals["neologisms_correct"])
        for i, row in enumerate(self.curve()):
            out[f"curve{i}_suggested"] = row["suggestion_frequency"]
            for key in ("f1_at_1", "exact_at_1", "exact_at_5", NON_DUNDER + "f1_at_1", NON_DUNDER + "exact_at_1"):
                out[f"curve{i}_{key}"] = row[key]
            out[f"curve{i}_{NON_DUNDER}suggested"] = row[NON_DUNDER + "suggestion_frequency"]
        out.update({f"sum_{k}": totals[k] for k in TOTALS})
        for i, sums in enumerate(self.curve_sums):
            out.update({f"curve{i}_sum_{k}": sums[k] for k in CURVE_FIELDS})
        return out
