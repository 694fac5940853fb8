"""What a prepared folder contains, written from a task's stage outputs (no Ray).

The Ray Data job (``pipelines/prepare.py``) and the in-process path
(:func:`dynlm.tasks.local.prepare_local`) both write with these functions, so they write the
same files::

    <folder>/train|valid|test/part-NNNNN.parquet   the task's encoded_schema: shard NNNNN of the
                                                   split, its documents sorted by doc_id
    <folder>/quarantine/part-00000.parquet         QUARANTINE_SCHEMA (source_file, doc_id, line, reason)
    <folder>/preprocessor.json                     the task's preprocessor
    <folder>/manifest.json                         written last by dynlm.data.publish

A split's documents in doc_id order are cut into shards of about :data:`ROWS_PER_SHARD`
consecutive ids, fixed by the first id of each (:func:`shard_boundaries`, from the small
metadata rows the driver holds anyway); a worker finds a document's shard from its id alone
(:func:`shard_indices`), and a shard is written by one worker from the blocks that hold its ids
(:func:`write_group`): no step gathers or sorts a whole split, and the Ray job's driver
only sees one small row per shard. Same input, same files, byte for byte, on any cluster.

The checks every prepare runs on the parsed records are here too: some document was read, no
doc_id twice, one split rule for all input files.
"""

from __future__ import annotations

import bisect
import json
import math
import posixpath
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dynlm import faults, storage
from dynlm.data.schema import QUARANTINE_SCHEMA
from dynlm.data.split import check_split_rule
from dynlm.tasks import task_ref

SPLITS = ("train", "valid", "test")
ROWS_PER_SHARD = 256  # documents per Parquet file on average (fixed: part of the byte-identical output)
ROW_GROUP_SIZE = 64  # documents per Parquet row group
PREPROCESSOR_FILE = "preprocessor.json"

SPLIT_RULE_TEXT = {
    "named": "named: the split each input's file/folder names (train, valid/dev, test)",
    "config": "config: the input paths listed in data.splits",
    "hash": "hash: unsplit inputs, a hash of each document id (valid/test_fraction)",
}


def with_absolute_paths(cfg):
    """``cfg`` with absolute ``inputs`` and ``splits`` paths (URIs unchanged), as the parse
    stage's rows name the files (a file's split is read from its path below its input).

    Raises:
        FileNotFoundError: a local input does not exist.
    """
    inputs = [storage.absolute(item) for item in cfg.inputs]
    for item, path in zip(cfg.inputs, inputs):
        if not storage.is_uri(item) and not storage.exists(path):
            raise FileNotFoundError(f"data.inputs: {item!r} does not exist (resolved to {path})")
    splits = {split: [storage.absolute(item) for item in paths] for split, paths in cfg.splits.items()}
    return cfg.replace(inputs=inputs, splits=splits)


class EmptyTrainSplit(ValueError):
    """No document fell in the train split: nothing to fit the preprocessor on (a user error)."""


def check_train_split(meta: pa.Table, cfg, rule: str) -> None:
    """Raise :class:`EmptyTrainSplit`, saying how the documents were split and what to change,
    before anything is fitted on an empty train split."""
    documents = meta.filter(pc.equal(meta["kind"], "document"))
    if pc.any(pc.equal(documents["split"], "train")).as_py():
        return
    kinds = meta["kind"].to_numpy(zero_copy_only=False)
    found = {split: int(pc.sum(pc.equal(documents["split"], split)).as_py() or 0) for split in SPLITS}
    fractions = {k: getattr(cfg, k) for k in ("valid_fraction", "test_fraction") if hasattr(cfg, k)}
    advice = (f"give more documents or lower {', '.join(f'{k}={v}' for k, v in fractions.items())}"
              if rule == "hash" else "add the train files, or list them under data.splits.train")
    raise EmptyTrainSplit(f"no train document: the {rule} split rule put the {documents.num_rows} readable "
                          f"document(s) in {found} ({int((kinds == 'quarantine').sum())} record(s) quarantined, "
                          f"{int((kinds == 'dropped').sum())} dropped); {advice}")


def check_documents(meta: pa.Table | None, inputs: list[str]) -> None:
    """Clear errors for no input file, no readable document, or a doc_id seen twice."""
    if meta is None or meta.num_rows == 0:
        raise ValueError(f"data.inputs {inputs}: no input files were found")
    kinds = meta["kind"].to_numpy(zero_copy_only=False)
    if not (kinds == "document").any():
        raise ValueError(f"data.inputs {inputs}: no document could be read ({int((kinds == 'quarantine').sum())} "
                         f"quarantined, {int((kinds == 'dropped').sum())} dropped)")
    seen: dict[str, str] = {}
    for kind, doc_id, source in zip(kinds, meta["doc_id"].to_pylist(), meta["input_file"].to_pylist()):
        if kind != "document":
            continue
        if doc_id in seen:
            raise ValueError(f"duplicate doc_id {doc_id!r} in {seen[doc_id]} and {source} "
                             "(is a file listed twice in data.inputs?)")
        seen[doc_id] = source


