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


def plot_learning_curve(history: list[dict[str, Any]], title: str | None = None):
    """A figure of every perplexity in ``history`` (one dict per epoch) against the epoch.

    Panels: the ``*ppl`` keys (train/valid perplexity); the other ``*ppl_*`` keys (first mention,
    re-appearing, after entity); and, when the history has it, OOV perplexity on its own (orders
    of magnitude above the rest, it would flatten them). Log-scale y with plain tick labels
    (``40``, not ``4×10¹``), whole epochs on x. ``title``: the run and model it shows. Returns the
    Matplotlib figure (log it with ``pipelines.tracking.log_figure``, or ``savefig`` it).
    """
    from matplotlib.ticker import LogFormatter, MaxNLocator

    plt = pyplot()
    if not history:
        raise ValueError("plot_learning_curve: empty history (no epoch finished)")
    epochs = [row["epoch"] if "epoch" in row else i for i, row in enumerate(history)]
    keys = sorted({k for row in history for k, v in row.items()
                   if "ppl" in k and isinstance(v, (int, float)) and not isinstance(v, bool)})
    overall = [k for k in keys if k.endswith("ppl")]
    oov = [k for k in keys if not k.endswith("ppl") and k.endswith("_oov")]
    detailed = [k for k in keys if not k.endswith("ppl") and k not in oov]
    panels = [(overall, "perplexity"), (detailed, "by token kind")] + ([(oov, "off the short list (OOV)")] if oov else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for axis, (group, panel_title) in zip(axes[0], panels):
        for key in group:
            points = [(e, row[key]) for e, row in zip(epochs, history)
                      if key in row and math.isfinite(row[key]) and row[key] > 0]
            if points:
                axis.plot(*zip(*points), marker="o", label=key)
        axis.set_yscale("log")
        axis.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
        axis.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.4)))
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_xlabel("epoch")
        axis.set_title(panel_title)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
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
