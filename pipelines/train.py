"""Ray Train V2 DDP training of a dynlm model over prepared Parquet shards.

Three levels (Ray's own layout)::

    train_fn_per_worker(config)   one DDP rank: shard -> batches -> dynlm.training.train_step -> report
    run_training(job, prepared)   the driver: MLflow run, TorchTrainer.fit(), best checkpoint, registry
    dynlm train                   the command line (pipelines/commands/train.py)

Data. Each worker streams its shard of ``train`` with ``ray.train.get_dataset_shard`` (Ray Data
reads the Parquet files; nothing is loaded whole on the driver). One row is one document, so a
document never straddles two ranks. Rows are buffered ``SORT_BUFFER_BATCHES`` batches at a time
and grouped by length (:func:`dynlm.data.batching.batch_documents`); the padding waste is
reported per epoch. ``valid`` is small and not a Ray Dataset (three concurrent Ray Data
executions starve each other on a 2-CPU machine): every rank streams the valid Parquet files
with pyarrow and evaluates the rows ``index % world_size == rank``, then NLL sums and counts
are all-reduced, so every rank reports the same perplexities and no validation document is
dropped. (The prepared folder must be on storage every node reads, like storage_path.)

Uneven inputs. Ranks get different numbers of batches, and a batch of long documents has more
truncated-BPTT chunks than one of short documents. DDP's ``join()`` would let a finished rank
skip optimizer steps, so its Adam state would drift from the others. Instead every rank takes
part in every step: before each step the ranks agree (one all-reduce) on the longest batch, a
shorter batch is padded with inactive sentence steps and a rank without data runs an inactive
dummy batch (zero loss, zero gradient). All ranks thus run the same forward/backward/optimizer
calls and stay bit-identical (the tests compare parameter checksums). The process group has
a finite timeout, so a bug here fails the attempt instead of hanging it.

Checkpoints. Rank 0 writes ``model.pt`` (:func:`dynlm.checkpoint.save`: state_dict, model
config, VocabSpec, and in ``extra`` the optimizer/scheduler state, epoch, history and
early-stopping state) plus a copy of ``preprocessor.json``, and reports it every epoch.
``CheckpointConfig`` keeps the best by ``valid_ppl`` plus the latest. A restarted attempt
(``FailureConfig``) or a resumed run (same name and storage path) starts from
``ray.train.get_checkpoint()``; RNG streams are re-seeded from (seed, epoch, rank) at every
epoch, so a resumed run repeats the uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

from dynlm import checkpoint as dynlm_checkpoint
from dynlm.distributed import EveryParameterUsed
from dynlm.config import Config
from dynlm.data.batching import DocumentBatch, SentenceBatch, batch_documents, collate_documents
from dynlm.data.prepared import PreparedData, is_uri
from dynlm.models import build_model
from dynlm.metrics import MetricAccumulator
from dynlm.optim import LRSchedule, build_optimizer
from dynlm.training import evaluate, train_step
from dynlm.vocab_spec import VocabSpec
from pipelines.config import JobConfig, RunSettings

SORT_BUFFER_BATCHES = 16  # rows buffered for length sorting = this x per-worker batch size
PROCESS_GROUP_TIMEOUT_S = 600  # a desynchronised collective fails the attempt after this
CHECKPOINT_FILE = "model.pt"
RUN_INFO_FILE = "dynlm_run.json"  # under <storage>/<name>: MLflow run id + job, for --resume
RAY_SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"  # Ray Train's run state


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


@dataclass
class TrainingResult:
    """What :func:`run_training` returns.

    Attributes:
        run_id: the MLflow run.
        best_checkpoint_dir: folder of the best checkpoint (lowest valid_ppl).
        best_valid_ppl: its validation perplexity.
        metrics: the metrics of the best epoch.
        epochs: epochs completed (fewer than train.epochs after early stopping).
        model_version: registry version (None when run.register is false).
        history: one metrics dict per completed epoch, epochs 1..epochs.
        run_path: the Ray Train run folder (storage_path/name).
        param_checksums: per rank, the parameter checksum after the last epoch.
    """

    run_id: str | None
    best_checkpoint_dir: str | None
    best_valid_ppl: float
    metrics: dict
    epochs: int
    model_version: str | None = None
    history: list[dict] = field(default_factory=list)
    run_path: str | None = None
    param_checksums: list[float] = field(default_factory=list)




# ---------------------------------------------------------------------------------------------
# Per-worker pieces
# ---------------------------------------------------------------------------------------------


def per_worker_batch_size(global_batch: int, world_size: int) -> int:
    """``train.batch_size`` is the global batch (documents); each rank takes its share."""
    size = global_batch // world_size
    if size < 1:
        raise ValueError(f"train.batch_size={global_batch} is smaller than run.num_workers={world_size}")
    return size


def iter_document_batches(rows: Iterator[dict], spec: VocabSpec, batch_size: int, *, seed: int,
                          buffer_rows: int) -> Iterator[DocumentBatch]:
    """Buffer ``buffer_rows`` rows, sort them by length, cut batches (seeded batch order)."""
    buffer: list[dict] = []
    chunk = 0
    for row in rows:
        buffer.append(row)
        if len(buffer) == buffer_rows:
            yield from batch_documents(buffer, spec, batch_size, sort_by_length=True, seed=seed + chunk)
            buffer, chunk = [], chunk + 1
    if buffer:
        yield from batch_documents(buffer, spec, batch_size, sort_by_length=True, seed=seed + chunk)


def _shard_rows(shard, buffer_rows: int) -> Iterator[dict]:
    """Rows of a Ray Data shard as plain dicts (Arrow batches; ragged lists stay lists)."""
    for table in shard.iter_batches(batch_size=buffer_rows, batch_format="pyarrow"):
        yield from table.to_pylist()


def inactive_like(step: SentenceBatch) -> SentenceBatch:
    """A copy of a sentence step where every document is inactive (no target, zero loss)."""
    blank = dataclasses.replace(
        step,
        mask=torch.zeros_like(step.mask),
        lengths=torch.zeros_like(step.lengths),
        doc_active=torch.zeros_like(step.doc_active),
        new_doc=torch.zeros_like(step.new_doc),
        doc_end=torch.zeros_like(step.doc_end),
        target_kind=torch.zeros_like(step.target_kind),
    )
    return blank


def pad_to_steps(batch: DocumentBatch, num_steps: int) -> DocumentBatch:
    """``batch`` with inactive sentence steps appended up to ``num_steps`` steps."""
    missing = num_steps - len(batch.sentences)
    if missing <= 0:
        return batch
    blank = inactive_like(batch.sentences[-1])
    return DocumentBatch(batch.sentences + [blank] * missing, batch.doc_ids, batch.num_tokens, batch.num_padded)


def dummy_batch(spec: VocabSpec, num_steps: int) -> DocumentBatch:
    """A one-document batch of ``num_steps`` inactive steps, for a rank that ran out of data."""
    row = {"doc_id": "<inactive>", "source_file": "", "num_tokens": 2, "sentence_lengths": [2],
           "word_ids": [spec.bos_id, spec.eos_id], "entity_ids": [0, 0],
           "subword_ids": [spec.subword_pad_id, spec.subword_pad_id], "subword_lengths": [1, 1]}
    template = collate_documents([row], spec)
    blank = inactive_like(template.sentences[0])
    return DocumentBatch([blank] * num_steps, ["<inactive>"], 0, 0)


def _agree(values: list[float], device: torch.device, op=dist.ReduceOp.MAX) -> list[float]:
    """All-reduce a few numbers (identity without a process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [float(v) for v in values]
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=op)
    return tensor.tolist()


