"""Ray Train V2 DDP training of a dynlm model over prepared Parquet shards.

Three levels (Ray's own layout)::

    train_fn_per_worker(config)   one DDP rank: restore -> dynlm.training.fit(shard batches) -> report
    run_training(job, prepared)   the driver: MLflow run, TorchTrainer.fit(), best checkpoint, registry
    dynlm train                   the command line (pipelines/commands/train.py)

Data. Each worker streams its shard of ``train`` with ``ray.train.get_dataset_shard`` (Ray Data
reads the Parquet files; nothing is loaded whole on the driver). A train split that takes at most
``CACHE_STORE_FRACTION`` of the object store is read once into it (``run.cache_train_split``,
:func:`caches_train_split`): every epoch then reads blocks already there instead of starting a
new read (seconds per epoch on a small corpus). Cached, the split is also cut once, on the
driver, into one equal part per rank (``Dataset.split(equal=True)``: block references, no rows
pass through the driver), handed to the workers in ``train_loop_config`` (:func:`cached_splits`):
Ray Train's streaming split would start a split-coordinator actor (a new process) in every
training and Tune trial before the first batch. One row is one document, so a
document never straddles two ranks. Rows are buffered ``dynlm.runner.SORT_BUFFER_BATCHES`` batches at a time
and grouped by length (:func:`dynlm.data.batching.batch_documents`); the padding waste is
reported per epoch. ``valid`` is a Ray Dataset too, not split (``DataConfig(datasets_to_split=
["train"])``), read in file order and cached beside the train split: every rank iterates it and
evaluates the rows ``index % world_size == rank``, then NLL sums and counts are all-reduced, so
every rank reports the same perplexities, no validation document is dropped, and the result does
not depend on the number of workers. No rank opens a file the driver named: the nodes need to
share only the object store (and ``storage_path`` for checkpoints).

Uneven inputs. Ranks get different numbers of batches, and a batch of long documents has more
truncated-BPTT chunks than one of short documents. The loop (:func:`dynlm.training.fit`, the
same for one process and for every rank) runs the ranks in lockstep: see
:func:`dynlm.training.train_one_epoch`. The process group has a finite timeout, so a bug there
fails the attempt instead of hanging it.

Checkpoints. Rank 0 writes ``model.pt`` (:func:`dynlm.checkpoint.save`: state_dict, model
config, VocabSpec, and in ``extra`` the optimizer/scheduler state, epoch, history and
early-stopping state) plus a copy of ``preprocessor.json``, and reports it every epoch.
``CheckpointConfig`` keeps the best by ``valid_objective`` (the task's primary metric) plus the latest. A restarted attempt
(``FailureConfig``) or a resumed run (same name and storage path) starts from
``ray.train.get_checkpoint()`` (its :class:`dynlm.training.FitState`); RNG streams are re-seeded
from (seed, epoch, rank) at every epoch, so a resumed run repeats the uninterrupted one.
"""

from __future__ import annotations

import json
import os
import posixpath
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pyarrow.fs as pafs
import torch

from dynlm import checkpoint as dynlm_checkpoint
from dynlm import faults, storage
from dynlm.config import Config, ConfigError, seconds_from_env
from dynlm.data.prepared import PreparedData
from dynlm.distributed import all_gather_strings
from dynlm.job import JobConfig, ResourcesError, RunSettings, missing_resources, with_worker_cpus
from dynlm.runner import build_rank_run, total_steps
from dynlm.training import FitHooks, FitState, optimizer_steps

PROCESS_GROUP_TIMEOUT_S = 600  # a desynchronised collective fails the attempt after this
CHECKPOINT_FILE = "model.pt"
RUN_INFO_FILE = "dynlm_run.json"  # under <storage>/<name>: MLflow run id + job, for --resume
RESOURCE_WAIT_ENV = "DYNLM_RESOURCE_WAIT_S"  # how long a cluster may take to offer the workers
DEFAULT_RESOURCE_WAIT_S = 600.0
RESOURCE_POLL_S = 5.0
CACHE_STORE_FRACTION = 0.1  # run.cache_train_split=auto caches a train split up to this share of the object store
# Ray Train's controller polls its workers every $RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (Ray's default
# 2 s), and a run's end is seen at the next poll: 0.5 s unless the user set it (a bare 2-worker
# fit() took 15.9-19.3 s against 19.8-22.2 s on 2 cores, benchmarks/results/fixed_costs.md).
POLL_ENV, POLL_INTERVAL_S = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5"
_READ_CONTEXT_LOCK = threading.Lock()  # read_split's change of Ray Data's process-wide context
FOOTER_ACTORS_FROM_FILES = 64  # a split of more files has its Parquet footers read on actors (read_split)
CACHED_SPLITS_KEY = "cached_splits"  # train_loop_config: the cached splits' datasets (cached_splits)


