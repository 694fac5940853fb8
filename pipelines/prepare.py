"""The prepare job on Ray Data: any task's stages over input files -> a prepared folder.

Stages (the text never comes back to the driver)::

    read_binary_files(cfg.input_files(), ...)            one row per input file the data config keeps
    map_batches(task.parse_files)                       records with their split + quarantine records
    --- driver: the small columns of every record: checks, one split rule (dynlm/data/split.py) ---
    map_batches(task.count_train), summed by a tree of tasks  counts of the TRAIN split
    --- driver: task.fit_preprocessor(counts), unless a fitted preprocessor is given ---
    --- Ray actors and tasks on the parsed blocks (_encode_and_write) ---
    BlockEncoder actors (data.num_encode_actors)        each loads the preprocessor JSON once, encodes a
                                                        block and adds each row's shard: its doc_id's
                                                        place among the shards' first ids (shard_boundaries)
    a Ray task per shard (write_shard)                  the rows of the blocks that hold the shard,
                                                        sorted by doc_id, written straight into the
                                                        folder (local or s3://...): one small row back
    --- driver: the preprocessor, the quarantine, the manifest (written last: the folder is complete) ---

What dynlm keeps in the driver: one metadata row per record (doc_id, split, counts; no text),
the word counts of the train split, one reference per Ray Data block and one row per shard;
nothing that grows with the tokens of a document. No Ray Data groupby: a shuffle's intermediate
objects are owned by the driver, and its native heap grew with the corpus (10x from 2 M to 64 M
tokens; now 1.16x: ``benchmarks/results/scale_cpu.md``).

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
import pyarrow.compute as pc

from dynlm import faults, storage
from dynlm.data import prepared_writer as writer
from dynlm.data.prepared import PreparedData
from dynlm.data.publish import PreparedDataMissing, QuarantineError, prepare_folder
from dynlm.tasks import DEFAULT_TASK, Task, get_task

DOCS_PER_BLOCK = 32  # Ray Data block size after parsing (spreads one big file over the actors)

__all__ = ["PreparedDataMissing", "QuarantineError", "prepare"]


COUNT_FAN_IN = 16  # word-count tables summed per task in the reduction tree of _train_counts


def sum_word_counts(*tables: pa.Table) -> pa.Table:
    """The per-word sum of ``{word, count}`` tables: one row per word."""
    summed = pa.concat_tables(tables).group_by("word").aggregate([("count", "sum")])
    return pa.table({"word": summed["word"], "count": summed["count_sum"]})


def _train_counts(task: Task, parsed, ray) -> dict[str, int]:
    """Counts of the train split, in word order: ``task.count_train`` per block, then summed by
    a tree of Ray tasks (:data:`COUNT_FAN_IN` tables per task) where the blocks are; the driver
    receives the one summed table.

    No Ray Data groupby: its shuffle's intermediate objects are owned by the driver, whose
    native heap grew with the corpus (``benchmarks/results/scale_cpu.md``); the tree has one
    object per block and per task.
    """
    counted = parsed.map_batches(task.count_train, batch_format="pyarrow", batch_size=None)
    tables = counted.to_arrow_refs()  # one {word, count} table per block, in the object store
    if not tables:
        return {}
    add = ray.remote(sum_word_counts)
    while len(tables) > 1:
        tables = [add.remote(*tables[i:i + COUNT_FAN_IN]) for i in range(0, len(tables), COUNT_FAN_IN)]
    summed = ray.get(tables[0])
    if len(summed) == 0:
        return {}
    summed = summed.sort_by("word")  # one order whatever order the blocks came in
    return dict(zip(summed["word"].to_pylist(), summed["count"].to_pylist()))


def shard_keys(block: pa.Table) -> list[tuple[str, int]]:
    """The (split, shard) pairs of the rows of one encoded block."""
    pairs = block.select(["split", "shard"]).group_by(["split", "shard"]).aggregate([])
    return sorted(zip(pairs["split"].to_pylist(), pairs["shard"].to_pylist()))


class BlockEncoder:
    """An encode actor: the task's encoder (its preprocessor loaded once) and the shard column."""

    def __init__(self, encoder: type, preprocessor_json: str, boundaries: dict[str, list[str]]):
        self.encode, self.boundaries = encoder(preprocessor_json=preprocessor_json), boundaries

    def encode_block(self, block: pa.Table) -> tuple[pa.Table, list[tuple[str, int]]]:
        """(the encoded rows with their ``shard``, the (split, shard) pairs they hold)."""
        keyed = writer.add_shard_column(self.encode(block), self.boundaries)
        return keyed, shard_keys(keyed)


def write_shard(split: str, shard: int, options: dict, *blocks: pa.Table) -> dict:
    """Gather the rows of one shard from the blocks that hold some and write it
    (:func:`dynlm.data.prepared_writer.write_group`); its row for the manifest."""
    rows = [block.filter(pc.and_(pc.equal(block["split"], split), pc.equal(block["shard"], shard))) for block in blocks]
    return writer.write_group(pa.concat_tables(rows), **options).to_pylist()[0]


def _encode_and_write(parsed, encoder: type, preprocessor_json: str, boundaries: dict[str, list[str]],
                      num_actors: int, ray, **options) -> list[dict]:
    """Encode every parsed block on ``num_actors`` actors, then write every shard.

    Ray core, not a Ray Data job: each block goes to an actor (round robin) that returns the
    encoded block (it stays in the object store) and the small list of shards it holds; each
    shard is then written by one Ray task from the blocks that hold its rows (a shard's ids are
    consecutive and a block's documents come from one stretch of a file: each block is read by
    about 3 shard tasks, 512 reads of 160 blocks for 21 shards at 16 M tokens). The
    driver holds one reference per block and one small row per shard (a Ray Data groupby, whose
    shuffle's objects are the driver's, grew it 10x from 2 M to 64 M tokens:
    ``benchmarks/results/scale_cpu.md``). Encoding as Ray actors rather than a Ray Data job:
    80 s against 111 s for the 64 M-token build.
    """
    blocks = parsed.to_arrow_refs()  # materialized already: references, nothing executes
    actor = ray.remote(num_cpus=1)(BlockEncoder)
    cpus = int(ray.cluster_resources().get("CPU", 0))  # no more actors than CPUs: the rest would wait forever
    actors = [actor.remote(encoder, preprocessor_json, boundaries) for _ in range(max(1, min(num_actors, cpus)))]
    returned = [actors[i % len(actors)].encode_block.options(num_returns=2).remote(block)
                for i, block in enumerate(blocks)]
    holders: dict[tuple[str, int], list] = {}
    for (encoded, _), keys in zip(returned, ray.get([keys for _, keys in returned])):
        for key in keys:
            holders.setdefault(tuple(key), []).append(encoded)
    for each in actors:  # their CPUs to the writers (the encoded blocks stay in the object store)
        ray.kill(each)
    write = ray.remote(write_shard)
    return ray.get([write.remote(split, shard, options, *refs) for (split, shard), refs in sorted(holders.items())])


def _run_job(task: Task, cfg, out: Path, shard_root: str, preprocessor: Any | None, ray) -> dict:
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
    faults.kill_point("prepare:encoding")
    rows = _encode_and_write(parsed, task.encoder, preprocessor.to_json(), writer.shard_boundaries(meta),
                             cfg.num_encode_actors, ray, root=shard_path, filesystem=filesystem, task=task,
                             spec=preprocessor.spec)
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
