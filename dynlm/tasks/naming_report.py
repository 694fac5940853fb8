"""What the naming task shows: its prepare counts, its evaluation table and its figure.

* :func:`naming_counts`: the manifest counts of a prepare (files, functions and name types per
  split, quarantined files, dropped functions: all, and the dunders and overrides that
  ``data.targets: paper`` leaves out of the targets, the share of valid/test names never seen as a
  train name, vocabulary sizes) and :func:`summary_rows`, the prepare table's rows;
* :func:`format_naming_table`: ``dynlm evaluate``'s table of :class:`NamingMetrics` (F1 and exact
  match at 1 and 5, neologisms, a few rows of the suggestion-frequency curve; the same for the
  non-dunder functions alone);
* :func:`suggestion_summary` / :func:`format_suggestion_summary`: F1@1 and exact@1 of the top
  suggestions ``dynlm suggest-name`` made for existing functions, all and non-dunder;
* :func:`suggestion_frequency_figure`: F1@1 and exact@1 (and the non-dunder F1@1) against the suggestion frequency
  (``suggestion_frequency.png``; matplotlib imported inside, no pyplot).
"""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc

from dynlm.data.subtokens import split_subtokens
from dynlm.tasks.naming_data import DUNDER_REASON, OVERRIDE_REASON, name_key
from dynlm.tasks.naming_metrics import THRESHOLDS

SPLITS = ("train", "valid", "test")
CURVE_ROWS = (0, 5, 10, 15, 19)  # indices of THRESHOLDS shown in the table: p >= 0, .25, .5, .75, .95


def naming_counts(meta: pa.Table, vocab) -> dict:
    """Counts of a prepare from its parsed records (``meta``: no payload columns) and vocabulary."""
    kinds = meta["kind"].to_numpy(zero_copy_only=False)
    dropped_reasons = [reason.split(":", 1)[0] for reason in meta.filter(pc.equal(meta["kind"], "dropped"))["reason"].to_pylist()]
    documents = meta.filter(pc.equal(meta["kind"], "document")).select(["split", "input_file", "name"]).to_pylist()
    names = {split: {name_key(split_subtokens(row["name"])) for row in documents if row["split"] == split}
             for split in SPLITS}
    files = {split: len({row["input_file"] for row in documents if row["split"] == split}) for split in SPLITS}

    def unseen(split: str) -> float:
        rows = [name_key(split_subtokens(r["name"])) for r in documents if r["split"] == split]
        return sum(name not in names["train"] for name in rows) / len(rows) if rows else math.nan

    return {"files": files, "name_types": {split: len(names[split]) for split in SPLITS},
            "quarantined_files": int((kinds == "quarantine").sum()), "dropped_functions": int((kinds == "dropped").sum()),
            "dropped_dunders": dropped_reasons.count(DUNDER_REASON), "dropped_overrides": dropped_reasons.count(OVERRIDE_REASON),
            "valid_names_unseen": unseen("valid"), "test_names_unseen": unseen("test"),
            "vocab_names": len(vocab.names), "vocab_subtokens": len(vocab.subtokens),
            "vocab_features": len(vocab.features), "vocab_context_tokens": len(vocab.context_tokens)}


def summary_rows(counts: dict) -> list[tuple[str, str]]:
    """The prepare table's rows below the per-split counts (``documents`` are functions)."""
    def share(value: float) -> str:
        return "n/a" if math.isnan(value) else f"{value:.3f}"

    return [("quarantined files", f"{counts['quarantined_files']:,d}"),
            ("dropped functions (no subtoken)",
             f"{counts['dropped_functions'] - counts['dropped_dunders'] - counts['dropped_overrides']:,d}"),
            ("dropped dunders/overrides", f"{counts['dropped_dunders']:,d}/{counts['dropped_overrides']:,d}"),
            ("valid functions, name unseen", share(counts["valid_names_unseen"])),
            ("test functions, name unseen", share(counts["test_names_unseen"])),
            ("vocab names/subtokens", f"{counts['vocab_names']:,d}/{counts['vocab_subtokens']:,d}"),
            ("vocab features/context", f"{counts['vocab_features']:,d}/{counts['vocab_context_tokens']:,d}")]