class InjectedFault(RuntimeError):
    """Raised by fault injection (``run.fail_at_epoch``); Ray Train restarts the worker group."""


@dataclass
class WorkerSettings(Config):
    """The ``train_loop_config`` of :func:`train_fn_per_worker` (strict: a typo raises)."""

    job: dict[str, Any]
    prepared_root: str
    run_dir: str  # <storage>/<name>: fault markers live here
    mlflow_run_id: str | None = None
    tracking_uri: str | None = None
    total_steps: int = 1  # optimizer steps of the whole run (cosine schedule length)
    num_train_documents: int = 0  # in the prepared train split (to report what the split drops)
    progress_relay: str | None = None  # named actor of pipelines.console.TrainingConsole (rank 0 reports to it)


@dataclass
class TrainingResult:
    """What :func:`run_training` returns.

    Attributes:
        run_id: the MLflow run.
        best_checkpoint_dir: folder of the best checkpoint (lowest ``valid_objective``).
        best_valid_objective: its validation objective (the task's ``primary_metric``).
        metrics: the metrics of the best epoch.
        epochs: epochs completed (fewer than train.epochs after early stopping).
        model_version: registry version (None when run.register is false).
        history: one metrics dict per completed epoch, epochs 1..epochs.
        run_path: the Ray Train run folder (storage_path/name).
        param_checksums: per rank, the parameter checksum after the last epoch.
    """

    run_id: str | None
    best_checkpoint_dir: str | None
    best_valid_objective: float
    metrics: dict
    epochs: int
    model_version: str | None = None
    history: list[dict] = field(default_factory=list)
    run_path: str | None = None
    param_checksums: list[float] = field(default_factory=list)




# ---------------------------------------------------------------------------------------------
# Per-worker pieces (the loop itself is dynlm.training.fit)
# ---------------------------------------------------------------------------------------------


def _shard_rows(shard, buffer_rows: int) -> Iterator[dict]:
    """Rows of a Ray Data shard as plain dicts (Arrow batches; ragged lists stay lists)."""
    for table in shard.iter_batches(batch_size=buffer_rows, batch_format="pyarrow"):
        yield from table.to_pylist()


def maybe_inject_fault(run: RunSettings, run_dir: str, epoch: int, rank: int) -> None:
    """Raise :class:`InjectedFault` once (a marker file under ``run_dir`` remembers it)."""
    if run.fail_at_epoch != epoch or run.fail_rank != rank:
        return
    marker = storage.join(run_dir, f"fault_injected_epoch{epoch}_rank{rank}")
    if storage.exists(marker):
        return
    storage.write_text(marker, f"injected at {time.time()}\n")
    raise InjectedFault(f"fault injection: rank {rank} fails in epoch {epoch} (run.fail_at_epoch)")


def committed_checkpoints(run_dir: str) -> list[str]:
    """Names (``epoch_0003``) of the checkpoints Ray Train has committed for the run in
    ``run_dir``, read with its public ``ray.train.Result.from_path``; [] before the first."""
    import ray.train

    try:
        result = ray.train.Result.from_path(run_dir)
    except Exception:  # no committed state yet (RuntimeError), or its file is being replaced
        return []
    kept = [checkpoint for checkpoint, _ in result.best_checkpoints]
    if result.checkpoint is not None:
        kept.append(result.checkpoint)
    return sorted({posixpath.basename(checkpoint.path.rstrip("/")) for checkpoint in kept})


