"""Training throughput: the plain single-process loop vs Ray Train with 1 and 2 workers.

All three train the same model on the same prepared synthetic corpus with the same global
batch (documents) for the same epochs; tokens/s is the median over the epochs after the first
(the first one pays for Ray Data start-up and bucket building). Prints one table with the
ratios against the plain loop (target: Ray Train 1 worker >= 0.9x). With ``--use-gpu`` the
loops run on CUDA with bf16 autocast and the mean GPU utilisation during each run is recorded
(``nvidia-smi``, else ``torch.cuda.utilization``).

    python -m benchmarks.bench_train                      # CPU, 1 thread per process (from the repository root)
    python -m benchmarks.bench_train --use-gpu --out $OUT/bench_train.json
    python -m benchmarks.bench_train --corpus litbank --threads 2 --epochs 2
    python -m benchmarks.bench_train --corpus litbank --minimal-job --threads 2 --epochs 2   # a user's data+model job

The plain loop is the runner's one-process training (:func:`dynlm.runner.local_run`, what
``dynlm train --local`` runs): the Ray workers build their model, optimizer and batches with
the same runner, so the ratios measure what Ray Train and DDP add.

``--corpus litbank`` (issue 11) trains the report's baseline on the 80 LitBank documents of
``../shared/data/litbank`` (anonymized, vocabulary 10k + 50 chains, 2 x 256 LSTM, E 256,
dropout 0.3, global batch 16 documents, chunks of 35 tokens with several documents a row) and
adds the **plain-stream reference**: a pytorch/examples LSTM LM of the same size over the same
training tokens as one stream (16 columns x 35 tokens, ``--threads`` threads, one process), the
loop the issue compares ``dynlm train`` with (target: Ray Train 2 workers >= 0.7x it). Every
figure is the epoch's target tokens over its wall time, Ray Data's start-up included; the
table gives epoch 1 and the median of the later epochs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO
from benchmarks.litbank import DEFAULT_DATA as LITBANK_DATA
from scripts.gpu_sampler import GpuSampler


def plain_stream(job, prepared, threads: int) -> list[float]:
    """tokens/s per epoch of the plain-stream reference over the prepared training documents."""
    import torch

    from benchmarks.plain_stream import PlainStreamLM, plain_stream_train, token_stream

    torch.set_num_threads(threads)
    stream = token_stream(prepared.iter_rows("train"), job.train.batch_size)
    bptt = job.train.bptt_tokens or 35
    torch.manual_seed(0)
    m = job.model
    model = PlainStreamLM(prepared.spec.output_size, m.embed_dim, m.hidden_dim, m.num_layers, m.dropout)
    optimizer = torch.optim.Adam(model.parameters(), lr=job.train.lr)
    rates = []
    for _ in range(job.train.epochs):
        started = time.perf_counter()
        count = plain_stream_train(model, stream, optimizer, bptt, torch.device("cpu"))
        rates.append(count / (time.perf_counter() - started))
    return rates


def plain_loop(job, prepared, use_gpu: bool) -> list[float]:
    """tokens/s per epoch of the runner's training in this process (no Ray, no DDP): ``local_run``
    and its ``fit``, bf16 autocast on a GPU; an epoch's figure leaves its validation out."""
    import torch

    from dynlm.runner import local_run
    from dynlm.training import FitHooks

    run = local_run(job, prepared, device=torch.device("cuda" if use_gpu else "cpu"))
    summary = run.fit(hooks=FitHooks(spec=run.spec, autocast_dtype=torch.bfloat16 if use_gpu else None))
    return [record["train_tokens_per_s"] for record in summary["history"]]


