"""A task's prepare stages run in this process, on Arrow tables (no Ray): the Ray-free path.

The same stage functions as the Ray Data job, in the same order, on one in-memory batch:
``parse_files`` -> ``count_train`` summed per word -> ``fit_preprocessor`` -> ``encoder``.
Meant for small corpora and tests (every file is read into memory); the output is the
encoded rows per split sorted by ``doc_id`` (the order the prepare job writes them in).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dynlm.tasks.base import Task

SPLITS = ("train", "valid", "test")


@dataclass
class PreparedInMemory:
    """What the prepare stages give for a list of input files.

    Attributes:
        preprocessor: the task's preprocessor fitted on the train split.
        splits: ``{split: encoded rows (dicts of task.encoded_schema), sorted by doc_id}``.
        parsed: every ``parsed_schema`` row (documents, dropped documents, quarantine records).
    """

    preprocessor: Any
    splits: dict[str, list[dict]]
    parsed: pa.Table

    def rejected(self) -> list[dict]:
        """The dropped and quarantined records (``kind``, ``source_file``, ``doc_id``, ``line``, ``reason``)."""
        rows = self.parsed.filter(pc.not_equal(self.parsed["kind"], "document"))
        return rows.select(["kind", "source_file", "doc_id", "line", "reason"]).to_pylist()


def files_table(paths: list[str | Path]) -> pa.Table:
    """The ``{bytes, path}`` table Ray Data's ``read_binary_files(include_paths=True)`` gives."""
    return pa.table({"bytes": pa.array([Path(p).read_bytes() for p in paths], pa.binary()),
                     "path": pa.array([str(p) for p in paths], pa.string())})


def prepare_in_memory(task: Task, files: pa.Table, data_cfg) -> PreparedInMemory:
    """Run ``task``'s prepare stages on ``files`` (:func:`files_table`) with ``data_cfg``.

    Raises:
        ValueError: no train document (nothing to fit the preprocessor on).
    """
    parsed = task.parse_files(files, data_cfg.to_dict())
    counts: Counter = Counter()
    for row in task.count_train(parsed).to_pylist():
        counts[row["word"]] += row["count"]
    documents = parsed.filter(pc.equal(parsed["kind"], "document"))
    if not pc.any(pc.equal(documents["split"], "train")).as_py():
        raise ValueError(f"prepare_in_memory: no train documents in {files['path'].to_pylist()}")
    preprocessor = task.fit_preprocessor(dict(counts), data_cfg)
    encoded = task.encoder(preprocessor.to_json())(parsed)
    splits = {}
    for split in SPLITS:
        rows = encoded.filter(pc.equal(encoded["split"], split)).drop_columns(["split"])
        splits[split] = sorted(rows.to_pylist(), key=lambda row: row["doc_id"])
    return PreparedInMemory(preprocessor, splits, parsed)