def kill_after_commit(run_dir: str, epoch: int, timeout_s: float = 300.0) -> None:
    """The ``train:checkpoint_committed`` kill point (:mod:`dynlm.faults`): once Ray Train's run
    state names ``epoch``'s checkpoint (the controller commits it asynchronously, so wait for it),
    SIGKILL the driver. A no-op unless armed."""
    if not faults.is_armed("train:checkpoint_committed"):
        return
    name = f"epoch_{epoch:04d}"
    deadline = time.monotonic() + timeout_s
    while name not in committed_checkpoints(run_dir):
        if time.monotonic() > deadline:
            raise TimeoutError(f"fault injection: {name} was not committed within {timeout_s:.0f} s")
        time.sleep(0.5)  # each look reads Ray Train's state from storage (Result.from_path)
    faults.kill_point("train:checkpoint_committed")


def load_initial_weights(model: torch.nn.Module, job: JobConfig, spec, source: str) -> None:
    """Warm start: copy the weights of a dynlm checkpoint file (path or URI) into ``model``.

    Only the weights: optimizer, schedule and epoch count start fresh. The checkpoint's model
    config and VocabSpec must equal the job's (same architecture, same vocabulary).
    """
    with tempfile.TemporaryDirectory() as tmp:
        local = source
        if storage.is_uri(source):
            local = str(Path(tmp) / CHECKPOINT_FILE)
            storage.copy(source, local)
        loaded, model_cfg, loaded_spec, _ = dynlm_checkpoint.load(local)
    if model_cfg != job.model:
        raise ValueError(f"run.init_checkpoint {source}: model config {model_cfg.to_dict()} differs "
                         f"from the job's {job.model.to_dict()}")
    if loaded_spec.to_dict() != spec.to_dict():
        raise ValueError(f"run.init_checkpoint {source}: its vocabulary {loaded_spec.to_dict()} differs "
                         f"from the prepared data's {spec.to_dict()} (prepare with its preprocessor)")
    model.load_state_dict(loaded.state_dict())


def _save_checkpoint(folder: Path, model, job: JobConfig, prepared: PreparedData, extra: dict) -> None:
    dynlm_checkpoint.save(folder / CHECKPOINT_FILE, model, job.model, prepared.spec, extra=extra, task=job.task)
    (folder / "preprocessor.json").write_bytes(prepared.read_bytes(prepared.manifest["preprocessor"]))


def _restore(core, optimizer, schedule, job: JobConfig, spec) -> FitState:
    """This attempt's starting point: Ray Train's latest checkpoint (a restarted attempt or a
    resumed run), else a warm start from ``run.init_checkpoint`` (weights only), else epoch 0."""
    import ray.train

    restored = ray.train.get_checkpoint()
    if restored is None:
        if job.run.init_checkpoint:  # warm start (e.g. a retrain from the champion): weights only
            load_initial_weights(core, job, spec, job.run.init_checkpoint)
        return FitState()
    with restored.as_directory() as folder:
        loaded, model_cfg, _, extra = dynlm_checkpoint.load(Path(folder) / CHECKPOINT_FILE)
    if model_cfg != job.model:
        raise ValueError(f"checkpoint model config {model_cfg.to_dict()} differs from the job's "
                         f"{job.model.to_dict()}; resume with the same model settings")
    core.load_state_dict(loaded.state_dict())
    optimizer.load_state_dict(extra["optimizer"])
    schedule.load_state_dict(extra["schedule"])
    return FitState.from_dict(extra["fit_state"])


def _report_epoch(record: dict, state: FitState, *, rank: int, core, optimizer, schedule, job: JobConfig,
                  prepared: PreparedData, settings: WorkerSettings, note) -> None:
    """Rank 0 logs the epoch to MLflow and writes the checkpoint; every rank reports to Ray.

    A tracking server that does not answer does not stop the training: the epoch's metrics stay
    in the checkpoint's history, and the driver logs them when the run ends (or on ``--resume``);
    ``note`` prints one line saying so.
    """
    import ray.train

    if rank == 0 and settings.mlflow_run_id:
        from pipelines import tracking

        down = tracking.try_log_epoch_metrics(settings.mlflow_run_id, record["epoch"], record,
                                              tracking_uri=settings.tracking_uri)
        if down:
            note(f"[train] epoch {record['epoch']}: its metrics are not in MLflow yet ({down}); the checkpoint "
                 "keeps them, and they are logged when the run ends or on --resume")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if rank == 0:
            extra = {"fit_state": state.to_dict(), "optimizer": optimizer.state_dict(),
                     "schedule": schedule.state_dict(), "job": job.to_dict(), "valid_objective": record["valid_objective"]}
            _save_checkpoint(Path(tmp), core, job, prepared, extra)
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(record, checkpoint=checkpoint, checkpoint_dir_name=f"epoch_{record['epoch']:04d}")


