"""Fixed costs of a small pipeline run: what a 24-document test (or a user's first try) pays.

Prints, in one run on one local Ray:
  prepare   the prepare job twice (the first pays the first Ray Data job's start-up): wall and
            its stages (read+parse, count+fit, encode+write). Until 2026-12-07 this compared
            the word-count groupby's shuffles; prepare has no groupby any more;
  train     ``run_training`` (2 workers, 3 epochs) with the train split streamed every epoch
            (``run.cache_train_split=never``) and cached once in the object store (``always``):
            seconds of each epoch's training pass and the whole run's wall;
  poll      ``--poll``: a bare ``TorchTrainer.fit()`` (2 workers, gloo, one report) three times with
            Ray Train's default poll interval (2 s) and three times with dynlm's (0.5 s);
  local env ``--local-env``: a fresh local Ray (a child process each) with Ray's own settings and
            with dynlm's ``pipelines.ray_env.LOCAL_RAY_ENV`` (one Parquet footer reader, no
            preemption watcher): prepare, then three 2-worker 1-epoch trainings; wall of each,
            the actors Ray started, and the machine's busy CPU-seconds over the whole child
            (Ray included; run it on a quiet machine).

Usage::

    .venv/bin/python benchmarks/bench_fixed_costs.py                   # synthetic, 24 documents
    .venv/bin/python benchmarks/bench_fixed_costs.py --corpus litbank  # 24 LitBank documents
    .venv/bin/python benchmarks/bench_fixed_costs.py --poll            # the poll interval only
    .venv/bin/python benchmarks/bench_fixed_costs.py --local-env       # Ray's settings vs dynlm's

The LitBank documents are real (ragged sentences, long chains); read from ``../shared/data``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

LITBANK = Path(__file__).resolve().parents[2] / "shared" / "data" / "litbank" / "conll"


def corpus(kind: str, folder: Path, docs: int) -> Path:
    out = folder / "inputs"
    if kind == "synth":
        from dynlm.data.synth import SynthConfig, write_conll

        write_conll(SynthConfig(num_documents=docs, docs_per_file=12), out)
    else:
        out.mkdir(parents=True)
        for path in sorted(LITBANK.glob("*"))[:docs]:
            shutil.copy(path, out / path.name)
    return out


def job_for(inputs: Path, folder: Path, *overrides: str):
    from pipelines.defaults import default_job

    return default_job([
        f"data.inputs=[{inputs}]", f"data.output_root={folder / 'prepared'}", "data.vocab_size=300",
        "data.num_encode_actors=1", "model.embed_dim=16", "model.hidden_dim=16", "train.epochs=3",
        "train.batch_size=4", "train.early_stopping_patience=0", f"run.storage_path={folder / 'ray'}",
        "run.register=false", "run.num_workers=2", *overrides])


def _report_once(config) -> None:
    import ray.train

    ray.train.report({"done": 1})


def bare_fits(folder: Path) -> None:
    """Three bare 2-worker fits per poll interval (the controller reads the variable at fit())."""
    import os

    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from pipelines.train import POLL_ENV, POLL_INTERVAL_S

    print("| RAY_TRAIN_HEALTH_CHECK_INTERVAL_S | fit 1 s | fit 2 s | fit 3 s |")
    print("|---|---|---|---|")
    for interval in ("2", POLL_INTERVAL_S):
        os.environ[POLL_ENV] = interval
        seconds = []
        for attempt in range(3):
            started = time.perf_counter()
            TorchTrainer(_report_once, torch_config=TorchConfig(backend="gloo"),
                         scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                         run_config=ray.train.RunConfig(storage_path=str(folder / "bare"),
                                                        name=f"poll-{interval}-{attempt}")).fit()
            seconds.append(time.perf_counter() - started)
        print(f"| {interval} | " + " | ".join(f"{s:.1f}" for s in seconds) + " |")


def _busy_cpu_seconds() -> float:
    """CPU-seconds this machine has spent busy since boot (/proc/stat, all cores): run on a quiet
    machine, the difference around a child is what the child and its Ray cost."""
    import os

    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def local_env_child(settings: str, corpus_kind: str, docs: int) -> None:
    """One fresh local Ray with ``settings`` (``ray`` or ``dynlm``): prepare, three trainings."""
    import collections
    import contextlib
    import io
    import os

    import ray
    from ray.util.state import list_actors

    from pipelines.prepare import prepare
    from pipelines.ray_env import LOCAL_RAY_ENV, claim_address_file, export_local_ray_env
    from pipelines.train import run_training

    for key in LOCAL_RAY_ENV:
        os.environ.pop(key, None)
    if settings == "dynlm":
        export_local_ray_env()
    folder = Path(tempfile.mkdtemp(prefix="bench-env-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
    os.environ["DYNLM_MLFLOW_ARTIFACTS"] = str(folder / "artifacts")
    ray.init(address="local", num_cpus=2, include_dashboard=True, log_to_driver=False)
    claim_address_file()
    inputs = corpus(corpus_kind, folder, docs)
    job = job_for(inputs, folder, "train.epochs=1")
    with contextlib.redirect_stdout(io.StringIO()):  # prepare's summary table
        prepared = prepare(job.data, progress=False)
    seconds = []
    for attempt in range(3):
        started = time.perf_counter()
        run_training(job_for(inputs, folder, "train.epochs=1", f"run.name=env-{attempt}"), prepared)
        seconds.append(time.perf_counter() - started)
    actors = collections.Counter(a.class_name for a in list_actors(limit=10_000, raise_on_missing_output=False))
    per_run = {name: actors[name] for name in ("FooterReader", "PreemptionWatcher", "TrainController")}
    print(f"| {'Ray defaults' if settings == 'ray' else 'dynlm LOCAL_RAY_ENV'} | "
          + " | ".join(f"{s:.1f}" for s in seconds) + f" | {per_run['FooterReader']} | "
          f"{per_run['PreemptionWatcher']} | {sum(actors.values())} | ", end="", flush=True)
    ray.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


def local_env(corpus_kind: str, docs: int) -> None:
    import subprocess
    import sys

    print(f"corpus: {corpus_kind}, {docs} documents; 2 CPUs; a fresh local Ray per row\n")
    print("| settings | training 1 s | training 2 s | training 3 s | FooterReader actors | PreemptionWatcher actors "
          "| actors in all | machine CPU-s (Ray start, prepare, 3 trainings) | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for settings in ("ray", "dynlm", "ray", "dynlm"):
        busy, started = _busy_cpu_seconds(), time.perf_counter()
        subprocess.run([sys.executable, __file__, "--corpus", corpus_kind, "--docs", str(docs),
                        "--local-env-child", settings], check=True, stderr=subprocess.DEVNULL)
        print(f"{_busy_cpu_seconds() - busy:.0f} | {time.perf_counter() - started:.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=("synth", "litbank"), default="synth")
    parser.add_argument("--docs", type=int, default=24)
    parser.add_argument("--poll", action="store_true", help="only the bare fits with both poll intervals")
    parser.add_argument("--local-env", action="store_true", help="only Ray's settings against LOCAL_RAY_ENV")
    parser.add_argument("--local-env-child", choices=("ray", "dynlm"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.local_env:
        return local_env(args.corpus, args.docs)
    if args.local_env_child:
        return local_env_child(args.local_env_child, args.corpus, args.docs)

    import os

    import ray

    import pipelines.prepare as prepare_module
    from pipelines.ray_env import claim_address_file
    from pipelines.train import run_training

    folder = Path(tempfile.mkdtemp(prefix="bench-fixed-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
    os.environ["DYNLM_MLFLOW_ARTIFACTS"] = str(folder / "artifacts")
    ray.init(address="local", num_cpus=2, include_dashboard=True, log_to_driver=False)
    claim_address_file()  # Train's placement-group cleaner finds the cluster through it
    if args.poll:
        bare_fits(folder)
        ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)
        return
    inputs = corpus(args.corpus, folder, args.docs)

    print(f"corpus: {args.corpus}, {args.docs} documents; 2 CPUs, one local Ray\n")
    print("| prepare try | wall s | read+parse s | count+fit s | encode+write s |")
    print("|---|---|---|---|---|")
    prepared = None
    merges = 30
    for attempt in (1, 2):
        merges += 1  # another folder every time: nothing reused
        job = job_for(inputs, folder, f"data.bpe_merges={merges}")
        started = time.perf_counter()
        prepared = prepare_module.prepare(job.data, progress=False)
        timings = prepared.manifest["timings_s"]
        print(f"| {attempt} | {time.perf_counter() - started:.1f} | {timings['read_parse']:.1f} | "
              f"{timings['count_and_fit']:.1f} | {timings['encode_write']:.1f} |")

    print("\n| train split | epoch 1 s | epoch 2 s | epoch 3 s | run wall s |")
    print("|---|---|---|---|---|")
    for cache in ("never", "always"):
        job = job_for(inputs, folder, f"data.bpe_merges={merges}", f"run.cache_train_split={cache}",
                      f"run.name=cache-{cache}")
        started = time.perf_counter()
        result = run_training(job, prepared)
        epochs = " | ".join(f"{r['train_seconds']:.1f}" for r in result.history)
        print(f"| {'streamed every epoch' if cache == 'never' else 'cached once'} | {epochs} | "
              f"{time.perf_counter() - started:.1f} |")
    ray.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
