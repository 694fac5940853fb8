"""The figures of a training run: its learning curve and the task's figures of its best epoch.

``pipelines/tracking.py: finish_training_run`` logs them with the MLflow run
(``learning_curve.png``, and for the LM task ``accumulation.png``). matplotlib is imported
inside the functions, so ``dynlm`` stays importable without drawing.
"""

from __future__ import annotations

import math
from typing import Any


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed; figures go to files or MLflow)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_learning_curve(history: list[dict[str, Any]]):
    """A figure of every perplexity in ``history`` (one dict per epoch) against the epoch.

    Left panel: ``*ppl`` keys (train/valid perplexity); right: the other ``*ppl_*`` keys
    (first mention, re-appearing, after entity, OOV). Log-scale y. Returns the Matplotlib
    figure (log it with ``pipelines.tracking.log_figure``, or ``savefig`` it).
    """
    plt = pyplot()
    if not history:
        raise ValueError("plot_learning_curve: empty history (no epoch finished)")
    epochs = [row["epoch"] if "epoch" in row else i for i, row in enumerate(history)]
    keys = sorted({k for row in history for k, v in row.items()
                   if "ppl" in k and isinstance(v, (int, float)) and not isinstance(v, bool)})
    overall = [k for k in keys if k.endswith("ppl")]
    detailed = [k for k in keys if not k.endswith("ppl")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for axis, group, title in ((axes[0], overall, "perplexity"), (axes[1], detailed, "by token kind")):
        for key in group:
            points = [(e, row[key]) for e, row in zip(epochs, history)
                      if key in row and math.isfinite(row[key]) and row[key] > 0]
            if points:
                axis.plot(*zip(*points), marker="o", label=key)
        axis.set_yscale("log")
        axis.set_xlabel("epoch")
        axis.set_title(title)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    fig.tight_layout()
    return fig


def best_epoch_figures(history: list[dict[str, Any]], task: str = "lm") -> dict:
    """The task's figures of the validation metrics of the best epoch (lowest ``valid_objective``;
    ``valid_ppl`` in histories written before the objective was task-named).

    For the LM task: the DNTM paper's accumulation analysis, ``accumulation.png``.

    Returns:
        ``{file name: matplotlib Figure}``; empty when no epoch has an objective or the
        history lacks the task's validation metrics (a hand-written one).
    """
    from dynlm.tasks import get_task

    key = "valid_objective" if any("valid_objective" in row for row in history) else "valid_ppl"
    if not any(key in row for row in history):
        return {}
    best_epoch = min(history, key=lambda row: row.get(key, math.inf))
    metrics = {key[len("valid_"):]: value for key, value in best_epoch.items() if key.startswith("valid_")}
    try:
        return get_task(task).metric_figures(metrics, f"validation, epoch {best_epoch.get('epoch')}")
    except KeyError:
        return {}