def parameter_checksum(model: torch.nn.Module) -> float:
    """Sum of every parameter in float64 (equal across ranks iff DDP kept them in sync)."""
    with torch.no_grad():
        return float(sum(p.detach().double().sum().item() for p in model.parameters()))


def seed_everything(seed: int, epoch: int, rank: int) -> None:
    """Seed torch's CPU and CUDA RNGs from (seed, epoch, rank): resumed epochs repeat exactly."""
    torch.manual_seed(seed * 1_000_003 + epoch * 1009 + rank)


def maybe_inject_fault(run: RunSettings, run_dir: str, epoch: int, rank: int) -> None:
    """Raise :class:`InjectedFault` once (a marker file under ``run_dir`` remembers it)."""
    if run.fail_at_epoch != epoch or run.fail_rank != rank:
        return
    import pyarrow.fs as pafs

    fs, base = pafs.FileSystem.from_uri(run_dir)
    marker = f"{base}/fault_injected_epoch{epoch}_rank{rank}"
    if fs.get_file_info(marker).type != pafs.FileType.NotFound:
        return
    fs.create_dir(base, recursive=True)
    with fs.open_output_stream(marker) as out:
        out.write(f"injected at {time.time()}\n".encode())
    raise InjectedFault(f"fault injection: rank {rank} fails in epoch {epoch} (run.fail_at_epoch)")


