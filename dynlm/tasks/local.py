"""A task's prepare stages run in this process, on Arrow tables (no Ray): the Ray-free path.

The same stage functions as the Ray Data job (``pipelines/prepare.py``), in the same order, on
one in-memory batch: ``parse_files`` -> ``count_train`` summed per word -> ``fit_preprocessor``
(unless a fitted preprocessor is given) -> ``encoder``. :func:`prepare_in_memory` returns the
rows; :func:`prepare_local` writes them as a prepared folder through the same writer and
publisher as the Ray job (same files, same key). Meant for small corpora, tests and the
evaluation of raw files: every input file is read into memory.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dynlm import storage
from dynlm.data import prepared_writer as writer
from dynlm.data.prepared import PreparedData
from dynlm.data.publish import prepare_folder
from dynlm.tasks.base import Task

SPLITS = writer.SPLITS


@dataclass
class PreparedInMemory:
    """What the prepare stages give for a list of input files.

    Attributes:
        preprocessor: the task's preprocessor (fitted on the train split, or the one given).
        splits: ``{split: encoded table (task.encoded_schema), sorted by doc_id}``.
        parsed: every ``parsed_schema`` row (documents, dropped documents, quarantine records).
        split_rule: ``named`` / ``config`` / ``hash``.
    """

    preprocessor: Any
    tables: dict[str, pa.Table]
    parsed: pa.Table
    split_rule: str

    @property
    def splits(self) -> dict[str, list[dict]]:
        """``{split: encoded rows as dicts}``."""
        return {split: table.to_pylist() for split, table in self.tables.items()}

    def rows(self) -> list[dict]:
        """Every encoded document, all splits together, sorted by doc_id."""
        return sorted((row for rows in self.splits.values() for row in rows), key=lambda row: row["doc_id"])

    def rejected(self) -> list[dict]:
        """The dropped and quarantined records (``kind``, ``source_file``, ``doc_id``, ``line``, ``reason``)."""
        rows = self.parsed.filter(pc.not_equal(self.parsed["kind"], "document"))
        return rows.select(["kind", "source_file", "doc_id", "line", "reason"]).to_pylist()


def files_table(paths: list[str | Path]) -> pa.Table:
    """The ``{bytes, path}`` table Ray Data's ``read_binary_files(include_paths=True)`` gives."""
    return pa.table({"bytes": pa.array([storage.read_bytes(str(p)) for p in paths], pa.binary()),
                     "path": pa.array([str(p) for p in paths], pa.string())})


def prepare_in_memory(task: Task, files: pa.Table, data_cfg, *, preprocessor: Any | None = None,
                      require_train: bool = True) -> PreparedInMemory:
    """Run ``task``'s prepare stages on ``files`` (:func:`files_table`) with ``data_cfg``.

    Args:
        preprocessor: encode with it instead of fitting one on the train split.
        require_train: raise when no document falls in the train split (fitting needs one).

    Raises:
        ValueError / SplitRuleError: no readable document, duplicate doc ids, no single split
        rule, or (``require_train``) no train document.
    """
    resolved = writer.with_absolute_paths(data_cfg)
    parsed = task.parse_files(files, resolved.to_dict())
    meta = parsed.drop_columns(list(task.payload_columns))
    writer.check_documents(meta, data_cfg.inputs)
    rule = writer.split_rule(meta, resolved, require_train=require_train)
    if require_train and preprocessor is None:
        writer.check_train_split(meta, data_cfg, rule)
    if preprocessor is None:
        counts: Counter = Counter()
        for row in task.count_train(parsed).to_pylist():
            counts[row["word"]] += row["count"]
        preprocessor = task.fit_preprocessor(dict(counts), data_cfg)
    tables = writer.by_split([task.encoder(preprocessor.to_json())(parsed)], task.encoded_schema)
    return PreparedInMemory(preprocessor, tables, parsed, rule)


def prepare_local(data_cfg, *, task: Task | str = "lm", preprocessor: Any | None = None, strict: bool = False,
                  log=print) -> PreparedData:
    """:func:`prepare_in_memory` of ``data_cfg.inputs``, written as the prepared folder the Ray
    job (``pipelines.prepare.prepare``, same arguments) would write: same key under
    ``data_cfg.output_root``, same files, reused when complete."""
    from dynlm.tasks import get_task

    task = get_task(task) if isinstance(task, str) else task

    def build(out: Path, shard_root: str) -> dict:  # small inputs: every shard into out, uploaded from there
        given = preprocessor is not None
        done = prepare_in_memory(task, files_table(data_cfg.input_files()), data_cfg, preprocessor=preprocessor)
        meta = done.parsed.drop_columns(list(task.payload_columns))
        return writer.write_folder(out, task, data_cfg, meta, done.tables, done.preprocessor, rule=done.split_rule,
                                   preprocessor_source="given" if given else "fit on the train split")

    return prepare_folder(task, data_cfg, build, preprocessor=preprocessor, strict=strict, log=log)
