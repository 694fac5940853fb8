"""GPU check of the training path without Ray: NCCL process group + DDP + bf16 autocast.

Runs the library's own ``train_step``/``evaluate`` on a DDP-wrapped model over the synthetic
corpus, on every local GPU (one process per GPU through torch.multiprocessing), and prints
training tokens/s, the loss per epoch and the mean GPU utilization sampled with nvidia-smi.
Ray and MLflow are not needed, so this runs on a bare CUDA image with only torch, tokenizers,
pyarrow and pyyaml.

Usage::

    PYTHONPATH=. python3 scripts/device_check.py --epochs 3 --model dntm
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dynlm.data.batching import batch_documents
from dynlm.data.config import DataConfig
from dynlm.data.synth import SynthConfig, write_conll
from dynlm.distributed import EveryParameterUsed
from dynlm.models import build_model
from dynlm.models.config import ModelConfig
from dynlm.optim import build_optimizer
from dynlm.tasks.local import prepare_local
from dynlm.training import TrainConfig, evaluate, set_seed, train_step
from scripts.gpu_sampler import GpuSampler


def worker(rank: int, world: int, args: argparse.Namespace, root: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    bf16 = args.precision == "bf16" or (args.precision == "auto" and cuda)
    autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)  # noqa: E731
    from dynlm.data.prepared import PreparedData

    prepared = PreparedData.open(root)
    spec = prepared.spec
    set_seed(0)
    model_cfg = ModelConfig.from_dict({"type": args.model, "embed_dim": args.dim, "hidden_dim": args.dim,
                                       "dntm": {"dynamic": "both", "merge_fn": "gru"}})
    model = build_model(model_cfg, spec).to(device)
    # A chunk without mentions leaves the merge parameters out of the graph: anchor them all.
    ddp = torch.nn.parallel.DistributedDataParallel(EveryParameterUsed(model), device_ids=[rank] if cuda else None)
    train_cfg = TrainConfig.from_dict({"lr": 3e-3, "epochs": args.epochs, "batch_size": args.batch_size,
                                       "bptt_sentences": 8, "lr_schedule": "constant"})
    optimizer = build_optimizer(model, train_cfg)
    rows = list(prepared.iter_rows("train"))[rank::world]
    valid_rows = list(prepared.iter_rows("valid"))
    for epoch in range(1, args.epochs + 1):
        batches = [b.to(device) for b in batch_documents(rows, spec, train_cfg.batch_size, seed=epoch)]
        sync()
        start, tokens, losses = time.perf_counter(), 0, []
        with GpuSampler() as util, autocast():
            for batch in batches:
                out = train_step(ddp, batch, optimizer, train_cfg)
                tokens += out["tokens"]
                losses.append(out["loss"])
            sync()
        seconds = time.perf_counter() - start
        with autocast():
            valid = evaluate(ddp, [b.to(device) for b in batch_documents(valid_rows, spec, 16, sort_by_length=True)])
        checksum = torch.tensor([sum(float(p.detach().double().sum()) for p in model.parameters())], device=device)
        gathered = [torch.zeros_like(checksum) for _ in range(world)]
        dist.all_gather(gathered, checksum)
        if rank == 0:
            same = all(torch.equal(g, gathered[0]) for g in gathered)
            print(f"[{args.model}] epoch {epoch}: train loss {sum(losses) / len(losses):.3f}  valid ppl {valid['ppl']:.2f}  "
                  f"re-appearing ppl {valid['ppl_reappearing']:.2f}  {tokens * world / seconds:,.0f} train tokens/s "
                  f"(world {world})  GPU util {util.mean if util.mean is not None else float('nan'):.0f}%  params equal across ranks: {same}", flush=True)
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