@contextmanager
def _system_metrics(rank: int, settings: WorkerSettings, job: JobConfig) -> Iterator[None]:
    """On rank 0 of a tracked run: MLflow's system metrics while the block runs (``run.system_metrics_s``)."""
    if rank != 0 or not settings.mlflow_run_id or job.run.system_metrics_s <= 0:
        yield
        return
    from pipelines import tracking

    monitor = tracking.start_system_metrics(settings.mlflow_run_id, job.run.system_metrics_s,
                                            tracking_uri=settings.tracking_uri)
    try:
        yield
    finally:
        monitor.stop()  # bounded: the server may be gone


def train_fn_per_worker(config: dict) -> dict | None:
    """One DDP rank of a Ray Train V2 run (``train_loop_config`` = :class:`WorkerSettings` dict):
    restore, run :func:`dynlm.training.fit` on this rank's shard, report every epoch.

    Returns:
        On rank 0: ``{"history": [...], "param_checksums": [one per rank]}``; None elsewhere.
    """
    import ray.train
    import ray.train.torch

    from pipelines.console import EpochProgress

    cached = config.get(CACHED_SPLITS_KEY)  # {"train": one dataset per rank, "valid": dataset} or None
    settings = WorkerSettings.from_dict({k: v for k, v in config.items() if k != CACHED_SPLITS_KEY})
    job = JobConfig.from_dict(settings.job)
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    if settings.tracking_uri:
        os.environ["MLFLOW_TRACKING_URI"] = settings.tracking_uri
    prepared = PreparedData.open(settings.prepared_root)
    spec, task = prepared.spec, job.get_task()

    if job.run.cpus_per_worker != "auto":  # resolved by run_training: the CPUs its bundle reserved
        torch.set_num_threads(max(1, int(job.run.cpus_per_worker)))
    if cached is not None:
        train_shard, valid_data = cached["train"][rank], cached["valid"]
    else:
        train_shard, valid_data = ray.train.get_dataset_shard("train"), ray.train.get_dataset_shard("valid")
    run = build_rank_run(job, spec, train_rows=lambda buffer_rows: _shard_rows(train_shard, buffer_rows),
                         valid_rows=lambda buffer_rows: _shard_rows(valid_data, buffer_rows), steps=settings.total_steps,
                         rank=rank, world_size=world, device=device)
    core, optimizer, schedule = run.model, run.optimizer, run.schedule
    # One worker: no DDP, so no anchor needed (prepare_model only moves the model then).
    model = ray.train.torch.prepare_model(task.wrap_for_ddp(core) if world > 1 else core)
    state = _restore(core, optimizer, schedule, job, spec)
    first_epoch = state.epoch + 1  # of this attempt
    node_ids = ",".join(all_gather_strings(ray.get_runtime_context().get_node_id()))

    def on_epoch(epoch: int, record: dict) -> None:
        # Ray's equal split drops the last (< world_size) rows of an uneven epoch; say so
        record["train_documents_dropped"] = settings.num_train_documents - record["train_documents"]
        record["worker_node_ids"] = node_ids  # Ray node of each rank (not an MLflow metric)
        if rank == 0 and record["train_documents_dropped"] and epoch == first_epoch:
            progress.note(f"[train] note: {record['train_documents_dropped']} of {settings.num_train_documents} "
                          f"training documents are left out of every epoch (Ray Data's equal split over {world} "
                          "workers drops the remainder)")
        progress.end_epoch(record)
        _report_epoch(record, state, rank=rank, core=core, optimizer=optimizer, schedule=schedule, job=job,
                      prepared=prepared, settings=settings, note=progress.note)

    def after_step(epoch: int, totals: dict) -> None:
        maybe_inject_fault(job.run, settings.run_dir, epoch, rank)
        if rank == 0 and epoch > first_epoch:
            kill_after_commit(settings.run_dir, epoch - 1)
        progress.step(totals)

    progress = EpochProgress(settings.progress_relay if rank == 0 else None, world)
    hooks = FitHooks(rank=rank, spec=spec, restore_best=False, on_epoch_start=progress.start_epoch,
                     autocast_dtype=torch.bfloat16 if (job.run.bf16 and device.type == "cuda") else None,
                     after_step=after_step)
    with _system_metrics(rank, settings, job):
        summary = run.fit(wrapped=model, state=state, hooks=hooks, on_epoch=on_epoch)
    if rank == 0:
        return {"history": summary["history"], "param_checksums": summary["param_checksums"]}
    return None


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def _steps_per_epoch(job: JobConfig, prepared: PreparedData) -> int:
    """Optimizer steps per rank of one epoch (the progress bar's length)."""
    task = job.get_task()
    chunks = task.steps_per_epoch(prepared, job.train, job.run.num_workers, layout=task.batch_layout(job.train, job.model))
    return optimizer_steps(chunks, job.train.accumulate_steps)


