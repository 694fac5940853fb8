"""Reproduce the DNTM comparison (Kobayashi et al., 2017, Table 2 style) on anonymized LitBank.

Trains the baseline RNNLM and the DNTM with dynamic in {input, output, both} x merge_fn with the
same budget, evaluates every model on the test documents and prints a table of perplexities
(overall, first mention, re-appearing entity, after entity), also written as Markdown together
with the exact command.

The paper's findings to compare with: output dynamics help predict re-appearing entities, input
dynamics help the words after an entity, and using both is best overall.

Usage (default: ~12 CPU-minutes for the whole grid, 1 thread; baseline ~30 s, each DNTM ~45 s)::

    python benchmarks/reproduce_dntm.py
    python benchmarks/reproduce_dntm.py --device cuda --epochs 10 --embed-dim 256 --hidden-dim 512
"""

from __future__ import annotations

import argparse
import collections
import math
import shlex
import sys
import time
from pathlib import Path

import torch

from dynlm.data.anonymize import anonymize
from dynlm.data.batching import batch_documents
from dynlm.data.config import DataConfig
from dynlm.data.preprocessor import Preprocessor
from dynlm.data.readers import parse_file
from dynlm.data.schema import Quarantined
from dynlm.data.split import assign_split
from dynlm.models import build_model
from dynlm.models.config import ModelConfig
from dynlm.models.dntm import PAPER_DNTM
from dynlm.tasks.lm import LMTask
from dynlm.tasks.lm_evaluation import evaluate_lm
from dynlm.training import TrainConfig, fit

LM_TASK = LMTask()

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "litbank" / "conll"
METRICS = (("ppl", "overall"), ("ppl_first_mention", "first mention"),
           ("ppl_reappearing", "re-appearing entity"), ("ppl_after_entity", "after entity"))


def add_litbank_args(parser: argparse.ArgumentParser, *, max_sentences: int) -> None:
    """The data options of :func:`load_litbank` (shared with ``benchmarks/dntm_quality.py``)."""
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help="folder of LitBank *.conll files")
    parser.add_argument("--max-chains", type=int, default=50, help="entity identifiers per document (later chains truncated)")
    parser.add_argument("--vocab-size", type=int, default=2000)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--valid-fraction", type=float, default=0.1)
    parser.add_argument("--test-fraction", type=float, default=0.1)
    parser.add_argument("--max-sentence-len", type=int, default=60, help="longer sentences are cut into pieces (0: keep)")
    parser.add_argument("--max-sentences", type=int, default=max_sentences,
                        help="keep the first N sentences of every document, all splits (0: all; LitBank has ~100)")


def write_report(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "dntm_litbank.md")
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


def _cut(sentence: list[str], max_len: int) -> list[list[str]]:
    if max_len <= 0 or len(sentence) <= max_len:
        return [sentence]
    return [sentence[i : i + max_len] for i in range(0, len(sentence), max_len)]


def load_litbank(args: argparse.Namespace) -> tuple[Preprocessor, dict[str, list[dict]], dict]:
    """Parse, anonymize, split and encode LitBank. Returns (preprocessor, rows by split, stats)."""
    files = sorted(args.data_dir.glob("*.conll"))
    if not files:
        raise SystemExit(f"no *.conll files in {args.data_dir}")
    splits: dict[str, list[dict]] = {"train": [], "valid": [], "test": []}
    stats = collections.Counter()
    for path in files:
        for item in parse_file(path.read_bytes(), str(path), "conll"):
            if isinstance(item, Quarantined):
                stats["quarantined"] += 1
                continue
            doc, doc_stats = anonymize(item, max_chains=args.max_chains, too_many_chains="truncate")
            stats.update({k: v for k, v in doc_stats.items() if isinstance(v, int)})
            if doc is None:
                continue
            doc["sentences"] = [piece for s in doc["sentences"] for piece in _cut(s, args.max_sentence_len)]
            if args.max_sentences > 0:
                doc["sentences"] = doc["sentences"][: args.max_sentences]
            split = assign_split(doc["doc_id"], seed=args.split_seed,
                                 valid_fraction=args.valid_fraction, test_fraction=args.test_fraction)
            splits[split].append(doc)
    for name, docs in splits.items():
        if not docs:
            raise SystemExit(f"split {name!r} is empty: change --split-seed or the fractions")
    counts = collections.Counter(w for d in splits["train"] for s in d["sentences"] for w in s)
    data_cfg = DataConfig(inputs=[str(args.data_dir)], vocab_size=args.vocab_size, bpe_merges=0,
                          max_chains=args.max_chains)
    pre = Preprocessor.fit(dict(counts), data_cfg)
    rows = {
        name: [{"doc_id": d["doc_id"], "source_file": d["source_file"], **pre.encode_document(d["sentences"])}
               for d in docs]
        for name, docs in splits.items()
    }
    for name, split_rows in rows.items():
        stats[f"{name}_documents"] = len(split_rows)
        stats[f"{name}_tokens"] = sum(r["num_tokens"] for r in split_rows)
    return pre, rows, dict(stats)