def reduce_evaluation(local: dict, device: torch.device) -> dict:
    """Sum NLL and token counts of every metric category over the ranks; recompute perplexities.

    Args:
        local: :func:`dynlm.training.evaluate` of this rank's part of the validation set
            (its ``nll_sum_<category>`` / ``count_<category>`` values).
        device: where the collective runs (the rank's device: NCCL needs CUDA tensors).

    Returns:
        :meth:`MetricAccumulator.compute` of all ranks together, equal on every rank.
    """
    accumulator = MetricAccumulator()
    for name in accumulator.nll_sum:
        accumulator.nll_sum[name] = float(local[f"nll_sum_{name}"])
        accumulator.count[name] = int(local[f"count_{name}"])
    values = accumulator.as_tensor(device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return MetricAccumulator.from_tensor(values).compute()


def train_one_epoch(model, optimizer, schedule: LRSchedule, cfg, batches: Iterator[DocumentBatch],
                    spec: VocabSpec, device: torch.device, *, autocast_dtype=None, after_step=None) -> dict:
    """One epoch of lockstep DDP steps (see the module docstring, "Uneven inputs").

    Args:
        model: the DDP-wrapped model (or the bare model with one worker).
        batches: this rank's document batches.
        autocast_dtype: e.g. ``torch.bfloat16`` on CUDA; None: full precision.
        after_step: called after each step (fault injection hooks in here).

    Returns:
        This rank's sums: ``nll_sum``, ``tokens``, ``num_padded``, ``documents``, ``steps``
        (optimizer steps, equal on every rank), ``idle_batches`` (inactive dummy batches run).
    """
    totals = {"nll_sum": 0.0, "tokens": 0, "num_padded": 0, "documents": 0, "steps": 0, "idle_batches": 0}
    iterator = iter(batches)
    while True:
        batch = next(iterator, None)
        any_batch, max_steps = _agree([float(batch is not None), float(len(batch.sentences) if batch else 0)], device)
        if not any_batch:
            return totals
        max_steps = int(max_steps)
        if batch is None:
            step_batch = dummy_batch(spec, max_steps)
            totals["idle_batches"] += 1
        else:
            step_batch = pad_to_steps(batch, max_steps)
        amp = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else nullcontext()
        with amp:
            out = train_step(model, step_batch, optimizer, cfg, scheduler=schedule)
        totals["steps"] += out["steps"]
        if batch is not None:
            totals["nll_sum"] += out["nll_sum"]
            totals["tokens"] += out["tokens"]
            totals["num_padded"] += batch.num_padded
            totals["documents"] += batch.batch_size
        if after_step is not None:
            after_step()


def _gather(value: float, world_size: int, device: torch.device) -> list[float]:
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    if world_size == 1 or not dist.is_initialized():
        return [value]
    out = [torch.zeros_like(tensor) for _ in range(world_size)]
    dist.all_gather(out, tensor)
    return [float(t.item()) for t in out]


def _gather_strings(value: str, world_size: int) -> list[str]:
    """Every rank's ``value``, in rank order (identity without a process group)."""
    if world_size == 1 or not dist.is_initialized():
        return [value]
    out: list = [None] * world_size
    dist.all_gather_object(out, value)
    return [str(item) for item in out]


def load_initial_weights(model: torch.nn.Module, job: JobConfig, spec: VocabSpec, source: str) -> None:
    """Warm start: copy the weights of a dynlm checkpoint file (path or URI) into ``model``.

    Only the weights: optimizer, schedule and epoch count start fresh. The checkpoint's model
    config and VocabSpec must equal the job's (same architecture, same vocabulary).
    """
    with tempfile.TemporaryDirectory() as tmp:
        local = source
        if "://" in source:
            fs, path = _fs(source)
            local = str(Path(tmp) / CHECKPOINT_FILE)
            with fs.open_input_stream(path) as src, open(local, "wb") as dst:
                dst.write(src.read())
        loaded, model_cfg, loaded_spec, _ = dynlm_checkpoint.load(local)
    if model_cfg != job.model:
        raise ValueError(f"run.init_checkpoint {source}: model config {model_cfg.to_dict()} differs "
                         f"from the job's {job.model.to_dict()}")
    if loaded_spec.to_dict() != spec.to_dict():
        raise ValueError(f"run.init_checkpoint {source}: its vocabulary {loaded_spec.to_dict()} differs "
                         f"from the prepared data's {spec.to_dict()} (prepare with its preprocessor)")
    model.load_state_dict(loaded.state_dict())


def _save_checkpoint(folder: Path, model, job: JobConfig, prepared: PreparedData, extra: dict) -> None:
    dynlm_checkpoint.save(folder / CHECKPOINT_FILE, model, job.model, prepared.spec, extra=extra)
    (folder / "preprocessor.json").write_bytes(prepared.read_bytes(prepared.manifest["preprocessor"]))


def train_fn_per_worker(config: dict) -> dict | None:
    """One DDP rank of a Ray Train V2 run (``train_loop_config`` = :class:`WorkerSettings` dict).

    Returns:
        On rank 0: ``{"history": [...], "param_checksums": [one per rank]}``; None elsewhere.
    """
    import ray.train
    import ray.train.torch

    settings = WorkerSettings.from_dict(config)
    job = JobConfig.from_dict(settings.job)
    cfg = job.train
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    autocast_dtype = torch.bfloat16 if (job.run.bf16 and device.type == "cuda") else None
    if settings.tracking_uri:
        os.environ["MLFLOW_TRACKING_URI"] = settings.tracking_uri
    prepared = PreparedData.open(settings.prepared_root)
    spec = prepared.spec

    torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    core = build_model(job.model, spec)
    # One worker: no DDP, so no anchor needed (prepare_model only moves the model then).
    model = ray.train.torch.prepare_model(EveryParameterUsed(core) if world > 1 else core)
    optimizer = build_optimizer(core, cfg)
    schedule = LRSchedule(optimizer, cfg.lr_schedule, warmup_steps=cfg.warmup_steps,
                          total_steps=settings.total_steps)
    start_epoch, history, best_ppl, bad_epochs, stopped = 1, [], math.inf, 0, False

    restored = ray.train.get_checkpoint()
    if restored is not None:
        with restored.as_directory() as folder:
            loaded, model_cfg, _, extra = dynlm_checkpoint.load(Path(folder) / CHECKPOINT_FILE)
        if model_cfg != job.model:
            raise ValueError(f"checkpoint model config {model_cfg.to_dict()} differs from the job's "
                             f"{job.model.to_dict()}; resume with the same model settings")
        core.load_state_dict(loaded.state_dict())
        optimizer.load_state_dict(extra["optimizer"])
        schedule.load_state_dict(extra["schedule"])
        start_epoch, history = extra["epoch"] + 1, list(extra["history"])
        best_ppl, bad_epochs, stopped = extra["best_valid_ppl"], extra["bad_epochs"], extra["stopped"]
    elif job.run.init_checkpoint:  # warm start (e.g. a retrain from the champion): weights only
        load_initial_weights(core, job, spec, job.run.init_checkpoint)
    node_ids = _gather_strings(ray.get_runtime_context().get_node_id(), world)

    batch_size = per_worker_batch_size(cfg.batch_size, world)
    buffer_rows = batch_size * SORT_BUFFER_BATCHES
    train_shard = ray.train.get_dataset_shard("train")
    checksums = _gather(parameter_checksum(core), world, device)

    for epoch in range(start_epoch, cfg.epochs + 1):
        if stopped:
            break
        seed_everything(cfg.seed, epoch, rank)
        started = time.perf_counter()
        batches = iter_document_batches(_shard_rows(train_shard, buffer_rows), spec, batch_size,
                                        seed=cfg.seed * 7919 + epoch * 31 + rank, buffer_rows=buffer_rows)
        fault = lambda: maybe_inject_fault(job.run, settings.run_dir, epoch, rank)  # noqa: E731
        local = train_one_epoch(model, optimizer, schedule, cfg, batches, spec, device,
                                autocast_dtype=autocast_dtype, after_step=fault)
        fault()  # a rank without any batch still fails on cue
        train_seconds = time.perf_counter() - started
        nll, tokens, padded, docs, idle = _agree(
            [local["nll_sum"], local["tokens"], local["num_padded"], local["documents"], local["idle_batches"]],
            device, op=dist.ReduceOp.SUM)

        valid_rows = (row for i, row in enumerate(prepared.iter_rows("valid")) if i % world == rank)
        valid_local = evaluate(core, iter_document_batches(valid_rows, spec, batch_size, seed=0,
                                                            buffer_rows=buffer_rows))
        valid = reduce_evaluation(valid_local, device)
        if valid["tokens"] == 0:
            raise ValueError("the validation split holds no tokens; prepare with valid_fraction > 0")
        schedule.step_validation(valid["ppl"])
        if valid["ppl"] < best_ppl:
            best_ppl, bad_epochs = valid["ppl"], 0
        else:
            bad_epochs += 1
        stopped = bool(cfg.early_stopping_patience and bad_epochs >= cfg.early_stopping_patience)
        checksums = _gather(parameter_checksum(core), world, device)
        record = {
            "epoch": epoch,
            "train_loss": nll / tokens if tokens else float("nan"),
            "train_ppl": math.exp(min(nll / tokens, 700)) if tokens else float("nan"),
            "train_tokens": int(tokens),
            "train_documents": int(docs),
            # Ray's equal split drops the last (< world_size) rows of an uneven epoch; say so
            "train_documents_dropped": settings.num_train_documents - int(docs),
            "train_padding_fraction": padded / (padded + tokens) if tokens else float("nan"),
            "train_tokens_per_s": tokens / train_seconds,
            "train_steps_per_rank": local["steps"],
            "train_idle_batches": int(idle),
            "train_seconds": train_seconds,
            "lr": optimizer.param_groups[0]["lr"],
            **{f"valid_{k}": v for k, v in valid.items() if not k.startswith(("nll_sum_", "count_"))},
            "best_valid_ppl": best_ppl,
            "param_checksum": checksums[0],
            "param_checksum_spread": max(checksums) - min(checksums),
            "stopped_early": float(stopped),
            "worker_node_ids": ",".join(node_ids),  # Ray node of each rank (not an MLflow metric)
        }
        history.append(record)
        if rank == 0 and record["train_documents_dropped"] and epoch == start_epoch:
            print(f"[train] warning: {record['train_documents_dropped']} of {settings.num_train_documents} "
                  f"training documents are left out of every epoch (Ray Data's equal split over {world} "
                  "workers drops the remainder)", flush=True)
        if rank == 0 and settings.mlflow_run_id:
            from pipelines import tracking

            tracking.log_epoch_metrics(settings.mlflow_run_id, epoch, record, tracking_uri=settings.tracking_uri)
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if rank == 0:
                extra = {"epoch": epoch, "history": history, "optimizer": optimizer.state_dict(),
                         "schedule": schedule.state_dict(), "best_valid_ppl": best_ppl,
                         "bad_epochs": bad_epochs, "stopped": stopped, "job": job.to_dict(),
                         "train_config": cfg.to_dict(), "valid_ppl": valid["ppl"]}
                _save_checkpoint(Path(tmp), core, job, prepared, extra)
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(record, checkpoint=checkpoint, checkpoint_dir_name=f"epoch_{epoch:04d}")
    if rank == 0:
        return {"history": history, "param_checksums": checksums}
    return None


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def estimate_total_steps(prepared: PreparedData, cfg, world_size: int) -> int:
    """Optimizer steps of the whole run, for the cosine schedule (the same on every rank).

    Reads only the ``sentence_lengths`` column: documents sorted by sentence count, cut into
    global batches; each lockstep batch takes ceil(longest / bptt_sentences) steps.
    """
    import pyarrow.compute as pc

    column = prepared.read_columns("train", ["sentence_lengths"]).column("sentence_lengths")
    counts: list[int] = pc.list_value_length(column).to_pylist()  # sentences per document
    if not counts:
        raise ValueError(f"{prepared.root}: the train split holds no documents")
    counts.sort()
    per_rank = per_worker_batch_size(cfg.batch_size, world_size) * world_size
    per_epoch = sum(math.ceil(counts[min(i + per_rank, len(counts)) - 1] / cfg.bptt_sentences)
                    for i in range(0, len(counts), per_rank))
    return max(1, per_epoch * cfg.epochs)


def _fs(uri: str):
    import pyarrow.fs as pafs

    return pafs.FileSystem.from_uri(uri)


def _has_ray_run(run_dir: str) -> bool:
    import pyarrow.fs as pafs

    fs, path = _fs(run_dir)
    return fs.get_file_info(f"{path}/{RAY_SNAPSHOT_FILE}").type != pafs.FileType.NotFound


def resolve_run(run: RunSettings, model_type: str) -> tuple[str, bool]:
    """The Ray Train run name and whether it continues an earlier run.

    Without ``resume``, the name (given or ``<model type>-<time>``) must be new: Ray Train V2
    silently continues a run whose folder exists, so that is an error here. With ``resume``,
    the named run (or, without a name, the most recent run under storage_path) must exist.
    """
    import pyarrow.fs as pafs

    storage = run.storage_uri()
    if not run.resume:
        name = run.name or f"{model_type}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        if _has_ray_run(f"{storage}/{name}"):
            raise FileExistsError(f"run {name!r} already exists under {storage}; pass --resume to "
                                  "continue it or choose another run.name")
        return name, False
    if run.name is not None:
        if not _has_ray_run(f"{storage}/{run.name}"):
            raise FileNotFoundError(f"--resume: no run {run.name!r} under {storage}")
        return run.name, True
    fs, base = _fs(storage)
    runs = [info for info in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
            if info.type == pafs.FileType.Directory and _has_ray_run(f"{storage}/{info.base_name}")]
    if not runs:
        raise FileNotFoundError(f"--resume: no run with checkpoints under {storage}")
    latest = max(runs, key=lambda info: fs.get_file_info(f"{info.path}/{RAY_SNAPSHOT_FILE}").mtime)
    return latest.base_name, True


def _write_run_info(run_dir: str, info: dict) -> None:
    fs, path = _fs(run_dir)
    fs.create_dir(path, recursive=True)
    with fs.open_output_stream(f"{path}/{RUN_INFO_FILE}") as out:
        out.write(json.dumps(info, indent=1).encode())


def _read_run_info(run_dir: str) -> dict | None:
    import pyarrow.fs as pafs

    fs, path = _fs(run_dir)
    if fs.get_file_info(f"{path}/{RUN_INFO_FILE}").type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(f"{path}/{RUN_INFO_FILE}") as stream:
        return json.loads(stream.read().decode())


def build_trainer(job: JobConfig, prepared: PreparedData, name: str, settings: WorkerSettings, *,
                  tune_callback: bool = False):
    """The TorchTrainer of a job (datasets stream from the prepared Parquet files)."""
    import ray.data
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    run = job.run
    options = ray.train.DataConfig.default_ingest_options()
    options.preserve_order = True  # deterministic shards: same seed, same result
    callbacks = []
    if tune_callback:
        from ray.tune.integration.ray_train import TuneReportCallback

        callbacks.append(TuneReportCallback())
    # local paths or URIs; the filesystem carries the store's settings (endpoint, region)
    train_data = ray.data.read_parquet([str(p) for p in prepared.files("train")], filesystem=prepared.filesystem)
    train_data.context.enable_progress_bars = False  # one bar per worker per epoch is noise
    resources = {"CPU": run.cpus_per_worker}
    if run.use_gpu:
        resources["GPU"] = 1
    return TorchTrainer(
        train_fn_per_worker,
        train_loop_config=settings.to_dict(),
        torch_config=TorchConfig(backend="nccl" if run.use_gpu else "gloo", timeout_s=PROCESS_GROUP_TIMEOUT_S),
        scaling_config=ray.train.ScalingConfig(num_workers=run.num_workers, use_gpu=run.use_gpu,
                                               resources_per_worker=resources),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=run.storage_uri(),
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=1, checkpoint_score_attribute="valid_ppl", checkpoint_score_order="min"),
            failure_config=ray.train.FailureConfig(max_failures=run.max_failures),
            callbacks=callbacks,
        ),
        datasets={"train": train_data},
        dataset_config=ray.train.DataConfig(execution_options=options),
    )


