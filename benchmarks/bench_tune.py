"""Search overhead of ``dynlm tune``: a 4-trial search vs the same 4 trainings run one by one.

    .venv/bin/python -m benchmarks.bench_tune [--concurrency 2] [--epochs 2] [--num-cpus 2]

In one process: the synthetic corpus is written and prepared (2 data configs, not timed), then

1. a grid search of 4 trials (bpe_merges x merge_fn, FIFO scheduler so every trial trains every
   epoch) with ``--concurrency`` trials at once  -> wall time of the whole search;
2. the same 4 jobs through ``pipelines.train.run_training`` alone, one after the other
   -> the sum of their wall times.

Prints both, ``ratio = search wall / sum alone`` (below 1: concurrency pays; above 1: the
search machinery costs more than it overlaps), and ``overhead = search wall / (sum alone /
concurrency)`` (1.0 = a perfect overlap; the excess is Tune's own cost). Ideal numbers need
``concurrency x workers x cpus_per_worker`` free cores; on a shared 2-core machine expect
trials to slow each other down.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=2, help="max_concurrent_trials")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray (ignored on a cluster)")
    parser.add_argument("--cpus-per-worker", type=float, default=0.4)
    parser.add_argument("--documents", type=int, default=60, help="synthetic documents")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench_tune_"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow.db'}"
    os.environ["DYNLM_MLFLOW_ARTIFACTS"] = str(tmp / "mlartifacts")

    import ray

    from dynlm.data.prepared import PreparedData
    from dynlm.data.synth import SynthConfig, write_conll
    from dynlm.search.space import apply_params
    from dynlm.search.space_file import from_mapping
    from pipelines import tracking
    from pipelines.defaults import default_job
    from pipelines.ray_env import init_ray
    from pipelines.train import run_training
    from pipelines.tune import prepare_all, run_search

    init_ray(num_cpus=args.num_cpus, include_dashboard=True, log_to_driver=False)  # a fresh local Ray
    write_conll(SynthConfig(num_documents=args.documents, docs_per_file=20), tmp / "synth")
    space = from_mapping({
        "base": {
            "data.inputs": [str(tmp / "synth")], "data.output_root": str(tmp / "prepared"),
            "data.vocab_size": 300, "data.max_chains": 20, "data.num_encode_actors": 1,
            "model.embed_dim": 16, "model.hidden_dim": 16, "model.embedding": "word+subword", "model.subword_dim": 8,
            "train.epochs": args.epochs, "train.batch_size": 4, "train.early_stopping_patience": args.epochs,
            "run.num_workers": 1, "run.cpus_per_worker": args.cpus_per_worker, "run.max_failures": 0,
            "run.storage_path": str(tmp / "ray"),
        },
        "search": {"data.bpe_merges": {"grid": [0, 50]}, "model.dntm.merge_fn": {"grid": ["max", "latest"]}},
        "tune": {"num_samples": 1, "searcher": "grid", "scheduler": "fifo",
                 "max_concurrent_trials": args.concurrency},
    }, base_job=default_job(), source="bench_tune")
    prepared = prepare_all(space)  # not timed: both sides read the same prepared folders

    start = time.perf_counter()
    result = run_search(space, experiment="bench")
    search_wall = time.perf_counter() - start

    alone = []
    uri = tracking.tracking_uri()
    for i, trial in enumerate(result.trials):
        job = apply_params(space.base, trial.params)
        job = job.replace(run={**job.run.to_dict(), "name": f"alone-{i}", "register": False,
                               "storage_path": str(tmp / "ray"), "tracking_uri": uri})
        data = PreparedData.open(prepared[job.data.data_hash()])
        t0 = time.perf_counter()
        run_training(job, data)
        alone.append(time.perf_counter() - t0)

    total_alone = sum(alone)
    print()
    print(f"trials: {len(result.trials)} (epochs={args.epochs}, 1 worker x {args.cpus_per_worker} CPU each), "
          f"concurrency={args.concurrency}, ray CPUs={ray.cluster_resources().get('CPU')}")
    print(f"search wall time:        {search_wall:8.1f} s")
    print(f"sum of trainings alone:  {total_alone:8.1f} s  ({', '.join(f'{t:.1f}' for t in alone)})")
    print(f"ratio search/sum alone:  {search_wall / total_alone:8.2f}")
    print(f"overhead vs ideal overlap (search / (sum / concurrency)): "
          f"{search_wall / (total_alone / args.concurrency):.2f}")


if __name__ == "__main__":
    main()
