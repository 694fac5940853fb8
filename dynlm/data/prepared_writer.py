"""What a prepared folder contains, written from a task's stage outputs (no Ray).

The Ray Data job (``pipelines/prepare.py``) and the in-process path
(:func:`dynlm.tasks.local.prepare_local`) both end here, so they write the same files::

    <folder>/train|valid|test/part-NNNNN.parquet   the task's encoded_schema, sorted by doc_id
    <folder>/quarantine/part-00000.parquet         QUARANTINE_SCHEMA (source_file, doc_id, line, reason)
    <folder>/preprocessor.json                     the task's preprocessor
    <folder>/manifest.json                         written last by dynlm.data.publish

The checks every prepare runs on the parsed records are here too: some document was read, no
doc_id twice, one split rule for all input files.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dynlm import faults, storage
from dynlm.data.schema import QUARANTINE_SCHEMA
from dynlm.data.split import check_split_rule
from dynlm.tasks import task_ref

SPLITS = ("train", "valid", "test")
ROWS_PER_SHARD = 256  # documents per Parquet file (fixed: part of the byte-identical output)
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
    """Encoded batches (``schema`` + a ``split`` column) -> one table per split, sorted by doc_id."""
    parts: dict[str, list[pa.Table]] = defaultdict(list)
    for batch in encoded:
        for split in SPLITS:
            part = batch.filter(pc.equal(batch["split"], split))
            if part.num_rows:
                parts[split].append(part.drop_columns(["split"]).cast(schema))
    return {split: (pa.concat_tables(parts[split]) if parts[split] else schema.empty_table())
            .sort_by([("doc_id", "ascending")]) for split in SPLITS}


def write_shards(table: pa.Table, folder: Path, schema: pa.Schema, rows_per_shard: int = ROWS_PER_SHARD) -> list[str]:
    """Write ``table`` as ``part-00000.parquet``, ... (at least one file, maybe empty)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for index, start in enumerate(range(0, max(table.num_rows, 1), rows_per_shard)):
        part = table.slice(start, rows_per_shard).cast(schema).combine_chunks()
        name = f"part-{index:05d}.parquet"
        pq.write_table(part, folder / name, row_group_size=ROW_GROUP_SIZE, compression="zstd",
                       use_dictionary=False, write_statistics=True)
        names.append(f"{folder.name}/{name}")
        faults.kill_point("prepare:writing")
    return names


def write_folder(out: Path, task, cfg, meta: pa.Table, splits: dict[str, pa.Table], preprocessor, *,
                 rule: str, preprocessor_source: str) -> dict:
    """Write the shards, quarantine and preprocessor of a prepare into ``out``; the manifest
    (returned, written by the publisher) has the task's counts and what the key covers."""
    (out / PREPROCESSOR_FILE).write_text(preprocessor.to_json(), encoding="utf-8")
    files = {split: write_shards(splits[split], out / split, task.encoded_schema) for split in SPLITS}
    quarantine = meta.filter(pc.equal(meta["kind"], "quarantine")).select(
        ["source_file", "doc_id", "line", "reason"]).sort_by(
        [("source_file", "ascending"), ("line", "ascending"), ("doc_id", "ascending"), ("reason", "ascending")])
    files["quarantine"] = write_shards(quarantine, out / "quarantine", QUARANTINE_SCHEMA, max(1, quarantine.num_rows))
    return {
        "task": task_ref(task),
        "config": cfg.to_dict(),
        "config_hash": cfg.data_hash(),
        "encoding_hash": cfg.encoding_hash(),
        "inputs": cfg.input_listing(),  # [name, size, digest] per file: what the key covers
        "counts": task.summarize(meta, splits, preprocessor),
        "split_rule": rule,
        "preprocessor": PREPROCESSOR_FILE,
        "preprocessor_source": preprocessor_source,
        "splits": {split: split for split in SPLITS},
        "quarantine": "quarantine",
        "files": files,
    }


def format_summary(task, counts: dict, rule: str) -> str:
    """The end-of-prepare table: the split rule, the per-split counts, the task's other rows."""
    lines = [f"{'split rule':32s}{SPLIT_RULE_TEXT[rule]}", f"{'':32s}" + "".join(f"{s:>12s}" for s in SPLITS)]
    per_split = ["documents"] + sorted(k for k, v in counts.items() if isinstance(v, dict) and k != "documents")
    for key in per_split:
        lines.append(f"{key:32s}" + "".join(f"{counts[key][s]:>12,d}" for s in SPLITS))
    lines += [f"{label:32s}{value:>12s}" for label, value in task.summary_lines(counts)]
    return "\n".join(lines)
