"""The accumulation analysis as a bar chart (logged with the MLflow run as ``accumulation.png``).

matplotlib is imported inside the function (``dynlm`` stays importable without drawing), and
the figure is a ``matplotlib.figure.Figure`` built without pyplot: no global figure state, no
display backend, nothing to close.
"""

from __future__ import annotations

import math

from dynlm.tasks.lm_table import MENTION_BIN_LABELS


def accumulation_figure(metrics: dict, title: str):
    """Perplexity of re-appearing entity tokens by earlier mentions of their entity (1, 2, 3-5, 6+).

    Args:
        metrics: :func:`dynlm.training.evaluate`'s dict (``ppl_reappearing_*``, ``count_reappearing_*``).
        title: the figure title (model and data).

    Returns:
        A ``matplotlib.figure.Figure``: one bar per bin (height = perplexity, 0 and "n/a" for an
        empty bin), each labelled with its token count; a dashed line at the first-mention perplexity.
    """
    from matplotlib.figure import Figure

    labels = [label for _, label in MENTION_BIN_LABELS]
    values = [metrics[f"ppl_{category}"] for category, _ in MENTION_BIN_LABELS]
    counts = [int(metrics[f"count_{category}"]) for category, _ in MENTION_BIN_LABELS]
    heights = [0.0 if math.isnan(v) else v for v in values]
    figure = Figure(figsize=(5.0, 3.5), layout="constrained")
    axes = figure.subplots()
    bars = axes.bar(labels, heights, color="tab:blue")
    axes.bar_label(bars, labels=[f"n={c}" if c else "n/a" for c in counts], padding=2)
    first = metrics["ppl_first_mention"]
    if not math.isnan(first):
        axes.axhline(first, color="tab:gray", linestyle="--", label=f"first mention ({first:.1f})")
        axes.legend(loc="upper right")
    axes.set_xlabel("earlier mentions of the entity in the document")
    axes.set_ylabel("perplexity of the re-appearing mention")
    axes.set_title(title, fontsize="medium")
    return figure
