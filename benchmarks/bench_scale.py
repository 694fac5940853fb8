"""Prepare (and one training epoch) at corpus sizes far above a test's: does the driver stay flat?

For each size (million tokens), a corpus folder of WikiText-2's train text copied under distinct
file names (so distinct document ids) is prepared by ``dynlm prepare`` as a new user runs it: a
subprocess with its own local Ray, ``--set format=text``. Sampled every 0.5 s from /proc:

  driver RSS   the ``dynlm`` process alone (what must not grow with the corpus)
  tree PSS     the driver and every process below it (Ray's GCS, raylet, workers; proportional
               set size, so the object store's shared pages are counted once)
  spilled      bytes under the run's Ray temp folder's spill directories (object store -> disk)

plus wall time, train tokens/s, and the raw ``tokenizers`` ``encode_batch`` rate on the same
text with the folder's own BPE model (the issue-11 ratio). ``--train-size`` then runs one epoch
of ``dynlm train`` (RNN, 2 workers) streaming the folder of that size, with the same sampling.
``--score-sizes`` scores the valid split of those sizes' folders with ``dynlm evaluate`` (a
seeded, untrained RNN LM for the folder's vocabulary: the cost does not depend on the weights),
in the command's process (``--ray-scoring never``) and as a Ray Data job (``always``), sampled
the same way, and checks that both give the same perplexity.

Usage::

    .venv/bin/python -m benchmarks.bench_scale --sizes 2 16 64 --train-size 64 \\
        --report benchmarks/results/scale_cpu.md
    .venv/bin/python -m benchmarks.bench_scale --sizes --score-sizes 16 64   # folders prepared before

Needs ``../shared/data/wikitext-2/train.txt.gz`` (or ``--data``); writes under ``--work``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "wikitext-2" / "train.txt.gz"


class Sampler:
    """Peak driver RSS, peak tree PSS and peak spilled bytes of a running process."""

    def __init__(self, pid: int, ray_tmp: Path, interval_s: float = 0.5):
        self.pid, self.ray_tmp, self.interval_s = pid, ray_tmp, interval_s
        self.driver_rss = self.tree_pss = self.spilled = 0
        self.series: list[tuple[float, int, int]] = []  # (seconds since start, driver RSS, tree PSS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _pss(process: psutil.Process) -> int:
        try:
            with open(f"/proc/{process.pid}/smaps_rollup") as handle:
                for line in handle:
                    if line.startswith("Pss:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _spilled_bytes(self) -> int:
        total = 0
        for folder in self.ray_tmp.rglob("*spill*"):
            if folder.is_dir():
                total += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        return total

    def _run(self) -> None:
        started = time.perf_counter()
        while not self._stop.is_set():
            try:
                driver = psutil.Process(self.pid)
                rss = driver.memory_info().rss
                tree = [driver, *driver.children(recursive=True)]
                pss = sum(self._pss(p) for p in tree)
                self.driver_rss, self.tree_pss = max(self.driver_rss, rss), max(self.tree_pss, pss)
                self.series.append((time.perf_counter() - started, rss, pss))
                self.spilled = max(self.spilled, self._spilled_bytes())
            except (psutil.NoSuchProcess, OSError):
                pass
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def make_corpus(text: str, tokens_per_copy: int, million_tokens: float, folder: Path) -> int:
    """Copies of ``text`` as ``copy_NNNNN.txt`` until ``million_tokens``; returns the copies."""
    copies = max(1, round(million_tokens * 1e6 / tokens_per_copy))
    if folder.exists() and len(list(folder.glob("copy_*.txt"))) == copies:
        return copies
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for index in range(copies):
        (folder / f"copy_{index:05d}.txt").write_text(text, encoding="utf-8")
    return copies


def run_sampled(argv: list[str], ray_tmp: Path, log: Path) -> dict:
    """Run ``argv`` (its own local Ray under ``ray_tmp``), sampled; wall, peaks, exit status."""
    shutil.rmtree(ray_tmp, ignore_errors=True)
    ray_tmp.mkdir(parents=True)
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp)}
    env.pop("RAY_ADDRESS", None)
    started = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        with Sampler(process.pid, ray_tmp) as sampler:
            status = process.wait()
    wall = time.perf_counter() - started
    shutil.rmtree(ray_tmp, ignore_errors=True)
    if status != 0:
        raise SystemExit(f"{' '.join(argv)} exited {status}; see {log}")
    with open(log.with_suffix(".memory.csv"), "w") as series:
        series.write("seconds,driver_rss_bytes,tree_pss_bytes\n")
        series.writelines(f"{t:.1f},{rss},{pss}\n" for t, rss, pss in sampler.series)
    return {"wall_s": wall, "driver_rss": sampler.driver_rss, "tree_pss": sampler.tree_pss,
            "spilled": sampler.spilled, "series": sampler.series}


def raw_rate(prepared: Path, text: str) -> float:
    """``tokenizers`` ``encode_batch`` words/s of ``text``'s words with the folder's BPE model."""
    from dynlm.data.prepared import PreparedData

    subwords = PreparedData.open(prepared).preprocessor.subwords
    sentences = [line.split() for line in text.splitlines() if line.strip() and not line.startswith(" =")]
    words = sum(map(len, sentences))
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        subwords.tokenizer.encode_batch(sentences, is_pretokenized=True, add_special_tokens=False)
        best = min(best, time.perf_counter() - started)
    return words / best


def score(work: Path, size: float, dynlm: list[str]) -> list[str]:
    """``dynlm evaluate`` of the valid split of ``size``'s folder, here and on Ray (module doc)."""
    import torch

    from dynlm import checkpoint
    from dynlm.data.prepared import PreparedData
    from dynlm.models import build_model
    from dynlm.models.rnn_lm import rnn_lm_small

    (folder,) = [p for p in (work / f"prepared_{size:g}M").iterdir() if (p / "manifest.json").exists()]
    prepared = PreparedData.open(folder)
    model_dir = work / f"score_model_{size:g}M"
    model_cfg = rnn_lm_small(embed_dim=64, hidden_dim=64, dropout=0.0)
    torch.manual_seed(0)
    checkpoint.save(model_dir / "model.pt", build_model(model_cfg, prepared.spec), model_cfg, prepared.spec)
    (model_dir / "preprocessor.json").write_bytes(prepared.read_bytes(prepared.manifest["preprocessor"]))
    tokens = prepared.manifest["counts"]["tokens"]["valid"]
    lines, ppl = [], {}
    for how in ("never", "always"):
        log = work / f"score_{size:g}M_{how}.log"
        m = run_sampled([*dynlm, "evaluate", "--model", str(model_dir), "--data", str(folder), "--split", "valid",
                         "--ray-scoring", how, "--batch-size", "32", "--json"], work / "ray", log)
        result = json.loads(log.read_text().strip().splitlines()[-1])
        ppl[how] = result["metrics"]["ppl"]
        lines.append(f"| {size:g} M folder, valid: {tokens:,d} tokens, {result['documents']:,d} documents | "
                     f"{result['scored_on']} | {m['wall_s']:.0f} s | {tokens / m['wall_s']:,.0f} | "
                     f"{m['driver_rss'] / 2**20:,.0f} MB | {m['tree_pss'] / 2**20:,.0f} MB | {ppl[how]:.4f} |")
        print(lines[-1], flush=True)
    if abs(ppl["never"] - ppl["always"]) > 1e-6 * ppl["never"]:
        raise SystemExit(f"scoring on Ray gave ppl {ppl['always']}, in process {ppl['never']}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="WikiText-2 train.txt.gz")
    parser.add_argument("--sizes", type=float, nargs="*", default=[2, 16, 64], help="million tokens")
    parser.add_argument("--score-sizes", type=float, nargs="*", default=[],
                        help="score these sizes' valid splits in process and on Ray (folders prepared already)")
    parser.add_argument("--train-size", type=float, default=None, help="one RNN epoch on this size's folder")
    parser.add_argument("--work", default=str(REPO / "runs" / "bench_scale"))
    parser.add_argument("--report", default=None, help="write the markdown table here")
    args = parser.parse_args()

    text = gzip.open(args.data, "rt", encoding="utf-8").read() if args.data.endswith(".gz") else Path(args.data).read_text()
    tokens_per_copy = sum(len(line.split()) for line in text.splitlines())
    work = Path(args.work)
    dynlm = [sys.executable, "-m", "pipelines.cli"]
    rows = []
    for size in args.sizes:
        corpus = work / f"corpus_{size:g}M"
        copies = make_corpus(text, tokens_per_copy, size, corpus)
        out = work / f"prepared_{size:g}M"
        shutil.rmtree(out, ignore_errors=True)
        measured = run_sampled([*dynlm, "prepare", "--input", str(corpus), "--output-root", str(out),
                                "--set", "format=text", "--no-progress"], work / "ray", work / f"prepare_{size:g}M.log")
        (folder,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
        counts = json.loads((folder / "manifest.json").read_text())["counts"]
        tokens = sum(counts["tokens"].values())
        rate = tokens / measured["wall_s"]
        raw = raw_rate(folder, text)
        rows.append((size, copies, tokens, measured, rate, raw))
        print(f"prepare {size:g}M: {copies} copies, {tokens:,d} tokens, {measured['wall_s']:.0f} s, "
              f"{rate:,.0f} tokens/s ({rate / raw:.2f} x raw {raw:,.0f}/s), driver RSS "
              f"{measured['driver_rss'] / 2**20:,.0f} MB, tree PSS {measured['tree_pss'] / 2**20:,.0f} MB, "
              f"spilled {measured['spilled'] / 2**20:,.0f} MB", flush=True)
    lines = ["| corpus | train+valid+test tokens | wall | tokens/s | ÷ raw tokenizers | driver peak RSS | "
             "tree peak PSS | spilled |", "|---|---|---|---|---|---|---|---|"]
    for size, copies, tokens, m, rate, raw in rows:
        lines.append(f"| {size:g} M ({copies} copies) | {tokens:,d} | {m['wall_s']:.0f} s | {rate:,.0f} | "
                     f"{rate / raw:.2f} | {m['driver_rss'] / 2**20:,.0f} MB | {m['tree_pss'] / 2**20:,.0f} MB | "
                     f"{m['spilled'] / 2**20:,.0f} MB |")
    if not rows:
        lines = []
    if len(rows) > 1:
        first, last = rows[0][3]["driver_rss"], rows[-1][3]["driver_rss"]
        lines.append(f"\nDriver peak RSS at {rows[-1][0]:g} M / at {rows[0][0]:g} M: **{last / first:.2f}x** "
                     f"(target <= 1.2x).")
    if args.train_size is not None:
        corpus, out = work / f"corpus_{args.train_size:g}M", work / f"prepared_{args.train_size:g}M"
        m = run_sampled([*dynlm, "train", "--set", f"data.inputs=[{corpus}]", "--set", "data.format=text",
                         "--set", f"data.output_root={out}",  # the folder prepared above: reused
                         "--set", "model.type=rnn", "--set", "train.epochs=1",
                         "--set", "run.num_workers=2", "--set", "run.register=false",
                         "--set", f"run.storage_path={work / 'ray_results'}",
                         "--set", f"run.tracking_uri=sqlite:///{work / 'mlflow.db'}"],
                        work / "ray", work / "train.log")
        quarters = [max((pss for t, _, pss in m["series"] if q * m["wall_s"] / 4 <= t < (q + 1) * m["wall_s"] / 4),
                        default=0) for q in range(4)]
        lines.append(f"\nOne RNN epoch, 2 workers, over the {args.train_size:g} M-token folder: {m['wall_s']:.0f} s, "
                     f"driver peak RSS {m['driver_rss'] / 2**20:,.0f} MB, whole-tree peak PSS "
                     f"{m['tree_pss'] / 2**20:,.0f} MB (target < 8 GB; by quarter of the run: "
                     f"{', '.join(f'{q / 2**20:,.0f}' for q in quarters)} MB), spilled {m['spilled'] / 2**20:,.0f} MB.")
    if args.score_sizes:
        lines += ["", "| scored | where (`dynlm evaluate --ray-scoring never / always`) | wall | tokens/s | "
                  "driver peak RSS | tree peak PSS | ppl |", "|---|---|---|---|---|---|---|"]
        for size in args.score_sizes:
            lines += score(work, size, dynlm)
    table = "\n".join(lines)
    print(table)
    if args.report:
        Path(args.report).write_text(f"# Prepare at scale (2 cores)\n\nCommand: `.venv/bin/python -m benchmarks.bench_scale "
                                     f"{' '.join(sys.argv[1:])}`\n\n{table}\n")


if __name__ == "__main__":
    main()