def split_rule(meta: pa.Table, resolved, *, require_train: bool = True) -> str:
    """The split rule all documents followed (``named`` / ``config`` / ``hash``), or SplitRuleError:
    each file's rule is the data config's ``file_split``, the one its parse stage applied."""
    documents = meta.filter(pc.equal(meta["kind"], "document"))
    return check_split_rule(documents["input_file"].to_pylist(), resolved.inputs, resolved.splits,
                            documents["split"].to_pylist(), require_train=require_train,
                            file_rule=resolved.file_split)


def by_split(encoded: Iterable[pa.Table], schema: pa.Schema) -> dict[str, pa.Table]:
    """Encoded batches (``schema`` + a ``split`` column) -> one table per split, sorted by doc_id
    (the in-process path, which holds its small input in memory anyway)."""
    parts: dict[str, list[pa.Table]] = defaultdict(list)
    for batch in encoded:
        for split in SPLITS:
            part = batch.filter(pc.equal(batch["split"], split))
            if part.num_rows:
                parts[split].append(part.drop_columns(["split"]).cast(schema))
    return {split: (pa.concat_tables(parts[split]) if parts[split] else schema.empty_table())
            .sort_by([("doc_id", "ascending")]) for split in SPLITS}


# --- shards: each one written where its documents are, by whoever holds them -----------------


