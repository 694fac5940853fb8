"""``dynlm train``: prepare (or reuse) the data, then train with Ray Train DDP and track in MLflow.

Examples::

    dynlm train                                   # the embedded default job (synthetic corpus)
    dynlm train --config job.yaml --set model.dntm.merge_fn=max --num-workers 4
    dynlm train --use-gpu --num-workers 8         # NCCL, one GPU per worker (--set run.bf16=true: bf16 autocast)
    dynlm train --set run.name=exp1 --resume      # continue exp1 from its latest checkpoint
    dynlm train --local                           # one process, dynlm.training.fit, no Ray Train
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train", help="Ray Train DDP training, tracked in MLflow, registered as a challenger",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="job YAML (data/model/train/run sections); default: the embedded job")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. train.lr=1e-3 (repeatable)")
    parser.add_argument("--num-workers", type=int, help="Ray Train workers (run.num_workers)")
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per worker, NCCL (bf16 autocast with --set run.bf16=true)")
    parser.add_argument("--resume", action="store_true",
                        help="continue run.name (or the latest run under run.storage_path)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or ./mlflow.db)")
    parser.add_argument("--local", action="store_true",
                        help="debug: train in this process with dynlm.training.fit (no Ray Train, no MLflow)")
    parser.add_argument("--json", action="store_true",
                        help="stdout: one JSON object (run id, registered version, best objective, checkpoint, "
                             "per-epoch history); everything else goes to stderr")
    parser.set_defaults(func=run)


def job_from_args(args) -> "JobConfig":  # noqa: F821
    """The job of the command line: config file (or default) + --set + the flag shortcuts."""
    from pipelines.defaults import load_job

    overrides = list(args.overrides)
    if args.num_workers is not None:
        overrides.append(f"run.num_workers={args.num_workers}")
    if args.use_gpu:
        overrides.append("run.use_gpu=true")
    if args.resume:
        overrides.append("run.resume=true")
    if args.tracking_uri:
        overrides.append(f"run.tracking_uri={args.tracking_uri}")
    return load_job(args.config, overrides)


def run(args) -> int:
    from dynlm.progress import format_epoch_line
    from pipelines.defaults import ensure_synthetic_corpus

    job = job_from_args(args)
    if args.local:
        ensure_synthetic_corpus(job)
        return run_local(job)
    from pipelines import tracking
    from pipelines.prepare import prepare
    from pipelines.ray_env import init_ray
    from pipelines.train import check_workers_fit, run_training

    tracking.check_reachable(job.run.tracking_uri)  # seconds, not MLflow's minutes of retries
    ensure_synthetic_corpus(job)
    # --json: stdout holds the JSON object alone, what a script reads; the rest goes to stderr
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        init_ray()
        check_workers_fit(job.run)  # before preparing: a one-line error, or a stated wait on a cluster
        prepared = prepare(job.data, task=job.task, progress=False)
        result = run_training(job, prepared)
        for record in result.history:
            print("[train] " + format_epoch_line(record, job.train.epochs))
        print(f"[train] best valid {job.get_task().primary_metric} {result.best_valid_objective:.4g} "
              f"over {result.epochs} epochs; "
              f"checkpoint {result.best_checkpoint_dir}; MLflow run {result.run_id}"
              + (f"; registered version {result.model_version}" if result.model_version else ""))
        system = tracking.system_metrics_summary(result.run_id, tracking_uri=job.run.tracking_uri)
        if system:
            print(f"[train] system metrics of the run (rank 0's node): {system}")
    if args.json:
        from pipelines.tracking import json_safe

        print(json.dumps(json_safe({
            "run_id": result.run_id, "model_version": result.model_version, "task": job.task,
            "model_type": job.model_type, "objective_metric": job.get_task().primary_metric,
            "best_valid_objective": result.best_valid_objective, "epochs": result.epochs,
            "checkpoint": str(result.best_checkpoint_dir), "prepared": str(prepared.root), "history": result.history})))
    return 0


def run_local(job) -> int:
    """Single-process training for debugging: the same data, batching and model, no Ray at all
    (the data is prepared in this process: :func:`dynlm.tasks.local.prepare_local`, same folder)."""
    import tempfile

    import torch

    from dynlm import checkpoint, storage
    from dynlm.progress import format_epoch_line
    from dynlm.runner import local_run
    from dynlm.tasks.local import prepare_local

    task = job.get_task()
    prepared = prepare_local(job.data, task=task)
    device = torch.device("cuda" if job.run.use_gpu and torch.cuda.is_available() else "cpu")
    run = local_run(job, prepared, device=device)  # the Ray workers' runner, rank 0 of 1
    summary = run.fit(on_epoch=lambda epoch, record: print(
        "[train --local] " + format_epoch_line(record, job.train.epochs), flush=True))
    model, spec = run.model, run.spec
    name = job.run.name or f"local-{time.strftime('%Y%m%d-%H%M%S')}"
    path = storage.join(job.run.storage_uri(), name, "model.pt")  # run.storage_path may be a URI
    with tempfile.TemporaryDirectory() as tmp:
        local = checkpoint.save(Path(tmp) / "model.pt", model, job.model, spec, task=job.task,
                                extra={"history": summary["history"], "job": job.to_dict()})
        storage.copy(local, path)
    print(f"[train --local] best valid {task.primary_metric} {summary['best_valid_objective']:.2f} "
          f"(epoch {summary['best_epoch']}); checkpoint {path}")
    print(json.dumps({k: v for k, v in summary.items() if k != "history"}))
    return 0