def _shown(value: float, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def format_naming_table(metrics: dict, title: str) -> str:
    """The evaluation table of :meth:`NamingMetrics.compute`'s dict."""
    rows = [("functions", f"{int(metrics['functions']):,d}"), ("F1@1 (subtokens)", _shown(metrics["f1_at_1"])),
            ("F1@5 (best of 5)", _shown(metrics["f1_at_5"])), ("precision@1", _shown(metrics["precision_at_1"])),
            ("recall@1", _shown(metrics["recall_at_1"])), ("exact@1", _shown(metrics["exact_at_1"])),
            ("exact@5", _shown(metrics["exact_at_5"])),
            ("neologisms suggested", f"{int(metrics['neologisms_suggested']):,d}"),
            ("neologisms correct", f"{int(metrics['neologisms_correct']):,d}"),
            ("perplexity per name", _shown(metrics["ppl"], 2)),
            ("non-dunder functions", f"{int(metrics['non_dunder_functions']):,d}"),
            ("non-dunder F1@1", _shown(metrics["non_dunder_f1_at_1"])),
            ("non-dunder F1@5", _shown(metrics["non_dunder_f1_at_5"])),
            ("non-dunder exact@1", _shown(metrics["non_dunder_exact_at_1"])),
            ("non-dunder exact@5", _shown(metrics["non_dunder_exact_at_5"]))]
    lines = [title, *(f"  {label:<26}{value:>12}" for label, value in rows),
             "  suggestion-frequency curve (suggest only when the top name's p >= threshold)",
             f"  {'threshold':>12}{'suggested':>12}{'F1@1':>10}{'exact@1':>10}{'exact@5':>10}"]
    for i in CURVE_ROWS:
        lines.append(f"  {THRESHOLDS[i]:>12.2f}{_shown(metrics[f'curve{i}_suggested']):>12}"
                     f"{_shown(metrics[f'curve{i}_f1_at_1']):>10}{_shown(metrics[f'curve{i}_exact_at_1']):>10}"
                     f"{_shown(metrics[f'curve{i}_exact_at_5']):>10}")
    lines += ["  the same curve, non-dunder functions only (__init__, __eq__... left out)",
              f"  {'threshold':>12}{'suggested':>12}{'F1@1':>10}{'exact@1':>10}"]
    for i in CURVE_ROWS:
        lines.append(f"  {THRESHOLDS[i]:>12.2f}{_shown(metrics[f'curve{i}_non_dunder_suggested']):>12}"
                     f"{_shown(metrics[f'curve{i}_non_dunder_f1_at_1']):>10}"
                     f"{_shown(metrics[f'curve{i}_non_dunder_exact_at_1']):>10}")
    return "\n".join(lines)


def suggestion_summary(functions: list[dict]) -> dict:
    """``{"functions", "f1_at_1", "exact_at_1"}`` of every function and the same keys prefixed
    ``non_dunder_`` of the non-dunder ones (means; NaN over no function), from the
    ``f1_at_1`` / ``exact_at_1`` / ``dunder`` of :meth:`dynlm.tasks.naming.NamingTask.suggest_source`'s dicts."""
    out: dict = {}
    for prefix, chosen in (("", functions), ("non_dunder_", [f for f in functions if not f["dunder"]])):
        out[prefix + "functions"] = len(chosen)
        for key in ("f1_at_1", "exact_at_1"):
            out[prefix + key] = sum(f[key] for f in chosen) / len(chosen) if chosen else math.nan
    return out


def format_suggestion_summary(summary: dict) -> str:
    """:func:`suggestion_summary` as a few lines: one row for all functions, one for the non-dunder ones."""
    lines = [f"top suggestion vs the actual names  {'functions':>10}{'F1@1':>8}{'exact@1':>9}"]
    for label, prefix in (("all functions", ""), ("non-dunder functions", "non_dunder_")):
        lines.append(f"  {label:<34}{summary[prefix + 'functions']:>10,d}{_shown(summary[prefix + 'f1_at_1']):>8}"
                     f"{_shown(summary[prefix + 'exact_at_1']):>9}")
    return "\n".join(lines)


def suggestion_frequency_figure(metrics: dict, title: str):
    """F1@1 and exact@1 of the functions the model suggests for, against the fraction it
    suggests for (one point per threshold of :data:`THRESHOLDS`), as in the paper's figures.

    Returns:
        A ``matplotlib.figure.Figure`` (no pyplot state).
    """
    from matplotlib.figure import Figure

    points = [(metrics[f"curve{i}_suggested"], metrics[f"curve{i}_f1_at_1"], metrics[f"curve{i}_exact_at_1"])
              for i in range(len(THRESHOLDS))]
    points = [p for p in points if not any(math.isnan(v) for v in p)]
    figure = Figure(figsize=(5.0, 3.5), layout="constrained")
    axes = figure.subplots()
    axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label="F1@1")
    axes.plot([p[0] for p in points], [p[2] for p in points], marker="s", label="exact@1")
    plain = [(metrics[f"curve{i}_non_dunder_suggested"], metrics[f"curve{i}_non_dunder_f1_at_1"])
             for i in range(len(THRESHOLDS))]
    plain = [p for p in plain if not any(math.isnan(v) for v in p)]
    axes.plot([p[0] for p in plain], [p[1] for p in plain], marker="^", linestyle="--", label="F1@1, non-dunder")
    axes.set_xlim(0.0, 1.02)
    axes.set_ylim(0.0, 1.02)
    axes.set_xlabel("suggestion frequency (fraction of functions)")
    axes.set_ylabel("score where it suggests")
    axes.set_title(title, fontsize=9)
    axes.legend(loc="lower left")
    return figure