def _has_run(run_dir: str) -> bool:
    """True when a dynlm training was started in ``run_dir`` (its :data:`RUN_INFO_FILE`)."""
    return storage.exists(storage.join(run_dir, RUN_INFO_FILE))


def resolve_run(run: RunSettings, model_type: str) -> tuple[str, bool]:
    """The Ray Train run name and whether it continues an earlier run.

    Without ``resume``, the name (given or ``<model type>-<time>``) must be new: Ray Train V2
    silently continues a run whose folder holds checkpoints, so that is an error here. With
    ``resume``, the named run (or, without a name, the most recently started run under
    storage_path) must exist. A run is dynlm's own file in its folder (:data:`RUN_INFO_FILE`,
    written before Ray Train starts), not Ray Train's internal state.
    """
    root = run.storage_uri()
    if not run.resume:
        name = run.name or f"{model_type}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        if _has_run(storage.join(root, name)):
            raise FileExistsError(f"run {name!r} already exists under {root}; pass --resume to "
                                  "continue it or choose another run.name")
        return name, False
    if run.name is not None:
        if not _has_run(storage.join(root, run.name)):
            raise FileNotFoundError(f"--resume: no run {run.name!r} under {root}")
        return run.name, True
    runs = [name for name in storage.list_dirs(root) if _has_run(storage.join(root, name))]
    if not runs:
        raise FileNotFoundError(f"--resume: no dynlm run under {root}")
    return max(runs, key=lambda name: storage.mtime(storage.join(root, name, RUN_INFO_FILE))), True


def _write_run_info(run_dir: str, info: dict) -> None:
    storage.write_text(storage.join(run_dir, RUN_INFO_FILE), json.dumps(info, indent=1))


def _read_run_info(run_dir: str) -> dict | None:
    path = storage.join(run_dir, RUN_INFO_FILE)
    return json.loads(storage.read_text(path)) if storage.exists(path) else None