def model_config(args: argparse.Namespace, dynamic: str, merge_fn: str) -> ModelConfig:
    return ModelConfig.from_dict({
        "type": "dntm", "backbone": "lstm", "embed_dim": args.embed_dim, "hidden_dim": args.hidden_dim,
        "num_layers": args.num_layers, "dropout": args.dropout,
        "dntm": {**PAPER_DNTM, "dynamic": dynamic, "merge_fn": merge_fn},  # the paper's model
    })


def train_and_evaluate(args, spec, rows, dynamic: str, merge_fn: str) -> dict:
    torch.manual_seed(args.seed)
    model = build_model(model_config(args, dynamic, merge_fn), spec).to(args.device)
    train_cfg = TrainConfig(bptt_tokens=0, lr_schedule="cosine", lr=args.lr, epochs=args.epochs, batch_size=args.batch_size,
                            bptt_sentences=args.bptt_sentences, grad_clip=0.25, early_stopping_patience=0,
                            seed=args.seed)
    started, cpu_started = time.perf_counter(), time.process_time()
    result = fit(model,
                 lambda epoch: batch_documents(rows["train"], spec, args.batch_size, seed=args.seed + epoch),
                 lambda: batch_documents(rows["valid"], spec, args.batch_size, seed=None),
                 train_cfg, task=LM_TASK)
    test = evaluate_lm(model, batch_documents(rows["test"], spec, args.batch_size, seed=None))
    return {**test, "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
            "best_epoch": result["best_epoch"],
            "valid_ppl": result["best_valid_objective"]}


def _fmt(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.2f}"


def format_table(results: list[tuple[str, str, dict]]) -> str:
    header = "| model | dynamic | merge_fn | " + " | ".join(title for _, title in METRICS) + " | valid ppl | train+eval s (wall / CPU) |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for dynamic, merge_fn, r in results:
        name = "baseline RNNLM" if dynamic == "none" else "DNTM"
        cells = [_fmt(r[key]) for key, _ in METRICS]
        lines.append(f"| {name} | {dynamic} | {merge_fn if dynamic != 'none' else '-'} | " + " | ".join(cells)
                     + f" | {_fmt(r['valid_ppl'])} | {r['seconds']:.0f} / {r['cpu_seconds']:.0f} |")
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
    command = "python benchmarks/reproduce_dntm.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    started = time.perf_counter()
    pre, rows, stats = load_litbank(args)
    spec = pre.spec
    print(f"data: {stats}\nspec: {spec}", flush=True)
    grid = [("none", "gru")] + [(d, m) for d in dynamics for m in merge_fns]
    results = []
    for dynamic, merge_fn in grid:
        r = train_and_evaluate(args, spec, rows, dynamic, merge_fn)
        results.append((dynamic, merge_fn, r))
        print(f"{dynamic:>6} {merge_fn:>9}: " + "  ".join(f"{key}={_fmt(r[key])}" for key, _ in METRICS)
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
