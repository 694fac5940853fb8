"""The prepare job on Ray Data: any task's stages over input files -> a prepared folder.

Stages (one Ray Dataset flows through them; the text never comes back to the driver)::

    read_binary_files(cfg.input_files(), ...)            one row per input file the data config keeps
    map_batches(task.parse_files)                       records with their split + quarantine records
    --- driver: the small columns of every record: checks, one split rule (dynlm/data/split.py) ---
    map_batches(task.count_train).groupby("word").sum("count")      counts of the TRAIN split
    --- driver: task.fit_preprocessor(counts), unless a fitted preprocessor is given ---
    map_batches(task.encoder, ActorPoolStrategy)        each actor loads the preprocessor JSON once
    map_batches(add_shard_column)                       a document's shard: a hash of its doc_id
    groupby(["split", "shard"]).map_groups(write_group) each shard sorted by doc_id and written by
                                                        a worker, straight into the folder (local
                                                        or s3://...): one small row per shard back
    --- driver: the preprocessor, the quarantine, the manifest (written last: the folder is complete) ---

What dynlm keeps in the driver: one metadata row per record (doc_id, split, counts; no text),
the word counts of the train split, one row per shard; nothing that grows with the tokens of a
document. Measured, the driver process still grows with the corpus (Ray's native heap during the
two shuffles: ``benchmarks/results/scale_cpu.md``; issue 41).

Everything around the job (the folder key, reuse, gamma derivation, the atomic publish, the
files written) is Ray-free and shared with the in-process path: :mod:`dynlm.data.publish`,
:mod:`dynlm.data.prepared_writer`. Encoding new documents with an existing preprocessor (a
retrain with the champion's vocabulary) is the ``preprocessor`` argument, not another job.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from dynlm import faults, storage
from dynlm.data import prepared_writer as writer
from dynlm.data.prepared import PreparedData
from dynlm.data.publish import PreparedDataMissing, QuarantineError, prepare_folder
from dynlm.tasks import DEFAULT_TASK, Task, get_task

DOCS_PER_BLOCK = 32  # Ray Data block size after parsing (spreads one big file over the actors)
SHUFFLE = "sort_shuffle_pull_based"  # ray.data ShuffleStrategy of the word counts' and the shards' groupby

__all__ = ["PreparedDataMissing", "QuarantineError", "prepare"]


def _train_counts(task: Task, parsed, ray) -> dict[str, int]:
    """Counts of the train split: per-batch ``task.count_train``, then a Ray Data groupby-sum.

    The groupby runs as a pull-based sort shuffle (:data:`SHUFFLE`: tasks on Ray's pooled
    workers). Ray 2.60's default hash shuffle starts aggregator actors, new processes, for every
    groupby: seconds of fixed cost per prepare (``benchmarks/bench_fixed_costs.py`` compares them).
    """
    from ray.data.context import ShuffleStrategy

    num_partitions = max(1, min(16, int(ray.cluster_resources().get("CPU", 1))))
    counted = parsed.map_batches(task.count_train, batch_format="pyarrow", batch_size=None)
    # this dataset's DataContext (a copy made at read time, shared with its parent), not the process's
    counted.context.shuffle_strategy = ShuffleStrategy(SHUFFLE)
    counts: dict[str, int] = {}
    for batch in counted.groupby("word", num_partitions=num_partitions).sum("count").iter_batches(
            batch_format="pyarrow", batch_size=None):
        counts.update(zip(batch["word"].to_pylist(), batch["sum(count)"].to_pylist()))
    return counts


def _run_job(task: Task, cfg, out: Path, shard_root: str, preprocessor: Any | None, ray) -> dict:
    from ray.data.context import ShuffleStrategy

    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        timings[stage] = round(time.perf_counter() - clock, 3)
        clock = time.perf_counter()

    resolved = writer.with_absolute_paths(cfg)
    files = resolved.input_files()  # the data config's files (the same list keys the folder)
    if not files:
        raise ValueError(f"data.inputs {cfg.inputs}: no input files were found")
    parsed = (
        ray.data.read_binary_files(files, include_paths=True)
        .map_batches(task.parse_files, batch_format="pyarrow", batch_size=1, fn_kwargs={"cfg_dict": resolved.to_dict()})
        .repartition(target_num_rows_per_block=DOCS_PER_BLOCK)
        .materialize()  # in the object store (spilled to disk when it is full), read twice below
    )
    tables = list(parsed.drop_columns(list(task.payload_columns)).iter_batches(batch_format="pyarrow", batch_size=None))
    meta = pa.concat_tables(tables) if tables else None  # one small row per record, no text
    writer.check_documents(meta, cfg.inputs)
    rule = writer.split_rule(meta, resolved)
    if preprocessor is None:
        writer.check_train_split(meta, cfg, rule)  # before any fitting: a one-line error
    lap("read_parse")
    faults.kill_point("prepare:parsed")
    source = "given"
    if preprocessor is None:
        preprocessor, source = task.fit_preprocessor(_train_counts(task, parsed, ray), cfg), "fit on the train split"
        lap("count_and_fit")
    filesystem, shard_path = storage.resolve(shard_root)  # pickled to the workers with its settings
    encoded = parsed.map_batches(
        task.encoder, fn_constructor_kwargs={"preprocessor_json": preprocessor.to_json()},
        compute=ray.data.ActorPoolStrategy(size=cfg.num_encode_actors), batch_format="pyarrow", batch_size=None)
    keyed = encoded.map_batches(writer.add_shard_column, fn_kwargs={"shards": writer.shards_per_split(meta)},
                                batch_format="pyarrow", batch_size=None)
    keyed.context.shuffle_strategy = ShuffleStrategy(SHUFFLE)
    written = keyed.groupby(["split", "shard"]).map_groups(
        writer.write_group, batch_format="pyarrow",
        fn_kwargs={"root": shard_path, "filesystem": filesystem, "task": task, "spec": preprocessor.spec})
    faults.kill_point("prepare:encoding")
    rows = [row for batch in written.iter_batches(batch_format="pyarrow", batch_size=None) for row in batch.to_pylist()]
    lap("encode_write")
    manifest = writer.finish_folder(out, shard_path, task, cfg, meta, rows, preprocessor, rule=rule,
                                    preprocessor_source=source, filesystem=filesystem)
    lap("finish")
    return {**manifest, "timings_s": timings}


def prepare(cfg, *, task: Task | str = DEFAULT_TASK, preprocessor: Any | None = None, strict: bool = False,
            progress: bool = True, build: bool = True) -> PreparedData:
    """Prepare (or reuse) the folder of ``cfg`` under ``cfg.output_root`` with Ray Data.

    ``cfg.output_root`` is a local folder or a filesystem URI (``s3://...``). Ray workers write
    the shards (a local folder must be one every node sees), the driver the small files; both
    need the store's credentials (the filesystem's settings, e.g. its endpoint, go with the job).

    Args:
        cfg: the task's data config.
        task: the task (or its name, :func:`dynlm.tasks.get_task`).
        preprocessor: encode with this fitted preprocessor (e.g. a champion's) instead of
            fitting one; the folder key then includes its digest.
        strict: raise :class:`QuarantineError` when any input record was quarantined.
        progress: show Ray Data progress bars.
        build: False never starts a Ray Data job (:func:`dynlm.data.publish.prepare_folder`).

    Raises:
        QuarantineError, PreparedDataMissing, FileNotFoundError / ValueError (missing inputs,
        no readable document, duplicate doc ids, no single split rule).
    """
    task = get_task(task) if isinstance(task, str) else task

    def build_with_ray(out: Path, shard_root: str) -> dict:
        import ray

        from pipelines.ray_env import init_ray

        init_ray()
        context = ray.data.DataContext.get_current()
        previous, context.enable_progress_bars = context.enable_progress_bars, progress
        try:
            return _run_job(task, cfg, out, shard_root, preprocessor, ray)
        finally:
            context.enable_progress_bars = previous

    return prepare_folder(task, cfg, build_with_ray, preprocessor=preprocessor, strict=strict, may_build=build)
