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
  processes ``--processes [--against PATH]``: a fresh local Ray (dynlm's settings), prepare, one
            warm-up training, then two 2-worker 1-epoch trainings while every process of the
            machine is sampled from /proc every 0.1 s: wall per training, and per process kind
            (Ray's process title: ``ray::TrainController``, ``ray::IDLE``, ...) the processes
            started and the CPU-seconds spent. With ``--against PATH`` (a checkout of another
            commit, e.g. ``git worktree add /tmp/base HEAD~1``), PATH's code and this checkout's
            run alternately, twice each, in one command.

Usage::

    .venv/bin/python -m benchmarks.bench_fixed_costs                   # synthetic, 24 documents
    .venv/bin/python -m benchmarks.bench_fixed_costs --corpus litbank  # 24 LitBank documents
    .venv/bin/python -m benchmarks.bench_fixed_costs --poll            # the poll interval only
    .venv/bin/python -m benchmarks.bench_fixed_costs --local-env       # Ray's settings vs dynlm's
    .venv/bin/python -m benchmarks.bench_fixed_costs --processes --against /tmp/base  # what each process costs

The LitBank documents are real (ragged sentences, long chains); read from ``../shared/data``.
"""

from __future__ import annotations

import argparse
import json
import os
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
    from pipelines.ray_env import claim_address_file, export_local_ray_env, local_ray_env
    from pipelines.train import run_training

    for key in local_ray_env(2):
        os.environ.pop(key, None)
    if settings == "dynlm":
        export_local_ray_env(2)
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


def _process_kind(pid: int) -> str | None:
    """A process's kind: Ray's title (``ray::TrainController``, ``ray::IDLE``), a Ray daemon's
    name, or ``driver``/``other``; None when it is gone."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    if not command.strip():  # a zombie, or not yet exec'd
        return None
    if "ray::" in command:  # ray::Class.method while an actor runs a method: the class
        return command[command.index("ray::"):].split(" ")[0].split(".")[0]
    for daemon in ("raylet", "gcs_server", "dashboard", "log_monitor", "default_worker", "runtime_env"):
        if daemon in command:
            return daemon
    return "driver" if pid == os.getpid() else "other"


def _telling(kind: str) -> int:
    """How much a process kind says: an actor's or task's title > ``ray::IDLE`` > the rest."""
    return 2 if kind.startswith("ray::") and kind != "ray::IDLE" else 1 if kind == "ray::IDLE" else 0


def _cpu_seconds() -> dict[int, float]:
    """pid -> user + system CPU-seconds of every process now."""
    tick, found = os.sysconf("SC_CLK_TCK"), {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    return found


def processes_child(corpus_kind: str, docs: int) -> None:
    """Prepare, one warm-up training, then two trainings sampled from /proc (module doc)."""
    import collections
    import contextlib
    import io
    import threading

    import ray

    from pipelines.prepare import prepare
    from pipelines.ray_env import start_local_ray
    from pipelines.train import run_training

    folder = Path(tempfile.mkdtemp(prefix="bench-proc-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
    os.environ["DYNLM_MLFLOW_ARTIFACTS"] = str(folder / "artifacts")
    start_local_ray(num_cpus=2, include_dashboard=False, log_to_driver=False)
    inputs = corpus(corpus_kind, folder, docs)
    with contextlib.redirect_stdout(io.StringIO()):  # prepare's summary, the trainings' epoch lines
        prepared = prepare(job_for(inputs, folder).data, progress=False)
        run_training(job_for(inputs, folder, "train.epochs=1", "run.name=warm-up"), prepared)
    before, kinds, last, done = _cpu_seconds(), {}, {}, threading.Event()

    def sample() -> None:
        while not done.is_set():
            for pid, cpu in _cpu_seconds().items():
                if pid not in before:  # the most telling title seen: a pooled worker is ray::IDLE before it runs an actor
                    kind = _process_kind(pid)
                    if kind and (pid not in kinds or _telling(kind) > _telling(kinds[pid])):
                        kinds[pid] = kind
                last[pid] = cpu
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    walls = []
    with contextlib.redirect_stdout(io.StringIO()):
        for attempt in range(2):
            started = time.perf_counter()
            run_training(job_for(inputs, folder, "train.epochs=1", f"run.name=measured-{attempt}"), prepared)
            walls.append(time.perf_counter() - started)
    done.set()
    sampler.join()
    started_by_kind, cpu_by_kind = collections.Counter(), collections.Counter()
    for pid, cpu in last.items():
        kind = kinds.get(pid) or _process_kind(pid) or "gone"
        started_by_kind[kind] += pid not in before
        cpu_by_kind[kind] += cpu - before.get(pid, 0.0)
    row = {"walls": walls, "processes": dict(started_by_kind),
           "cpu": {k: round(v, 2) for k, v in cpu_by_kind.items() if v >= 0.05}}
    print("RESULT " + json.dumps(row), flush=True)
    ray.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


def processes(corpus_kind: str, docs: int, against: str | None) -> None:
    import subprocess
    import sys

    here = str(Path(__file__).resolve().parents[1])
    checkouts = [against, here, against, here] if against else [here]
    rows = []
    for checkout in checkouts:
        commit = subprocess.run(["git", "-C", checkout, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        env = {**os.environ, "PYTHONPATH": checkout}  # the driver and (through it) Ray's workers
        out = subprocess.run([sys.executable, __file__, "--corpus", corpus_kind, "--docs", str(docs),
                              "--processes-child"], env=env, cwd=checkout, capture_output=True, text=True,
                             check=True).stdout
        row = json.loads(out.split("RESULT ", 1)[1])
        rows.append((commit, row))
        print(f"{commit}: trainings {' / '.join(f'{w:.1f}' for w in row['walls'])} s, "
              f"{sum(row['cpu'].values()):.0f} CPU-s", flush=True)
    kinds = sorted({k for _, row in rows for k in row["cpu"]}, key=lambda k: -max(r["cpu"].get(k, 0) for _, r in rows))
    print(f"\ncorpus: {corpus_kind}, {docs} documents; two 2-worker 1-epoch trainings per column (after a warm-up)\n")
    print("| process kind | " + " | ".join(f"{c} (run {i + 1}): started, CPU-s" for i, (c, _) in enumerate(rows)) + " |")
    print("|---|" + "---|" * len(rows))
    print("| wall of the two trainings, s | " + " | ".join(f"{sum(r['walls']):.1f}" for _, r in rows) + " |")
    print("| all processes, CPU-s | " + " | ".join(f"{sum(r['cpu'].values()):.1f}" for _, r in rows) + " |")
    for kind in kinds:
        print(f"| {kind} | " + " | ".join(f"{r['processes'].get(kind, 0)}, {r['cpu'].get(kind, 0.0):.1f}"
                                          for _, r in rows) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=("synth", "litbank"), default="synth")
    parser.add_argument("--docs", type=int, default=24)
    parser.add_argument("--poll", action="store_true", help="only the bare fits with both poll intervals")
    parser.add_argument("--local-env", action="store_true", help="only Ray's settings against LOCAL_RAY_ENV")
    parser.add_argument("--local-env-child", choices=("ray", "dynlm"), help=argparse.SUPPRESS)
    parser.add_argument("--processes", action="store_true", help="only the CPU of every process kind in two trainings")
    parser.add_argument("--against", help="--processes: a checkout of another commit, run alternately with this one")
    parser.add_argument("--processes-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.processes:
        return processes(args.corpus, args.docs, args.against)
    if args.processes_child:
        return processes_child(args.corpus, args.docs)
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
