"""Reproduce the DNTM comparison (Kobayashi et al., 2017, Table 2 style) on anonymized LitBank.

Trains the baseline RNNLM and the DNTM with dynamic in {input, output, both} x merge_fn with the
same budget, evaluates every model on the test documents and prints a table of perplexities
(overall, first mention, re-appearing entity, after entity), also written as Markdown together
with the exact command.

The paper's findings to compare with: output dynamics help predict re-appearing entities, input
dynamics help the words after an entity, and using both is best overall.

LitBank is prepared by the library (:mod:`benchmarks.litbank`: the LM task's stages, the folder
reused by the next run) and every model is trained by the runner, as ``dynlm train --local``
trains it (:func:`dynlm.runner.local_run`: documents in sentence lockstep, a cosine rate).

Usage (from the repository root; default: ~12 CPU-minutes for the whole grid, 1 thread;
baseline ~30 s, each DNTM ~45 s)::

    python -m benchmarks.reproduce_dntm
    python -m benchmarks.reproduce_dntm --device cuda --epochs 10 --embed-dim 256 --hidden-dim 512
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS, command_line, evaluation_batches, format_value, prepared_job, write_report
from benchmarks.litbank import METRICS, add_litbank_args, prepare_litbank, split_sizes
from dynlm.models.config import ModelConfig
from dynlm.models.dntm import PAPER_DNTM
from dynlm.runner import local_run
from dynlm.tasks.lm_evaluation import evaluate_lm
from dynlm.train_config import TrainConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=RESULTS / "dntm_litbank.md")
    add_litbank_args(parser, max_sentences=24)
    parser.add_argument("--embed-dim", type=int, default=64)
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8, help="documents per batch")
    parser.add_argument("--bptt-sentences", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dynamics", default="input,output,both", help="comma list of input,output,both")
    parser.add_argument("--merge-fns", default="max,gru,gru_relu,latest,attention", help="comma list")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return parser.parse_args(argv)


def model_config(args: argparse.Namespace, dynamic: str, merge_fn: str) -> ModelConfig:
    return ModelConfig.from_dict({
        "type": "dntm", "backbone": "lstm", "embed_dim": args.embed_dim, "hidden_dim": args.hidden_dim,
        "num_layers": args.num_layers, "dropout": args.dropout,
        "dntm": {**PAPER_DNTM, "dynamic": dynamic, "merge_fn": merge_fn},  # the paper's model
    })


def train_and_evaluate(args, prepared, test_rows: list[dict], dynamic: str, merge_fn: str) -> dict:
    """Train one model with the runner (the best validation epoch's weights kept); its test metrics."""
    job = prepared_job(prepared, model_config(args, dynamic, merge_fn), TrainConfig(
        bptt_tokens=0, lr_schedule="cosine", lr=args.lr, epochs=args.epochs, batch_size=args.batch_size,
        bptt_sentences=args.bptt_sentences, grad_clip=0.25, early_stopping_patience=0, seed=args.seed))
    started, cpu_started = time.perf_counter(), time.process_time()
    run = local_run(job, prepared, device=args.device)
    result = run.fit()
    test = evaluate_lm(run.model, evaluation_batches(run.task, test_rows, run.spec, args.batch_size))
    return {**test, "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
            "best_epoch": result["best_epoch"],
            "valid_ppl": result["best_valid_objective"]}


def format_table(results: list[tuple[str, str, dict]]) -> str:
    header = "| model | dynamic | merge_fn | " + " | ".join(title for _, title in METRICS) + " | valid ppl | train+eval s (wall / CPU) |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for dynamic, merge_fn, r in results:
        name = "baseline RNNLM" if dynamic == "none" else "DNTM"
        cells = [format_value(r[key]) for key, _ in METRICS]
        lines.append(f"| {name} | {dynamic} | {merge_fn if dynamic != 'none' else '-'} | " + " | ".join(cells)
                     + f" | {format_value(r['valid_ppl'])} | {r['seconds']:.0f} / {r['cpu_seconds']:.0f} |")
    return "\n".join(lines)


def summarize(results: list[tuple[str, str, dict]]) -> list[str]:
    """One line per paper claim: the best merge_fn of each dynamic vs the baseline."""
    baseline = next(r for d, _, r in results if d == "none")
    lines = ["Against the paper's findings (best merge_fn of each `dynamic`, ratio to the baseline; < 1 is better):", ""]
    for key, title in METRICS:
        cells = []
        for dynamic in ("input", "output", "both"):
            rows = [(m, r) for d, m, r in results if d == dynamic and not math.isnan(r[key])]
            if rows:
                merge_fn, best = min(rows, key=lambda mr: mr[1][key])
                cells.append(f"{dynamic} {best[key] / baseline[key]:.3f} ({merge_fn})")
        lines.append(f"- {title}: " + ", ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    dynamics = [d for d in args.dynamics.split(",") if d]
    merge_fns = [m for m in args.merge_fns.split(",") if m]
    for d in dynamics:
        if d not in ("input", "output", "both"):
            raise SystemExit(f"--dynamics: unknown {d!r} (input, output, both)")
    command = command_line("reproduce_dntm", argv)
    started = time.perf_counter()
    prepared, rows = prepare_litbank(args)
    spec, stats = prepared.spec, split_sizes(rows)
    print(f"data: {prepared.root}, {stats}\nspec: {spec}", flush=True)
    grid = [("none", "gru")] + [(d, m) for d in dynamics for m in merge_fns]
    results = []
    for dynamic, merge_fn in grid:
        r = train_and_evaluate(args, prepared, rows["test"], dynamic, merge_fn)
        results.append((dynamic, merge_fn, r))
        print(f"{dynamic:>6} {merge_fn:>9}: " + "  ".join(f"{key}={format_value(r[key])}" for key, _ in METRICS)
              + f"  ({r['seconds']:.0f} s wall, {r['cpu_seconds']:.0f} s CPU)", flush=True)
    table = format_table(results)
    total = time.perf_counter() - started
    print(table)
    counts = {k: int(results[0][2][f"count_{k}"]) for k in ("all", "first_mention", "reappearing", "after_entity")}
    report = "\n".join([
        "# DNTM on anonymized LitBank",
        "",
        "Baseline RNNLM vs the Dynamic Neural Text Model (Kobayashi et al., 2017), same budget for",
        "every model, perplexities on the TEST documents (lower is better).",
        "",
        "Command:",
        "",
        "```",
        command.strip(),
        "```",
        "",
        f"Data: {len(rows['train'])}/{len(rows['valid'])}/{len(rows['test'])} train/valid/test documents "
        f"({stats['train_tokens']}/{stats['valid_tokens']}/{stats['test_tokens']} tokens), split seed "
        f"{args.split_seed}; first {args.max_sentences or 'all'} sentences of each document; "
        f"max_chains={args.max_chains} (truncate), vocab {spec.num_words} words.",
        f"Test target counts: {counts}.",
        f"Model: {args.num_layers} x {args.hidden_dim} LSTM, embed {args.embed_dim}, dropout {args.dropout}; "
        f"{args.epochs} epoch(s), batch {args.batch_size} documents, BPTT {args.bptt_sentences} sentences, lr {args.lr}.",
        f"Device {args.device}, {args.threads} thread(s); whole run {total / 60:.1f} min wall, "
        f"{(time.process_time()) / 60:.1f} min CPU.",
        "",
        table,
        "",
        *summarize(results),
        "",
    ])
    write_report(args.output, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
