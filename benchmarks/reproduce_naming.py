"""Reproduce the method-naming evaluation (Allamanis, Barr, Bird, Sutton, FSE 2015) on the Python standard library.

Every function and method of the running Python's standard library (test suites and installed
packages left out by the naming task's data config) is one example: predict its name from its
body. Files are split 70/15/15 by a hash of their path; three suggesters are scored on the TEST
functions, all with the same vocabularies:

* the frequency baseline: the name that co-occurred most often with the function's features in
  the train split (:class:`dynlm.models.naming_baseline.FrequencyBaseline`);
* the whole-name log-bilinear model (``type: name``), which can only suggest train names;
* the subtoken log-bilinear model (``type: subtoken``), which composes names by beam search and
  so can suggest names never seen in training (neologisms);

both LBL models at the same D (``--embed-dim``), K (``--context-size``) and k
(``--noise-samples``), trained with NCE and early stopping on the valid split's F1@1.

As in the paper, a model may abstain when its top suggestion's probability is below a threshold;
the x-axis of the figure is the suggestion frequency (the fraction of functions it suggests
for), the y-axis F1 over subtokens / exact match of the top suggestion where it suggests. The
Markdown report has the exact command, the data counts, the curve, F1@1 and exact@1/5 at 100 %
and at ~20 % suggestion frequency, neologisms, the NLL and a discussion computed from the figures.

The files are prepared by the naming task's stages in this process
(:func:`dynlm.tasks.local.prepare_in_memory`) and both LBL models are trained by the runner over
those rows (:func:`benchmarks.common.rows_run`: :func:`dynlm.runner.build_rank_run`'s model,
optimizer and batches, as ``dynlm train`` builds them).

Usage (from the repository root; default: ~2 CPU-minutes, 3-5 min wall on a shared 2-core CPU,
1 torch thread; ``--quick``: 80 files, under a minute)::

    python -m benchmarks.reproduce_naming
    python -m benchmarks.reproduce_naming --quick
    python -m benchmarks.reproduce_naming --input /path/to/python/project --output /tmp/naming.md
"""

from __future__ import annotations

import argparse
import collections
import math
import platform
import sys
import sysconfig
import time
from pathlib import Path

import torch

from benchmarks.common import REPO, RESULTS, command_line, rows_run
from dynlm.job import JobConfig
from dynlm.models.naming import UNK, NamingModelConfig
from dynlm.models.naming_baseline import FrequencyBaseline
from dynlm.tasks.local import PreparedInMemory, files_table, prepare_in_memory
from dynlm.tasks.naming import NamingTask, SuggestionReader, score_suggestions
from dynlm.tasks.naming_data import NamingDataConfig
from dynlm.tasks.naming_metrics import NamingMetrics, subtoken_scores
from dynlm.train_config import TrainConfig