def _mark_ended_early(run_id: str, uri: str, exc: BaseException) -> None:
    """Close the MLflow run of a training that did not finish: KILLED on Ctrl-C, else FAILED,
    with the error as the tag ``dynlm.error``."""
    from pipelines import tracking

    tracking.end_run(run_id, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED",
                     tags={"dynlm.error": f"{type(exc).__name__}: {exc}"[:5000]}, tracking_uri=uri)


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
    from pipelines.ray_env import init_ray

    init_ray()
    if not prepared.files("valid"):
        raise ValueError(f"{prepared.root}: the valid split holds no documents (early stopping needs it)")
    name, resuming = resolve_run(job.run, job.model.type)
    run_dir = f"{job.run.storage_uri()}/{name}"
    uri = tracking.tracking_uri(job.run.tracking_uri)
    info = _read_run_info(run_dir) if resuming else None
    if info is not None:
        if info["data_hash"] != job.data.data_hash():
            raise ValueError(f"--resume: run {name!r} trained on data {info['data_hash']}, this job "
                             f"prepares {job.data.data_hash()}")
        run_id = info["mlflow_run_id"]
    else:
        run_id = tracking.start_training_run(job, prepared, parent_run_id=parent_run_id, run_name=name,
                                              tags=run_tags)
        _write_run_info(run_dir, {"mlflow_run_id": run_id, "tracking_uri": uri,
                                  "data_hash": job.data.data_hash(), "job": job.to_dict()})
    root = str(prepared.root) if is_uri(prepared.root) else prepared.path  # a URI, or an absolute path
    settings = WorkerSettings(
        job=job.to_dict(), prepared_root=root, run_dir=run_dir,
        mlflow_run_id=run_id, tracking_uri=uri, num_train_documents=prepared.num_documents("train"),
        total_steps=estimate_total_steps(prepared, job.train, job.run.num_workers)
        if job.train.lr_schedule == "cosine" else 1)
    try:
        result = build_trainer(job, prepared, name, settings, tune_callback=tune_callback).fit()
        if result.error is not None:
            raise result.error
    except BaseException as exc:
        if not tune_callback:  # in a Tune trial the search driver closes the run: it knows
            _mark_ended_early(run_id, uri, exc)  # whether the scheduler stopped the trial
        raise  # --resume sets the run running again
    output = result.return_value or {}
    history = output.get("history", [])
    best = min(result.best_checkpoints or [], key=lambda item: item[1]["valid_ppl"], default=None)
    if best is None:
        raise RuntimeError(f"run {name!r} reported no checkpoint")
    best_dir = best[0].path  # local storage: a folder; remote storage: download it first
    if "://" in best_dir:
        best_dir = best[0].to_directory()
    tracking.finish_training_run(run_id, best_dir, prepared, history, tracking_uri=uri)
    version = None
    if job.run.register:
        registration = tracking.register_and_promote(run_id, best[1]["valid_ppl"],
                                                     margin=job.run.promotion_margin, tracking_uri=uri)
        version = registration.version
        print(f"[train] registered {registration.name} v{registration.version}: {registration.reason}")
    return TrainingResult(run_id=run_id, best_checkpoint_dir=str(best_dir), best_valid_ppl=best[1]["valid_ppl"],
                          metrics=dict(best[1]), epochs=len(history), model_version=version, history=history,
                          run_path=result.path, param_checksums=output.get("param_checksums", []))