def ray_train(job, prepared, num_workers: int, name: str) -> list[float]:
    """tokens/s per epoch (summed over ranks) of run_training with ``num_workers`` workers."""
    from pipelines.train import run_training

    run = job.run.to_dict()
    run.update(num_workers=num_workers, name=name, register=False, max_failures=0)
    result = run_training(job.replace(run=run), prepared)
    return [r["train_tokens_per_s"] for r in result.history]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--corpus", choices=["synthetic", "litbank"], default="synthetic")
    parser.add_argument("--data-dir", default=str(LITBANK_DATA),
                        help="--corpus litbank: the LitBank CoNLL folder")
    parser.add_argument("--documents", type=int, default=1000,
                        help="synthetic documents (small epochs measure the per-epoch ingest start-up instead)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8, help="global batch (documents)")
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the plain loop (Ray workers get 1 per CPU)")
    parser.add_argument("--workdir", help="scratch folder (default: a temporary one, removed)")
    parser.add_argument("--out", help="write the figures as JSON here")
    parser.add_argument("--minimal-job", action="store_true",
                        help="--corpus litbank: a user's job file with only data: and model: sections (the "
                             "training settings are the defaults); only epochs and where to run are set here")
    parser.add_argument("--address", default="local",
                        help="Ray address (default: a fresh local Ray, never someone else's cluster)")
    args = parser.parse_args()

    import torch

    from dynlm.data.synth import SynthConfig, write_conll
    from pipelines.defaults import default_job
    from pipelines.prepare import prepare

    torch.set_num_threads(args.threads)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_train_"))
    if args.corpus == "litbank":
        if not Path(args.data_dir).is_dir():
            print(f"[bench] no LitBank folder at {args.data_dir}")
            return 2
        corpus = [f"data.inputs=[{args.data_dir}]", "data.vocab_size=10000", "data.max_chains=50", "data.bpe_merges=0",
                  "model.type=rnn", "model.embed_dim=256", "model.hidden_dim=256", "model.num_layers=2",
                  "model.dropout=0.3", "train.bptt_tokens=35", "train.pack_documents=true", "train.lr=0.002"]
        args.batch_size = 16
    else:
        write_conll(SynthConfig(num_documents=args.documents, docs_per_file=50), work / "synth")
        corpus = [f"data.inputs=[{work / 'synth'}]", f"model.embed_dim={args.hidden_dim}",
                  f"model.hidden_dim={args.hidden_dim}"]
    where = [f"data.output_root={work / 'prepared'}", f"train.epochs={args.epochs}", "train.early_stopping_patience=0",
             f"run.storage_path={work / 'ray'}", f"run.tracking_uri=sqlite:///{work / 'mlflow.db'}",
             f"run.use_gpu={str(args.use_gpu).lower()}",
             "run.cpus_per_worker=0.5" if not args.use_gpu else "run.cpus_per_worker=1"]
    if args.minimal_job and args.corpus == "litbank":  # what a user writes: data and model, nothing else
        from dynlm.job import JobConfig

        job = JobConfig.from_dict({
            "data": {"inputs": [args.data_dir], "vocab_size": 10000, "max_chains": 50, "bpe_merges": 0},
            "model": {"type": "rnn", "embed_dim": 256, "hidden_dim": 256, "num_layers": 2, "dropout": 0.3},
        }).with_overrides(where)
        args.batch_size = job.train.batch_size
    else:
        job = None
    job = job or default_job(corpus + [
        f"data.output_root={work / 'prepared'}",
        f"train.epochs={args.epochs}", f"train.batch_size={args.batch_size}", "train.lr_schedule=constant",
        "train.early_stopping_patience=0", f"run.storage_path={work / 'ray'}",
        f"run.tracking_uri=sqlite:///{work / 'mlflow.db'}", f"run.use_gpu={str(args.use_gpu).lower()}",
        "run.cpus_per_worker=0.5" if not args.use_gpu else "run.cpus_per_worker=1"])
    import ray

    ray.init(address=args.address, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    prepared = prepare(job.data, progress=False)
    stamp = time.strftime("%H%M%S")
    runs = {}
    references = [("plain stream", lambda: plain_stream(job, prepared, args.threads))] if args.corpus == "litbank" else []
    for label, fn in (*references, ("plain loop", lambda: plain_loop(job, prepared, args.use_gpu)),
                      ("ray train 1 worker", lambda: ray_train(job, prepared, 1, f"bench1-{stamp}")),
                      ("ray train 2 workers", lambda: ray_train(job, prepared, 2, f"bench2-{stamp}"))):
        if args.use_gpu and label.endswith("2 workers") and torch.cuda.device_count() < 2:
            print(f"[bench] skipping {label}: {torch.cuda.device_count()} GPU(s)")
            continue
        sampler = GpuSampler() if args.use_gpu else None
        with sampler or _Null():
            rates = fn()
        steady = rates[1:] or rates
        runs[label] = {"tokens_per_s": statistics.median(steady), "per_epoch": rates,
                       "gpu_util_mean": sampler.mean if sampler else None}
        print(f"[bench] {label}: {runs[label]['tokens_per_s']:.0f} tokens/s (epochs: "
              + ", ".join(f"{r:.0f}" for r in rates) + ")", flush=True)

    reference = "plain stream" if "plain stream" in runs else "plain loop"
    base = runs[reference]["tokens_per_s"]
    print(f"\ntraining throughput ({'GPU bf16' if args.use_gpu else f'CPU, {args.threads} thread(s)'}; "
          f"{args.corpus} ({prepared.num_documents('train')} training documents), global batch {args.batch_size}, "
          f"model {job.model.type} E={job.model.embed_dim} H={job.model.hidden_dim} x {job.model.num_layers}, "
          f"bptt_tokens={job.train.bptt_tokens})")
    print(f"| run | epoch 1 tokens/s | later epochs tokens/s | x {reference} | GPU util % |\n|---|---|---|---|---|")
    for label, row in runs.items():
        util = row["gpu_util_mean"]
        print(f"| {label} | {row['per_epoch'][0]:,.0f} | {row['tokens_per_s']:,.0f} | {row['tokens_per_s'] / base:.2f} | "
              f"{(f'{util:.0f}' if util is not None else '-')} |")
        row["ratio_vs_reference"] = row["tokens_per_s"] / base
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
