"""Throughput of `prepare` on WikiText-2 train against raw `tokenizers` encoding.

Prints, in one run:
  raw      tokenizers ``Tokenizer.encode_batch`` of the pre-tokenized words (same BPE model as
           the prepared folder), tokens/s;
  pipeline the whole prepare() job (read, parse, anonymize, split, count, fit, encode, write)
           with 1 and 2 encode actors, tokens/s and ratio to raw; plus its stage timings.

Ray start-up is excluded (one Ray for the whole run). Usage::

    .venv/bin/python -m benchmarks.bench_prepare [--data /work/shared/data/wikitext-2/train.txt.gz]
    .venv/bin/python -m benchmarks.bench_prepare --copies 4   # 4 renamed copies: fixed costs amortized

The fixed per-stage costs of Ray Data (task and actor start-up, the shuffle of the word
counts, fitting BPE once) weigh heavily on a 2M-token corpus; ``--copies N`` prepares N copies
of the file under other names (other doc ids) to show the throughput on a larger corpus.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2" / "train.txt.gz"


def raw_tokens_per_second(tokenizer, sentences: list[list[str]], repeats: int = 3) -> tuple[float, int]:
    """Best of ``repeats`` encode_batch passes over all sentences (pre-tokenized words)."""
    num_words = sum(len(s) for s in sentences)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        tokenizer.encode_batch(sentences, is_pretokenized=True, add_special_tokens=False)
        best = min(best, time.perf_counter() - started)
    return num_words / best, num_words


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="WikiText-2 train.txt.gz")
    parser.add_argument("--bpe-merges", type=int, default=1000)
    parser.add_argument("--vocab-size", type=int, default=10000)
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--copies", type=int, default=1, help="prepare N renamed copies of --data")
    args = parser.parse_args()

    import ray

    from dynlm.data.config import DataConfig
    from pipelines.prepare import prepare
    from pipelines.ray_env import init_ray

    init_ray(log_to_driver=False)  # never a stale `ray start` address (ray.init() would wait on it)
    print(f"ray: {ray.cluster_resources().get('CPU')} CPUs; data: {args.data}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        inputs = [args.data]
        if args.copies > 1:
            inputs = []
            for copy in range(args.copies):
                target = Path(tmp) / f"copy{copy}-{Path(args.data).name}"  # doc ids come from the file name
                try:
                    os.link(args.data, target)
                except OSError:  # another filesystem
                    shutil.copyfile(args.data, target)
                inputs.append(str(target))
        for actors in args.actors:
            cfg = DataConfig(inputs=inputs, format="text", output_root=f"{tmp}/actors{actors}",
                             bpe_merges=args.bpe_merges, vocab_size=args.vocab_size, num_encode_actors=actors)
            started = time.perf_counter()
            prepared = prepare(cfg, progress=False)
            seconds = time.perf_counter() - started
            tokens = sum(prepared.manifest["counts"]["tokens"].values())
            results.append((actors, tokens, seconds, prepared.manifest["timings_s"]))
        tokenizer = prepared.preprocessor.subwords.tokenizer

    with gzip.open(args.data, "rt", encoding="utf-8") as fh:  # the benchmark's own copy of the words
        sentences = [line.split() for line in fh if line.strip()] * args.copies
    raw_rate, raw_words = raw_tokens_per_second(tokenizer, sentences)

    print(f"\nraw tokenizers encode_batch: {raw_words:,} words, {raw_rate:,.0f} tokens/s")
    for actors, tokens, seconds, timings in results:
        rate = tokens / seconds
        print(f"prepare, {actors} encode actor(s): {tokens:,} tokens in {seconds:.1f} s = {rate:,.0f} tokens/s "
              f"= {rate / raw_rate:.3f}x raw; encode-and-write stage {tokens / timings['encode_write']:,.0f} "
              f"tokens/s = {tokens / timings['encode_write'] / raw_rate:.3f}x raw")
        print("  stages (s): " + json.dumps(timings))
    ray.shutdown()


if __name__ == "__main__":
    main()