def build_trainer(job: JobConfig, prepared: PreparedData, name: str, settings: WorkerSettings, *,
                  tune_callback: bool = False):
    """The TorchTrainer of a job (datasets stream from the prepared Parquet files)."""
    import ray.data
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    run = job.run
    os.environ.setdefault(POLL_ENV, POLL_INTERVAL_S)  # read by TorchTrainer (passed to its controller)
    options = ray.train.DataConfig.default_ingest_options()
    options.preserve_order = True  # deterministic shards: same seed, same result
    callbacks = []
    if tune_callback:
        from ray.tune.integration.ray_train import TuneReportCallback

        callbacks.append(TuneReportCallback())
    datasets = {}
    for split in ("train", "valid"):
        data = read_split(prepared, split)
        data.context.enable_progress_bars = False  # one bar per worker per epoch is noise
        data.context.execution_options.preserve_order = True  # valid: every rank sees one order
        datasets[split] = data
    loop_config = settings.to_dict()
    if caches_train_split(run, prepared):  # valid is smaller: cached with it
        loop_config[CACHED_SPLITS_KEY] = cached_splits(datasets["train"], datasets["valid"], run.num_workers)
        datasets = {}
    # CPUs only: use_gpu=True already gives each worker one GPU (a "GPU" key here asked twice)
    resources = {"CPU": run.cpus_per_worker}
    return TorchTrainer(
        train_fn_per_worker,
        train_loop_config=loop_config,
        torch_config=TorchConfig(backend="nccl" if run.use_gpu else "gloo", timeout_s=PROCESS_GROUP_TIMEOUT_S),
        scaling_config=ray.train.ScalingConfig(num_workers=run.num_workers, use_gpu=run.use_gpu,
                                               resources_per_worker=resources),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=run.storage_uri(),
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=1, checkpoint_score_attribute="valid_objective", checkpoint_score_order="min"),
            failure_config=ray.train.FailureConfig(max_failures=run.max_failures),
            callbacks=callbacks,
        ),
        datasets=datasets,
        dataset_config=ray.train.DataConfig(datasets_to_split=["train"], execution_options=options),
    )


def cached_splits(train, valid, num_workers: int) -> dict:
    """``train`` and ``valid`` read into the object store, ``train`` cut into ``num_workers``
    equal parts in order (the last ``len % num_workers`` rows are dropped, as Ray Train's equal
    split does): ``{"train": [one MaterializedDataset per rank], "valid": MaterializedDataset}``.

    Each part is a list of block references: a worker iterates its own every epoch, with no
    split coordinator between (Ray Train's ``streaming_split`` starts one, a new actor process,
    in every training: 2-3 s before the first batch on 2 cores).
    """
    return {"train": train.materialize().split(num_workers, equal=True), "valid": valid.materialize()}


def read_split(prepared: PreparedData, split: str):
    """``split`` of ``prepared`` as a lazy Ray Data dataset (local paths or URIs; the filesystem
    carries the store's settings: endpoint, region).

    A split of at most :data:`FOOTER_ACTORS_FROM_FILES` files is read by Ray Data's first Parquet
    datasource, which reads the footers of a few files where the plan is made: Ray 2.60's
    default datasource (V2) starts a footer-reader actor (a new process) for every read, 0.95 s
    against 0.07 s for a one-file split read and materialized on a local 2-CPU Ray
    (2026-12-07), paid twice by every training and every Tune trial. A larger split keeps V2,
    whose footer readers spread the reads of many files over the cluster.
    """
    import ray.data

    files = [str(p) for p in prepared.files(split)]
    context = ray.data.DataContext.get_current()  # the process's: read_parquet consults it
    with _READ_CONTEXT_LOCK:  # concurrent trainings in one process (two retrains in threads)
        default, bars = context.use_datasource_v2, context.enable_progress_bars
        context.use_datasource_v2 = default and len(files) > FOOTER_ACTORS_FROM_FILES
        context.enable_progress_bars = False  # the first datasource's "Parquet dataset sampling" bar
        try:
            return ray.data.read_parquet(files, filesystem=prepared.filesystem)
        finally:
            context.use_datasource_v2, context.enable_progress_bars = default, bars


def caches_train_split(run: RunSettings, prepared: PreparedData) -> bool:
    """Whether the train split is read once into Ray's object store (``run.cache_train_split``).

    Streamed, every epoch is a new Ray Data execution: read tasks start, the first block reaches
    the workers seconds later (2-10 s per epoch measured on 2 cores for a 24-document corpus).
    Cached, an epoch splits blocks already in the object store (0.1 s). ``auto`` caches a split
    whose Arrow data (Parquet metadata, uncompressed) takes at most ``CACHE_STORE_FRACTION`` of
    the cluster's object store; a larger one streams, so memory stays bounded.
    """
    import ray

    if run.cache_train_split != "auto":
        return run.cache_train_split == "always"
    store = ray.cluster_resources().get("object_store_memory", 0.0)
    return prepared.split_bytes("train") <= CACHE_STORE_FRACTION * store