QUICK_DIR = REPO / "runs" / "naming_quick"
SPLITS = ("train", "valid", "test")
# The suggesters, in the order of the tables and the figure's legend.
MODELS = (("baseline", "frequency baseline"), ("name", "whole-name LBL"), ("subtoken", "subtoken LBL"))
ANCHOR_FREQUENCY = 0.2  # the paper's headline point: F1 ≈ 60 % at 20 % suggestion frequency


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", default=sysconfig.get_paths()["stdlib"],
                        help="folder of .py files (default: this Python's standard library)")
    parser.add_argument("--output", type=Path, default=None,
                        help=f"Markdown report (default {RESULTS / 'naming_stdlib.md'}; --quick: {QUICK_DIR / 'naming.md'})")
    parser.add_argument("--figure", type=Path, default=None, help="PNG figure (default: the report's name, .png)")
    parser.add_argument("--quick", action="store_true",
                        help="80 files evenly spread over the corpus (or --max-files), at most 2 epochs, written under runs/: "
                             "a smoke run of under a minute")
    parser.add_argument("--max-files", type=int, default=0,
                        help="keep this many input files, evenly spread over the sorted list (0: all)")
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--name-vocab-size", type=int, default=10000)
    parser.add_argument("--subtoken-vocab-size", type=int, default=5000)
    parser.add_argument("--feature-vocab-size", type=int, default=50000)
    parser.add_argument("--max-features", type=int, default=64, help="features kept per function")
    parser.add_argument("--embed-dim", type=int, default=64, help="D of both LBL models")
    parser.add_argument("--context-size", type=int, default=4, help="K: context tokens each side of the name")
    parser.add_argument("--noise-samples", type=int, default=16, help="k: NCE noise draws per target")
    parser.add_argument("--subtoken-history", type=int, default=3, help="M: previous subtokens (subtoken model)")
    parser.add_argument("--beam-size", type=int, default=8)
    parser.add_argument("--max-subtokens", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--patience", type=int, default=3, help="early stopping: epochs without a better valid F1@1")
    parser.add_argument("--batch-size", type=int, default=64, help="functions per batch")
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_files = args.max_files or 80
        args.epochs = min(args.epochs, 2)
    if args.output is None:
        args.output = QUICK_DIR / "naming.md" if args.quick else RESULTS / "naming_stdlib.md"
    if args.figure is None:
        args.figure = args.output.with_suffix(".png")
    return args


# ------------------------------------------------------------------------------------- data
def data_config(args: argparse.Namespace) -> NamingDataConfig:
    return NamingDataConfig(inputs=[str(args.input)], split_seed=args.split_seed,
                            name_vocab_size=args.name_vocab_size, subtoken_vocab_size=args.subtoken_vocab_size,
                            feature_vocab_size=args.feature_vocab_size, max_features_per_function=args.max_features,
                            max_context_size=max(args.context_size, 1))


def spread(items: list[str], count: int) -> list[str]:
    """``count`` items evenly spread over ``items`` (all of them when ``count`` is 0 or more than there are)."""
    if count <= 0 or count >= len(items):
        return list(items)
    return [items[i * len(items) // count] for i in range(count)]


def prepare(task: NamingTask, args: argparse.Namespace) -> tuple[PreparedInMemory, dict]:
    """The task's prepare stages in this process; returns the prepared rows and the counts of the report."""
    cfg = data_config(args)
    all_files = cfg.input_files()
    files = spread(sorted(all_files), args.max_files)
    if not files:
        raise SystemExit(f"no .py file under {args.input} (after the data config's exclude list)")
    started = time.perf_counter()
    done = prepare_in_memory(task, files_table(files), cfg)
    seconds = time.perf_counter() - started
    splits = done.splits
    meta = done.parsed.drop_columns(list(task.payload_columns))
    summary = task.summarize(meta, task.split_stats(done.tables, done.preprocessor.spec), done.preprocessor)  # files per split, unseen names, vocab sizes
    records = meta.to_pylist()
    counts = {
        "input_files": len(all_files), "files_read": len(files), "files": summary["files"],
        "functions": {s: len(splits[s]) for s in SPLITS},
        "quarantined": [(r["doc_id"], r["line"], r["reason"]) for r in records if r["kind"] == "quarantine"],
        "dropped": summary["dropped_functions"],
        "unseen": {s: summary[f"{s}_names_unseen"] for s in ("valid", "test")},
        "vocab": {"names": summary["vocab_names"], "subtokens": summary["vocab_subtokens"],
                  "features": summary["vocab_features"], "context": summary["vocab_context_tokens"]},
        "name_unk_count": done.preprocessor.name_counts[UNK],  # train functions whose name is not in the vocabulary
        "prepare_seconds": seconds, "split_rule": done.split_rule,
    }
    for split in SPLITS:
        if not splits[split]:
            raise SystemExit(f"split {split!r} has no function: use more files (--max-files) or another --split-seed")
    return done, counts


# ---------------------------------------------------------------------------------- models
def model_config(args: argparse.Namespace, model_type: str) -> NamingModelConfig:
    return NamingModelConfig(type=model_type, embed_dim=args.embed_dim, context_size=args.context_size,
                             subtoken_history=args.subtoken_history, noise_samples=args.noise_samples, top_k=5,
                             beam_size=max(args.beam_size, 5), max_subtokens=args.max_subtokens)


def train_and_evaluate(task: NamingTask, args, spec, splits: dict[str, list[dict]], model_type: str) -> dict:
    """Train one LBL model with the runner, early stopping on valid F1@1 (best epoch's weights kept); its TEST metrics."""
    job = JobConfig(task=task.name, data=data_config(args), model=model_config(args, model_type), train=TrainConfig(
        lr=args.lr, epochs=args.epochs, batch_size=args.batch_size, grad_clip=0.0,
        early_stopping_patience=args.patience, lr_schedule="constant", seed=args.seed))
    started, cpu_started = time.perf_counter(), time.process_time()

    def on_epoch(epoch: int, record: dict) -> None:
        print(f"  {model_type:>8} epoch {epoch}: train ppl {record['train_ppl']:.1f}  valid F1@1 "
              f"{record['valid_f1_at_1']:.3f}  ({record['train_seconds']:.0f} s training)", flush=True)

    run = rows_run(job, spec, splits["train"], splits["valid"], device=args.device)
    result = run.fit(on_epoch=on_epoch)
    model = run.model
    test = task.evaluate(model, task.batches(splits["test"], spec, 256, seed=None))
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    return {**test, "seconds": seconds, "cpu_seconds": cpu_seconds,
            "best_epoch": result["best_epoch"], "epochs_run": result["epochs_run"],
            "valid_f1_at_1": result["history"][result["best_epoch"] - 1]["valid_f1_at_1"],
            "neologisms": neologisms(task, model, spec, splits["test"], args.device) if model_type == "subtoken" else None}


def neologisms(task: NamingTask, model, spec, rows: list[dict], device: str, examples: int = 10) -> dict:
    """The subtoken model's top-1 suggestions that are no train name, on ``rows``: how many, their
    mean F1 over subtokens, how many share a subtoken with the true name, how many repeat a
    subtoken (``main_main``), and the ``examples``
    most confident ones as ``(qualname, true name, suggestion, p, F1)``."""
    reader, found = SuggestionReader(spec), []
    model.eval()
    for start in range(0, len(rows), 256):
        chunk = rows[start : start + 256]
        batch = task.collate(chunk, spec)
        with torch.no_grad():
            ranked = model.suggest(batch.inputs.to(device), top_k=1)
        for row, truth, suggestions in zip(chunk, batch.truths, ranked):
            if not suggestions:
                continue
            top = reader.subtokens(suggestions[0][0], "subtoken")
            if top not in reader.known_names:
                f1 = subtoken_scores(top, tuple(truth))[2]
                found.append((row["qualname"], "_".join(truth), "_".join(top), math.exp(suggestions[0][1]), f1))
    found.sort(key=lambda item: -item[3])
    repeated = sum(any(a == b for a, b in zip(parts, parts[1:])) for parts in (f[2].split("_") for f in found))
    return {"count": len(found), "mean_f1": sum(f[4] for f in found) / len(found) if found else math.nan,
            "partly_right": sum(f[4] > 0 for f in found), "repeated": repeated, "examples": found[:examples]}


def evaluate_baseline(task: NamingTask, args, spec, splits: dict[str, list[dict]]) -> dict:
    """The frequency baseline fitted on the train split; its TEST metrics."""
    started, cpu_started = time.perf_counter(), time.process_time()
    baseline = FrequencyBaseline(spec.num_names, spec.num_features)
    baseline.fit(batch.inputs for batch in task.batches(splits["train"], spec, 1024, seed=None))
    test = score_suggestions(baseline, "name", task.batches(splits["test"], spec, 256, seed=None), top_k=5)
    top_names = collections.Counter(spec.names[ranked[0][0][0]]  # its top-1 suggestions, for the discussion
                                    for batch in task.batches(splits["test"], spec, 256, seed=None)
                                    for ranked in baseline.suggest(batch.inputs, top_k=1) if ranked)
    return {**test, "top_names": top_names.most_common(3),
            "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
            "best_epoch": 0, "epochs_run": 0, "valid_f1_at_1": math.nan, "neologisms": None}


# ---------------------------------------------------------------------------------- report
def curve(metrics: dict) -> list[dict]:
    """The suggestion-frequency curve of a metrics dict (:meth:`NamingMetrics.curve`)."""
    return NamingMetrics.from_metrics(metrics).curve()


def point_near(metrics: dict, frequency: float) -> dict:
    """The curve point whose suggestion frequency is nearest ``frequency`` (ties: the higher threshold)."""
    points = [p for p in curve(metrics) if not math.isnan(p["suggestion_frequency"])]
    return min(reversed(points), key=lambda p: abs(p["suggestion_frequency"] - frequency))


def _pct(value: float) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{100 * value:.1f}"


def results_table(results: dict[str, dict]) -> str:
    lines = ["| model | F1@1 | exact@1 | exact@5 | F1@5 | ~20 %: threshold | suggests | F1@1 | exact@1 | exact@5 "
             "| NLL / function (nats) | neologisms suggested / correct | best epoch | train+eval s |",
             "|---|" + "---:|" * 13]
    for key, title in MODELS:
        r = results[key]
        near = point_near(r, ANCHOR_FREQUENCY)
        lines.append(
            f"| {title} | {_pct(r['f1_at_1'])} | {_pct(r['exact_at_1'])} | {_pct(r['exact_at_5'])} | {_pct(r['f1_at_5'])} "
            f"| p ≥ {near['threshold']:.2f} | {_pct(near['suggestion_frequency'])} % | {_pct(near['f1_at_1'])} "
            f"| {_pct(near['exact_at_1'])} | {_pct(near['exact_at_5'])} | {r['loss']:.2f} "
            f"| {r['neologisms_suggested']} / {r['neologisms_correct']} | {r['best_epoch'] or '-'} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def curve_table(results: dict[str, dict]) -> str:
    """One row per threshold: suggestion frequency and F1@1 / exact@1 of each model."""
    header = "| top-1 p ≥ | " + " | ".join(f"{title}: suggests, F1@1, exact@1" for _, title in MODELS) + " |"
    lines = [header, "|---:|" + "---|" * len(MODELS)]
    curves = {key: curve(results[key]) for key, _ in MODELS}
    for i, point in enumerate(curves["baseline"]):
        cells = [f"{_pct(curves[k][i]['suggestion_frequency'])} %, {_pct(curves[k][i]['f1_at_1'])}, "
                 f"{_pct(curves[k][i]['exact_at_1'])}" for k, _ in MODELS]
        lines.append(f"| {point['threshold']:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(results: dict[str, dict], title: str):
    """F1@1 and exact@1 against the suggestion frequency, the three models (a matplotlib Figure, no pyplot)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.0, 4.0), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for (key, label), marker in zip(MODELS, ("s", "^", "o")):
        points = [p for p in curve(results[key]) if not math.isnan(p["f1_at_1"])]
        x = [p["suggestion_frequency"] for p in points]
        axes[0].plot(x, [p["f1_at_1"] for p in points], marker=marker, markersize=4, label=label)
        axes[1].plot(x, [p["exact_at_1"] for p in points], marker=marker, markersize=4, label=label)
    for ax, metric in zip(axes, ("F1 over subtokens of the top suggestion", "exact match of the top suggestion")):
        ax.axvline(ANCHOR_FREQUENCY, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xlim(0.0, 1.02)
        ax.set_ylim(0.0, 1.0)
        ax.set_xlabel("suggestion frequency (fraction of test functions)")
        ax.set_title(metric, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("where the model suggests")
    axes[0].legend(loc="upper right", fontsize=9)
    fig.suptitle(title, fontsize=10)
    return fig


ON_PAR_POINTS = 1.0  # differences (percentage points) the discussion calls "on par"


def _compare(values: dict[str, float]) -> str:
    """``the subtoken LBL's (23.4 %)`` or ``on par: ...`` when the best two are within ON_PAR_POINTS."""
    ranked = sorted(((v, k) for k, v in values.items() if not math.isnan(v)), reverse=True)
    titles = dict(MODELS)
    if len(ranked) > 1 and 100 * (ranked[0][0] - ranked[1][0]) < ON_PAR_POINTS:
        return (f"on par between the {titles[ranked[0][1]]} and the {titles[ranked[1][1]]} "
                f"({_pct(ranked[0][0])} vs {_pct(ranked[1][0])} %)")
    return f"the {titles[ranked[0][1]]}'s ({_pct(ranked[0][0])} %)"


def _monotone(points: list[dict]) -> bool:
    """F1@1 never falls by more than a point as the threshold rises (over points with >= 1 % suggested)."""
    f1 = [p["f1_at_1"] for p in points if not math.isnan(p["f1_at_1"]) and p["suggestion_frequency"] >= 0.01]
    return all(b >= a - 0.01 for a, b in zip(f1, f1[1:]))


def discussion(results: dict[str, dict], counts: dict) -> list[str]:
    """Statements read off the figures (every number computed from this run)."""
    base, name, sub = (results[k] for k, _ in MODELS)
    near = {k: point_near(results[k], ANCHOR_FREQUENCY) for k, _ in MODELS}
    test_functions = counts["functions"]["test"]
    lines = [f"- At 100 % suggestion frequency the best F1@1 is {_compare({k: results[k]['f1_at_1'] for k, _ in MODELS})}, "
             f"the best exact@1 {_compare({k: results[k]['exact_at_1'] for k, _ in MODELS})}.",
             f"- Near 20 % suggestion frequency the best F1@1 is {_compare({k: near[k]['f1_at_1'] for k, _ in MODELS})}; "
             + ", ".join(f"{t} {_pct(near[k]['f1_at_1'])} % at {_pct(near[k]['suggestion_frequency'])} % (p ≥ "
                         f"{near[k]['threshold']:.2f})" for k, t in MODELS) + "."]
    for key, title in MODELS:
        points = curve(results[key])
        if _monotone(points):
            lines.append(f"- The {title}'s confidence ranks its suggestions: F1@1 rises with the threshold, from "
                         f"{_pct(results[key]['f1_at_1'])} % at 100 % to {_pct(near[key]['f1_at_1'])} % near 20 %.")
        else:
            lines.append(f"- The {title}'s F1@1 does not rise steadily with its confidence threshold (see the curve table).")
    spaced = [p["suggestion_frequency"] for p in curve(base) if not math.isnan(p["f1_at_1"])]
    gaps = max(a - b for a, b in zip(spaced, spaced[1:])) if len(spaced) > 1 else 0.0
    if gaps > 0.25:
        lines.append(f"- The baseline's probabilities (smoothed co-occurrence shares) bunch up: one threshold step "
                     f"drops its suggestion frequency by {_pct(gaps)} points, so its curve has few points and its "
                     "\"~20 %\" point is the nearest one there is.")
    wins = [(t, metric) for metric in ("f1_at_1", "exact_at_1", "exact_at_5", "f1_at_5")
            for k, t in MODELS[1:] if base[metric] > results[k][metric]]
    wins += [(t, "F1@1 near 20 %") for k, t in MODELS[1:] if near["baseline"]["f1_at_1"] > near[k]["f1_at_1"]]
    if wins:
        lines.append("- Where the frequency baseline wins: " + "; ".join(f"over the {t} on {m.replace('_at_', '@')}"
                                                                         for t, m in wins) + ".")
    else:
        lines.append("- The frequency baseline wins nowhere: it is below both LBL models on F1@1, exact@1, exact@5 "
                     "and F1@5 at 100 % and on F1@1 near 20 %.")
    lines[-1] += (" It averages each known feature's name distribution (the share c(f, n) / c(f)), and most of a "
                  "method's features (`arg:self`, `body:self`, ...) are shared by thousands of functions whose most "
                  "common name is the same, so frequent names still lead: its top suggestion is "
                  + ", ".join(f"`{n}` for {_pct(c / test_functions)} %" for n, c in base["top_names"])
                  + " of the test functions.")
    correct_sub = round(sub["exact_at_1"] * test_functions)
    unseen = counts["unseen"]["test"]
    neo = sub["neologisms"]
    lines.append(f"- Neologisms: the subtoken LBL's top suggestion is a name no train function has for "
                 f"{sub['neologisms_suggested']:,d} of the {test_functions:,d} test functions; "
                 f"{sub['neologisms_correct']} of them are exactly right, i.e. {sub['neologisms_correct']} of its "
                 f"{correct_sub} exact top-1 hits are neologisms, while {_pct(unseen)} % of the test functions have a "
                 "name no train function has (the whole-name LBL and the baseline can never match those exactly: "
                 f"their ceiling on exact@1 is {_pct(1 - unseen)} %)."
                 + (f" The neologisms are at best partly right: mean F1 {_pct(neo['mean_f1'])} %, {neo['partly_right']} of "
                    f"{neo['count']} share a subtoken with the true name, and {neo['repeated']} repeat a subtoken "
                    "(`main_main`; presumably the beam keeps a name whose every step is likely, and the history of M "
                    "previous subtokens does not stop a repeat)." if neo and neo["count"] else ""))
    lines.append(f"- NLL per test function: baseline {base['loss']:.2f}, whole-name LBL {name['loss']:.2f}, subtoken LBL "
                 f"{sub['loss']:.2f} nats. Not one scale: the whole-name models score every unseen name as the one "
                 "class UNK" + (" (every train name is in the vocabulary here, so UNK is never a training "
                                "target)" if counts["name_unk_count"] == 0 else "")
                 + ", the subtoken model the name itself, subtoken by subtoken (an unseen subtoken is UNK).")
    return lines


def neologism_table(neo: dict) -> list[str]:
    if not neo or not neo["examples"]:
        return ["The subtoken LBL suggested no neologism at rank 1."]
    lines = [f"The subtoken LBL's {len(neo['examples'])} most confident neologisms (top-1 suggestions that are no train name):",
             "", "| function | true name | suggested | p | F1 |", "|---|---|---|---:|---:|"]
    lines += [f"| `{q}` | `{t}` | `{s}` | {p:.2f} | {_pct(f1)} |" for q, t, s, p, f1 in neo["examples"]]
    return lines


def build_report(args: argparse.Namespace, command: str, counts: dict, results: dict[str, dict], total: float) -> str:
    """The Markdown report (module docstring)."""
    quarantined = counts["quarantined"]
    quarantine_lines = [f"  - `{doc_id}` line {line}: {reason}" for doc_id, line, reason in quarantined[:20]]
    if len(quarantined) > 20:
        quarantine_lines.append(f"  - ... {len(quarantined) - 20} more")
    anchor = point_near(results["subtoken"], ANCHOR_FREQUENCY)
    subset = (f" ({counts['files_read']} of its {counts['input_files']} files, evenly spread)"
              if counts["files_read"] < counts["input_files"] else "")
    return "\n".join([
        "# Method naming on the Python standard library",
        "",
        "Suggesting a function's name from its body (Allamanis, Barr, Bird, Sutton, \"Suggesting Accurate Method",
        "and Class Names\", FSE 2015): the frequency baseline, the whole-name log-bilinear model and the subtoken",
        "log-bilinear model, scored on the TEST functions. F1 is over the subtokens of the top suggestion",
        "(`get_http_server` = get, http, server), exact match at rank 1 and 5; percentages.",
        "",
        f"Command: `{command.strip()}`",
        "",
        f"Python {platform.python_version()} ({sys.implementation.name}), corpus `{args.input}`{subset}; test suites "
        "(`test/`, `tests/`, `idle_test/`), `site-packages/` and `__pycache__/` left out.",
        "",
        "## Data",
        "",
        f"- Split rule `{counts['split_rule']}` (a hash of the file's path, seed {args.split_seed}): files "
        + " / ".join(f"{counts['files'][s]:,d}" for s in SPLITS) + ", functions and methods "
        + " / ".join(f"{counts['functions'][s]:,d}" for s in SPLITS) + " (train / valid / test).",
        f"- Test functions whose name no train function has: {_pct(counts['unseen']['test'])} % "
        f"(valid: {_pct(counts['unseen']['valid'])} %).",
        f"- Quarantined files: {len(quarantined)}" + (":" if quarantined else "."),
        *quarantine_lines,
        f"- Dropped functions (no subtoken in the name): {counts['dropped']}.",
        f"- Vocabularies (specials included): {counts['vocab']['names']:,d} names, {counts['vocab']['subtokens']:,d} "
        f"subtokens, {counts['vocab']['features']:,d} features, {counts['vocab']['context']:,d} context tokens.",
        "",
        "## Setup",
        "",
        f"Both LBL models: D = {args.embed_dim}, K = {args.context_size} context tokens each side, k = "
        f"{args.noise_samples} NCE noise samples; subtoken history M = {args.subtoken_history}, beam {args.beam_size}, "
        f"at most {args.max_subtokens} subtokens. Adam lr {args.lr}, batch {args.batch_size} functions, at most "
        f"{args.epochs} epochs, early stopping on the valid split's F1@1 (patience {args.patience}), the best epoch's "
        f"weights kept. The baseline is fitted on the train split. Device {args.device}, {args.threads} torch "
        f"thread(s); prepare {counts['prepare_seconds']:.0f} s, whole run {total / 60:.1f} min wall, "
        f"{time.process_time() / 60:.1f} min CPU (a machine shared with other jobs: wall > CPU).",
        "",
        "## Results (test functions)",
        "",
        "At 100 % suggestion frequency (the model always suggests), then at the curve point nearest 20 % (the",
        "model suggests only when its top suggestion's probability is at least the threshold; the columns are",
        "means over the functions it suggests for).",
        "",
        results_table(results),
        "",
        f"![F1@1 and exact@1 against suggestion frequency]({args.figure.name})",
        "",
        "The whole suggestion-frequency curve (suggestion frequency, F1@1, exact@1 per threshold):",
        "",
        curve_table(results),
        "",
        *neologism_table(results["subtoken"]["neologisms"]),
        "",
        "## Anchor",
        "",
        "The paper reports, for its subtoken model on Java methods, F1 ≈ 60 % at 20 % suggestion frequency.",
        "Here the subtoken LBL has "
        f"{_pct(anchor['f1_at_1'])} % F1@1 at {_pct(anchor['suggestion_frequency'])} % suggestion frequency. The",
        "settings differ: Java, not Python; the paper's corpus is 20 popular Java projects from GitHub, their",
        "files split 70 % / 30 % into train and test (names inside one project follow one team's conventions),",
        "this corpus is one standard library split 70 / 15 / 15 by file across",
        "many modules of different authors, ages and styles; Java method names are more conventional",
        "(getters, setters) and Java's declared types give features that Python has only where annotated;",
        "the features, vocabularies, D and training budget are this repository's. The",
        "same measurement in another setting, not a reproduction of the number.",
        "",
        "## Discussion",
        "",
        *discussion(results, counts),
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    command = command_line("reproduce_naming", argv)
    started = time.perf_counter()
    task = NamingTask()
    done, counts = prepare(task, args)
    spec, splits = done.preprocessor.spec, done.splits
    print(f"data: {counts['files_read']} files, functions {counts['functions']}, quarantined "
          f"{len(counts['quarantined'])}, test names unseen {_pct(counts['unseen']['test'])} % "
          f"({counts['prepare_seconds']:.0f} s)", flush=True)
    results = {"baseline": evaluate_baseline(task, args, spec, splits)}
    print(f"  baseline: test F1@1 {_pct(results['baseline']['f1_at_1'])} %", flush=True)
    for model_type in ("name", "subtoken"):
        results[model_type] = train_and_evaluate(task, args, spec, splits, model_type)
        r = results[model_type]
        print(f"  {model_type}: test F1@1 {_pct(r['f1_at_1'])} %, exact@1 {_pct(r['exact_at_1'])} % "
              f"({r['seconds']:.0f} s)", flush=True)
    print(results_table(results))
    title = (f"Method naming, Python {platform.python_version()} standard library, test functions "
             f"({counts['functions']['test']:,d})")
    write_outputs(args, build_report(args, command, counts, results, time.perf_counter() - started),
                  figure(results, title))
    return 0


def write_outputs(args: argparse.Namespace, report: str, fig) -> None:
    """The Markdown report to ``args.output``, the figure to ``args.figure`` (folders created)."""
    for path in (args.output, args.figure):
        path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.figure, dpi=120)
    args.output.write_text(report, encoding="utf-8")
    print(f"wrote {args.output} and {args.figure}")

if __name__ == "__main__":
    raise SystemExit(main())