def shard_boundaries(meta: pa.Table) -> dict[str, list[str]]:
    """The first doc_id of every shard of each split: the split's documents in doc_id order cut
    into ``ceil(documents / ROWS_PER_SHARD)`` runs of consecutive ids, as equal as can be (a
    split without documents: one empty shard). From the parsed records' metadata, so it is
    fixed by the input before anything is encoded; the lists are small (one id per shard)."""
    documents = meta.filter(pc.equal(meta["kind"], "document"))
    boundaries = {}
    for split in SPLITS:
        ids = documents.filter(pc.equal(documents["split"], split))["doc_id"]
        ordered = ids.take(pc.array_sort_indices(ids)).to_pylist()  # byte order: write_group's order
        count = len(ordered)
        shards = max(1, math.ceil(count / ROWS_PER_SHARD))
        boundaries[split] = [ordered[k * count // shards] for k in range(shards)] if count else [""]
    return boundaries


def shard_indices(doc_ids: Iterable[str], boundaries: list[str]) -> np.ndarray:
    """The shard of each document: the last shard whose first id (``boundaries``, from
    :func:`shard_boundaries`) is not after its id. A worker computes it from the id alone."""
    return np.fromiter((max(bisect.bisect_right(boundaries, doc_id) - 1, 0) for doc_id in doc_ids), dtype=np.int64)


def add_shard_column(batch: pa.Table, boundaries: dict[str, list[str]]) -> pa.Table:
    """``batch`` (encoded rows with their ``split``) with the ``shard`` column each row goes to."""
    index = np.zeros(batch.num_rows, dtype=np.int64)
    splits = batch["split"].to_numpy(zero_copy_only=False)
    doc_ids = batch["doc_id"].to_pylist()
    for split, firsts in boundaries.items():
        rows = np.flatnonzero(splits == split)
        if rows.size:
            index[rows] = shard_indices((doc_ids[i] for i in rows), firsts)
    return batch.append_column("shard", pa.array(index, pa.int64()))


def shard_name(split: str, index: int) -> str:
    """``<split>/part-NNNNN.parquet``: the file of shard ``index`` of ``split``."""
    return f"{split}/part-{index:05d}.parquet"


def write_parquet(table: pa.Table, root: str, name: str, schema: pa.Schema,
                  filesystem: pafs.FileSystem | None = None) -> None:
    """Write ``table`` as ``<root>/<name>`` (``root``: a local folder or a URI, or a path inside
    ``filesystem``) with the fixed layout that makes a folder byte-identical across runs."""
    filesystem, base = storage.resolve(root, filesystem)
    path = f"{base}/{name}"
    filesystem.create_dir(posixpath.dirname(path), recursive=True)
    pq.write_table(table.cast(schema).combine_chunks(), path, filesystem=filesystem, row_group_size=ROW_GROUP_SIZE,
                   compression="zstd", use_dictionary=False, write_statistics=True)


def write_group(group: pa.Table, *, root: str, filesystem: pafs.FileSystem | None, task, spec) -> pa.Table:
    """Write the rows of one shard (one ``split`` and ``shard`` value), sorted by doc_id, and
    return what the driver keeps of it: one row of split, file name, documents and the task's
    :meth:`~dynlm.tasks.base.Task.shard_stats` (JSON). The Ray job runs it per group
    (``pipelines.prepare.write_shard``, one Ray task per shard), the in-process path per shard too."""
    split, index = group["split"][0].as_py(), int(group["shard"][0].as_py())
    rows = group.drop_columns(["split", "shard"]).sort_by([("doc_id", "ascending")])
    name = shard_name(split, index)
    write_parquet(rows, root, name, task.encoded_schema, filesystem)
    faults.kill_point("prepare:writing")
    stats = {"documents": rows.num_rows, **task.shard_stats(rows, spec)}
    return pa.table({"split": [split], "name": [name], "stats": [json.dumps(stats, sort_keys=True)]})


def write_split_tables(splits: dict[str, pa.Table], boundaries: dict[str, list[str]], root: str, task,
                       spec) -> list[dict]:
    """The in-process path's shards: :func:`write_group` on each shard of each split's table."""
    written = []
    for split in SPLITS:
        table = splits[split]
        if not table.num_rows:
            continue
        keyed = add_shard_column(table.append_column("split", pa.array([split] * table.num_rows, pa.string())),
                                 {split: boundaries[split]})
        keys = keyed["shard"].to_numpy()
        for index in sorted(set(keys.tolist())):
            group = keyed.filter(pa.array(keys == index))
            written.extend(write_group(group, root=root, filesystem=None, task=task, spec=spec).to_pylist())
    return written


def finish_folder(out: Path, shard_root: str, task, cfg, meta: pa.Table, written: list[dict], preprocessor, *,
                  rule: str, preprocessor_source: str, filesystem: pafs.FileSystem | None = None) -> dict:
    """After the shards are written (:func:`write_group` rows in ``written``): an empty shard
    for a split without documents, then the preprocessor and quarantine into ``out`` (the
    driver's local folder); returns the manifest (written last, by the publisher), with the
    task's counts from the per-shard stats."""
    (out / PREPROCESSOR_FILE).write_text(preprocessor.to_json(), encoding="utf-8")
    files: dict[str, list[str]] = {split: [] for split in SPLITS}
    stats: dict[str, dict[str, int]] = {split: {"documents": 0} for split in SPLITS}
    for row in written:
        files[row["split"]].append(row["name"])
        for key, value in json.loads(row["stats"]).items():
            stats[row["split"]][key] = stats[row["split"]].get(key, 0) + value
    for split in SPLITS:
        if not files[split]:  # every split has a file, maybe empty
            write_parquet(task.encoded_schema.empty_table(), shard_root, shard_name(split, 0), task.encoded_schema,
                          filesystem)
            files[split].append(shard_name(split, 0))
        files[split].sort()
    quarantine = meta.filter(pc.equal(meta["kind"], "quarantine")).select(
        ["source_file", "doc_id", "line", "reason"]).sort_by(
        [("source_file", "ascending"), ("line", "ascending"), ("doc_id", "ascending"), ("reason", "ascending")])
    write_parquet(quarantine, str(out), "quarantine/part-00000.parquet", QUARANTINE_SCHEMA)
    files["quarantine"] = ["quarantine/part-00000.parquet"]
    return {
        "task": task_ref(task),
        "config": cfg.to_dict(),
        "config_hash": cfg.data_hash(),
        "encoding_hash": cfg.encoding_hash(),
        "inputs": cfg.input_listing(),  # [name, size, digest] per file: what the key covers
        "counts": task.summarize(meta, stats, preprocessor),
        "split_rule": rule,
        "preprocessor": PREPROCESSOR_FILE,
        "preprocessor_source": preprocessor_source,
        "splits": {split: split for split in SPLITS},
        "quarantine": "quarantine",
        "files": files,
    }


def write_folder(out: Path, task, cfg, meta: pa.Table, splits: dict[str, pa.Table], preprocessor, *,
                 rule: str, preprocessor_source: str) -> dict:
    """The in-process path: the shards of ``splits`` (whole tables) into ``out``, then
    :func:`finish_folder`. The same files as the Ray job's (tested)."""
    written = write_split_tables(splits, shard_boundaries(meta), str(out), task, preprocessor.spec)
    return finish_folder(out, str(out), task, cfg, meta, written, preprocessor, rule=rule,
                         preprocessor_source=preprocessor_source)


def format_summary(task, counts: dict, rule: str) -> str:
    """The end-of-prepare table: the split rule, the per-split counts, the task's other rows."""
    lines = [f"{'split rule':32s}{SPLIT_RULE_TEXT[rule]}", f"{'':32s}" + "".join(f"{s:>12s}" for s in SPLITS)]
    per_split = ["documents"] + sorted(k for k, v in counts.items() if isinstance(v, dict) and k != "documents")
    for key in per_split:
        lines.append(f"{key:32s}" + "".join(f"{counts[key][s]:>12,d}" for s in SPLITS))
    lines += [f"{label:32s}{value:>12s}" for label, value in task.summary_lines(counts)]
    return "\n".join(lines)