def check_workers_fit(run: RunSettings) -> None:
    """Make sure the Ray cluster can hold the workers of ``run`` before any of them starts.

    On a Ray this process started (this machine's CPUs and GPUs are all there is) a shortfall
    fails at once. On a cluster dynlm joined, an autoscaler may add nodes: the workers' bundles
    are requested from it (``ray.autoscaler.sdk.request_resources``) and this waits, saying for
    what, up to ``$DYNLM_RESOURCE_WAIT_S`` seconds (default 600).

    Raises:
        ResourcesError: a one-line reason naming the settings (``run.use_gpu``,
            ``run.num_workers``, ``run.cpus_per_worker``) that fix it.
    """
    import ray

    from pipelines.ray_env import started_here

    def shortfall() -> str | None:
        resources = ray.cluster_resources()
        return missing_resources(run, resources.get("CPU", 0.0), resources.get("GPU", 0.0))

    problem = shortfall()
    if problem is None:
        return
    if started_here():
        raise ResourcesError(problem)
    from ray.autoscaler.sdk import request_resources

    wait_s = seconds_from_env(RESOURCE_WAIT_ENV, DEFAULT_RESOURCE_WAIT_S)
    bundle = {"CPU": run.cpus_per_worker, **({"GPU": 1} if run.use_gpu else {})}
    request_resources(bundles=[bundle] * run.num_workers)
    print(f"[train] waiting up to {wait_s:g} s (${RESOURCE_WAIT_ENV}) for the cluster's autoscaler to "
          f"offer {run.num_workers} x {bundle}: {problem}", flush=True)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(min(RESOURCE_POLL_S, max(deadline - time.monotonic(), 0.0)))
        problem = shortfall()
        if problem is None:
            return
    raise ResourcesError(f"{problem} (the cluster did not offer them within {wait_s:g} s, ${RESOURCE_WAIT_ENV})")


def _mark_ended_early(run_id: str, uri: str, exc: BaseException) -> None:
    """Close the MLflow run of a training that did not finish: KILLED on Ctrl-C, else FAILED,
    with the error as the tag ``dynlm.error``. A tracking server that does not answer leaves
    the run RUNNING (``--resume`` closes it); the training's own error is what is raised."""
    from pipelines import tracking

    try:
        tracking.check_reachable(uri)
        tracking.end_run(run_id, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED",
                         tags={"dynlm.error": f"{type(exc).__name__}: {exc}"[:5000]}, tracking_uri=uri)
    except Exception as tracking_exc:
        if tracking.server_down_reason(tracking_exc) is None:
            raise


def _close_run(job: JobConfig, name: str, run_dir: str, run_id: str, uri: str, best, history: list[dict],
               prepared: PreparedData, best_dir) -> str | None:
    """Log the epochs the workers could not log, close the MLflow run, maybe register; return
    the registered version.

    Raises:
        TrainedButNotTracked: the tracking server does not answer. The checkpoints are Ray's, so
            nothing is lost: the one-line message names the command that finishes the job.
    """
    from pipelines import tracking

    try:
        tracking.check_reachable(uri)  # seconds; MLflow's own client retries for minutes
        late = tracking.log_missing_epochs(run_id, history, tracking_uri=uri)
        if late:
            print(f"[train] logged epochs {late} to MLflow now (the server did not answer then)", flush=True)
        tracking.finish_training_run(run_id, best_dir, prepared, history, tracking_uri=uri)
        if not job.run.register:
            return None
        registration = tracking.register_and_promote(run_id, best[1]["valid_objective"], metric=best[1]["objective_metric"],
                                                     margin=job.run.promotion_margin, tracking_uri=uri)
    except Exception as exc:
        reason = tracking.server_down_reason(exc)
        if reason is None:
            raise
        raise tracking.TrainedButNotTracked(
            f"run {name!r} trained {len(history)} epochs (checkpoints in {run_dir}) but the MLflow server {uri} "
            f"does not answer ({reason}), so its MLflow run is not closed and its model not registered; "
            f"when the server answers, run the same command with --set run.name={name} --resume "
            "(it trains nothing more: it logs and registers)") from exc
    print(f"[train] registered {registration.name} v{registration.version}: {registration.reason}")
    return registration.version


