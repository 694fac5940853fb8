"""The LM task's evaluation table (what ``dynlm evaluate`` prints): perplexity per token category.

Rows: all tokens, first mentions, re-appearing entity mentions and, indented under them, the
accumulation analysis of Kobayashi et al. (2017): re-appearing mentions by how many times their
entity was mentioned before in the document (1, 2, 3-5, 6+), then tokens after an entity and
off-short-list words. Imports nothing heavy (the CLI formats tables without loading torch).
"""

from __future__ import annotations

import math

# (category, label) of the accumulation analysis, in the order of its rows and plot bars
MENTION_BIN_LABELS: tuple[tuple[str, str], ...] = (
    ("reappearing_1", "1"),
    ("reappearing_2", "2"),
    ("reappearing_3_5", "3-5"),
    ("reappearing_6_plus", "6+"),
)

ROWS: tuple[tuple[str, str], ...] = (  # (category of dynlm.metrics.CATEGORIES, label)
    ("all", "all tokens"),
    ("first_mention", "first mention"),
    ("reappearing", "re-appearing entity"),
    *((category, f"  {label} earlier mention{'' if label == '1' else 's'}") for category, label in MENTION_BIN_LABELS),
    ("after_entity", "after an entity"),
    ("oov", "off the short list (OOV)"),
)


def _metric_key(category: str) -> str:
    return "ppl" if category == "all" else f"ppl_{category}"


def format_metrics_table(metrics: dict, title: str) -> str:
    """The paper's table: perplexity per token category with its token count.

    Args:
        metrics: :func:`dynlm.training.evaluate`'s dict (``ppl_<category>`` and ``count_<category>``).
        title: the first line (model and data).

    Returns:
        The table, one line per row of :data:`ROWS` ("n/a" for an empty category).
    """
    lines = [title, f"  {'tokens':<28}{'count':>10}{'perplexity':>14}"]
    for category, label in ROWS:
        value = metrics[_metric_key(category)]
        shown = "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"
        lines.append(f"  {label:<28}{int(metrics[f'count_{category}']):>10}{shown:>14}")
    return "\n".join(lines)
