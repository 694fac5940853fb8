"""GPU check of the training path without Ray: NCCL process group + DDP + bf16 autocast.

Each process is one rank as a Ray Train worker builds it (:func:`dynlm.runner.build_rank_run`:
model, optimizer, schedule and this rank's batches; the task's DDP wrapper; :meth:`RankRun.fit`)
over the synthetic corpus, on every local GPU (one process per GPU through
torch.multiprocessing), and prints training tokens/s, the loss per epoch and the mean GPU
utilization sampled with nvidia-smi.
Ray and MLflow are not needed, so this runs on a bare CUDA image with only torch, tokenizers,
pyarrow and pyyaml.

Usage::

    python3 -m scripts.device_check --epochs 3 --model dntm     # from the repository root
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from itertools import islice

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dynlm.data.config import DataConfig
from dynlm.data.synth import SynthConfig, write_conll
from dynlm.job import JobConfig
from dynlm.runner import build_rank_run, total_steps
from dynlm.tasks.local import prepare_local
from dynlm.training import FitHooks
from scripts.gpu_sampler import GpuSampler


def worker(rank: int, world: int, args: argparse.Namespace, root: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    bf16 = args.precision == "bf16" or (args.precision == "auto" and cuda)
    from dynlm.data.prepared import PreparedData

    prepared = PreparedData.open(root)
    job = JobConfig.from_dict({
        "data": prepared.manifest["config"],
        "model": {"type": args.model, "embed_dim": args.dim, "hidden_dim": args.dim,
                  "dntm": {"dynamic": "both", "merge_fn": "gru"}},
        "train": {"lr": 3e-3, "epochs": args.epochs, "batch_size": args.batch_size, "lr_schedule": "constant",
                  "early_stopping_patience": 0},
        "run": {"num_workers": world}})
    run = build_rank_run(job, prepared.spec, train_rows=lambda _buffer: islice(prepared.iter_rows("train"), rank, None, world),
                         valid_rows=lambda _buffer: prepared.iter_rows("valid"), steps=total_steps(job, prepared),
                         rank=rank, world_size=world, device=device)
    ddp = torch.nn.parallel.DistributedDataParallel(run.task.wrap_for_ddp(run.model), device_ids=[rank] if cuda else None)
    hooks = FitHooks(rank=rank, spec=run.spec, autocast_dtype=torch.bfloat16 if bf16 else None, restore_best=False)
    with GpuSampler() as util:
        read = {"samples": 0}  # the utilisation samples of the epochs before

        def on_epoch(epoch: int, record: dict) -> None:
            samples, read["samples"] = util.samples[read["samples"]:], len(util.samples)
            if rank == 0:
                print(f"[{args.model}] epoch {epoch}: train loss {record['train_loss']:.3f}  valid ppl "
                      f"{record['valid_ppl']:.2f}  re-appearing ppl {record['valid_ppl_reappearing']:.2f}  "
                      f"{record['train_tokens_per_s']:,.0f} train tokens/s (world {world})  GPU util "
                      f"{statistics.mean(samples) if samples else float('nan'):.0f}%  params equal across ranks: "
                      f"{record['param_checksum_spread'] == 0}", flush=True)

        run.fit(wrapped=ddp, hooks=hooks, on_epoch=on_epoch)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="dntm", choices=["rnn", "dntm"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--documents", type=int, default=600)
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"],
                        help="autocast: auto = bf16 on CUDA, fp32 on CPU. A/B the bf16 divergence seen on an "
                             "H200 (benchmarks/results/gpu_h200.md) with --precision fp32 vs bf16")
    args = parser.parse_args()
    if torch.cuda.is_available():
        world = torch.cuda.device_count()
        print(f"torch {torch.__version__}, {world} x {torch.cuda.get_device_name(0)}, NCCL {torch.cuda.nccl.version()}")
    else:  # a smoke test of the same path: 2 gloo processes on the CPU
        world = 2
        print(f"torch {torch.__version__}, no CUDA: 2 gloo processes on the CPU, precision {args.precision}")
    with tempfile.TemporaryDirectory() as tmp:
        files = write_conll(SynthConfig.from_dict({"num_documents": args.documents, "seed": 0}), f"{tmp}/corpus")
        prepared = prepare_local(DataConfig.from_dict({"inputs": [str(f) for f in files], "bpe_merges": 200,
                                                       "output_root": f"{tmp}/prepared"}))
        mp.spawn(worker, args=(world, args, str(prepared.root)), nprocs=world, join=True)


if __name__ == "__main__":
    main()