def run_training(job: JobConfig, prepared: PreparedData, *, parent_run_id: str | None = None,
                 tune_callback: bool = False, run_tags: dict[str, str] | None = None) -> TrainingResult:
    """Train ``job`` on ``prepared`` with Ray Train; track in MLflow; maybe register.

    Args:
        job: the job (``job.run`` says workers, storage, tracking, resume, fault injection).
        prepared: the prepared data folder (its Parquet files are streamed by Ray Data).
        parent_run_id: MLflow parent run (a Tune search).
        tune_callback: report every epoch to Ray Tune (inside a Tune trial).
        run_tags: more tags of the MLflow run (``dynlm.trial_id`` of a Tune trial).

    Returns:
        :class:`TrainingResult`.
    """
    from pipelines import tracking
    from pipelines.console import TrainingConsole
    from pipelines.ray_env import cluster_cpus, init_ray, started_here

    init_ray()
    if job.run.cpus_per_worker == "auto":  # a search resolves it for its trials (pipelines.tune)
        job = job.replace(run=with_worker_cpus(job.run, *cluster_cpus(), may_grow=not started_here()).to_dict())
    if not tune_callback:  # a search checks its trials before they start (dynlm.search.space)
        check_workers_fit(job.run)
    if not prepared.files("valid"):
        raise ValueError(f"{prepared.root}: the valid split holds no documents (early stopping needs it)")
    name, resuming = resolve_run(job.run, job.model_type)
    run_dir = f"{job.run.storage_uri()}/{name}"
    uri = tracking.tracking_uri(job.run.tracking_uri)
    info = _read_run_info(run_dir) if resuming else None
    if info is not None:
        if info["data_hash"] != job.data.data_hash():
            raise ConfigError(f"--resume: run {name!r} trained on data {info['data_hash']}, this job "
                              f"prepares {job.data.data_hash()} (resume with the run's data settings, or "
                              "train a new run without --resume)")
        run_id = info["mlflow_run_id"]
    else:
        run_id = tracking.start_training_run(job, prepared, parent_run_id=parent_run_id, run_name=name,
                                              tags=run_tags)
        _write_run_info(run_dir, {"mlflow_run_id": run_id, "tracking_uri": uri,
                                  "data_hash": job.data.data_hash(), "job": job.to_dict()})
    root = storage.absolute(prepared.root)  # a URI, or an absolute path
    settings = WorkerSettings(
        job=job.to_dict(), prepared_root=root, run_dir=run_dir,
        mlflow_run_id=run_id, tracking_uri=uri, num_train_documents=prepared.num_documents("train"),
        total_steps=total_steps(job, prepared))
    try:
        if tune_callback:  # a Tune trial: Tune reports progress
            result = build_trainer(job, prepared, name, settings, tune_callback=True).fit()
        else:
            steps_per_epoch = _steps_per_epoch(job, prepared)
            with TrainingConsole(job.train.epochs, steps_per_epoch) as training_console:
                settings = settings.replace(progress_relay=training_console.relay_name)
                result = build_trainer(job, prepared, name, settings).fit()
        if result.error is not None:
            raise result.error
    except BaseException as exc:
        if not tune_callback:  # in a Tune trial the search driver closes the run: it knows
            _mark_ended_early(run_id, uri, exc)  # whether the scheduler stopped the trial
        raise  # --resume sets the run running again
    output = result.return_value or {}
    history = output.get("history", [])
    best = min(result.best_checkpoints or [], key=lambda item: item[1]["valid_objective"], default=None)
    if best is None:
        raise RuntimeError(f"run {name!r} reported no checkpoint")
    checkpoint = best[0]  # its path is inside its filesystem: a local folder, or a key of an object store
    local = isinstance(checkpoint.filesystem, pafs.LocalFileSystem)
    best_dir = checkpoint.path if local else checkpoint.to_directory()  # remote: downloaded first
    version = _close_run(job, name, run_dir, run_id, uri, best, history, prepared, best_dir)
    return TrainingResult(run_id=run_id, best_checkpoint_dir=str(best_dir), best_valid_objective=best[1]["valid_objective"],
                          metrics=dict(best[1]), epochs=len(history), model_version=version, history=history,
                          run_path=result.path, param_checksums=output.get("param_checksums", []))
