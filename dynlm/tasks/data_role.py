"""The data role of a :class:`dynlm.tasks.Task`: raw files -> records -> a fitted preprocessor ->
encoded rows (what ``dynlm prepare`` runs, on Ray Data or in one process).

Pure functions of Arrow batches, so that Ray Data can run them in its workers and a Ray-free
path can call the very same ones (:func:`dynlm.tasks.local.prepare_in_memory`):
``parse_files`` -> ``count_train`` -> ``fit_preprocessor`` -> ``encoder``. Members that are plain
functions are static, so ``LMTask.parse_files`` is the module-level function itself (picklable by
reference, as Ray Data needs).

A task author writes (required): ``parse_files``, the schemas, ``data_config``, ``spec_class``,
a preprocessor (``preprocessor_class``: ``fit(counts, data_cfg)``, ``from_json(text)``,
``to_json()``, ``spec``) and either ``encode_document`` (one parsed record -> one encoded row)
or an ``encoder`` class; ``count_train`` by default counts :meth:`TaskData.train_units`.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections import Counter
from typing import Any, ClassVar, Iterable

import pyarrow as pa
import pyarrow.compute as pc

# Columns every task's parsed_schema has (the prepare job routes rows on them):
# kind: "document" | "dropped" | "quarantine"; source_file: the document's own file name;
# input_file: the input file the record was read from (the split rule is checked on it);
# split: "train" | "valid" | "test" ("" unless a document); line, reason: where and why a
# record was quarantined or dropped.
PARSED_COLUMNS = ("kind", "doc_id", "source_file", "input_file", "split", "line", "reason")


def parsed_schema(*payload: pa.Field) -> pa.Schema:
    """A ``parsed_schema``: :data:`PARSED_COLUMNS` (``line`` int64, the others strings) then ``payload``."""
    return pa.schema([pa.field(name, pa.int64() if name == "line" else pa.string()) for name in PARSED_COLUMNS]
                     + list(payload))


def document_record(doc_id: str, path: str, split: str, **payload) -> dict:
    """A ``parsed_schema`` row of a document read from the input file ``path`` (its own file:
    ``source_file``), with its split and its ``payload`` columns."""
    return dict(kind="document", doc_id=doc_id, source_file=path, input_file=path, split=split, line=0, reason="",
                **payload)


def quarantine_record(doc_id: str, path: str, line: int, reason: str, **empty_payload) -> dict:
    """A ``parsed_schema`` row of a record that could not be read: where (``path``, ``line``) and
    why; ``empty_payload`` gives the payload columns their empty values."""
    return dict(kind="quarantine", doc_id=doc_id, source_file=path, input_file=path, split="", line=line,
                reason=reason, **empty_payload)


class DocumentEncoder:
    """The default encode stage: ``task_class().encode_document(preprocessor, record)`` for each
    parsed document; ``encoded_schema`` rows plus ``split``. Built with the preprocessor's JSON
    once per Ray Data actor (``functools.partial(DocumentEncoder, task_class)``)."""

    def __init__(self, task_class: type, preprocessor_json: str):
        self.task = task_class()
        self.preprocessor = self.task.load_preprocessor(preprocessor_json)

    def __call__(self, batch: pa.Table) -> pa.Table:
        documents = batch.filter(pc.equal(batch["kind"], "document"))
        rows = [self.task.encode_document(self.preprocessor, record) for record in documents.to_pylist()]
        table = pa.Table.from_pylist(rows, schema=self.task.encoded_schema)
        return table.append_column("split", documents["split"])


class TaskData(ABC):
    """The data role (module docstring).

    Attributes:
        parsed_schema: rows of ``parse_files`` (has :data:`PARSED_COLUMNS`: :func:`parsed_schema`).
        payload_columns: columns of ``parsed_schema`` that hold the text (left on the workers:
            the driver collects the other, small columns of every record).
        encoded_schema: rows of the prepared Parquet shards (what ``collate`` reads).
        data_config: strict :class:`dynlm.config.Config` class of the ``data:`` section.
        spec_class: the strict config class of ``preprocessor.spec`` (what a model is built
            from besides its config; checkpoints store it).
        preprocessor_class: ``fit(counts, data_cfg)``, ``from_json(text)`` (the defaults of
            :meth:`fit_preprocessor` / :meth:`load_preprocessor` call them).
    """

    name: ClassVar[str]
    parsed_schema: ClassVar[pa.Schema]
    payload_columns: ClassVar[tuple[str, ...]]
    encoded_schema: ClassVar[pa.Schema]
    data_config: ClassVar[type]
    spec_class: ClassVar[type]
    preprocessor_class: ClassVar[type]

    @staticmethod
    @abstractmethod
    def parse_files(batch: pa.Table, cfg_dict: dict) -> pa.Table:
        """``{bytes, path}`` rows (one per input file) -> ``parsed_schema`` rows, split assigned."""

    def train_units(self, record: dict) -> Iterable[str]:
        """The units a parsed train document counts (default :meth:`count_train`'s): the
        vocabulary a preprocessor is fitted on (words, characters ...)."""
        raise NotImplementedError(f"task {self.name!r}: define train_units or count_train")

    def count_train(self, batch: pa.Table) -> pa.Table:
        """``parsed_schema`` rows -> ``{word: string, count: int64}`` of this batch's train split
        (default: :meth:`train_units` of each train document)."""
        train = batch.filter(pc.and_(pc.equal(batch["kind"], "document"), pc.equal(batch["split"], "train")))
        counts = Counter(unit for record in train.to_pylist() for unit in self.train_units(record))
        return pa.table({"word": pa.array(list(counts), pa.string()), "count": pa.array(list(counts.values()), pa.int64())})

    def fit_preprocessor(self, counts: dict[str, int], data_cfg) -> Any:
        """The preprocessor fitted on the summed train counts; it has ``to_json()`` and ``spec``."""
        return self.preprocessor_class.fit(counts, data_cfg)

    def load_preprocessor(self, text: str) -> Any:
        """The preprocessor from its ``to_json()`` text (``preprocessor.json``)."""
        return self.preprocessor_class.from_json(text)

    def encode_document(self, preprocessor: Any, record: dict) -> dict:
        """One parsed document (a ``parsed_schema`` dict) -> one ``encoded_schema`` row (the
        default :attr:`encoder` calls it)."""
        raise NotImplementedError(f"task {self.name!r}: define encode_document or encoder")

    @property
    def encoder(self) -> Any:
        """Encode stage: ``encoder(preprocessor_json)(parsed batch) -> encoded_schema + split``.

        A class (or a partial of one) so that Ray Data's actors load the preprocessor once
        (``ActorPoolStrategy``). Default: :class:`DocumentEncoder` of :meth:`encode_document`.
        """
        return functools.partial(DocumentEncoder, type(self))

    def evaluation_data_config(self, preprocessor: Any, inputs: list[str]) -> Any:
        """The data config that reads raw files for a model fitted with ``preprocessor`` (``dynlm
        evaluate`` on raw files); the caller may override its fields. Default: the defaults."""
        return self.data_config(inputs=list(inputs))

    def derive_preprocessor(self, preprocessor: Any, data_cfg) -> Any:
        """The preprocessor of ``data_cfg`` from one fitted for a config of the same
        ``encoding_hash`` (the LM: another ``gamma``). Only called when ``data_cfg.encoding_hash()``
        differs from its ``data_hash()``; the default encoding hash never does."""
        raise NotImplementedError(f"task {self.name!r} shares no shards between data configs")

    def shard_stats(self, table: pa.Table, spec: Any) -> dict[str, int]:
        """Sums over the encoded rows of one shard that :meth:`summarize` needs (the shard's
        ``documents`` are counted for every task). Computed where the shard is written, so no
        split is ever gathered in one place; summed per split. Default: nothing more."""
        return {}

    def split_stats(self, splits: dict[str, pa.Table], spec: Any) -> dict[str, dict[str, int]]:
        """:meth:`shard_stats` of whole split tables (the in-memory path), as :meth:`summarize` takes them."""
        return {split: {"documents": table.num_rows, **self.shard_stats(table, spec)} for split, table in splits.items()}

    def summarize(self, meta: pa.Table, split_stats: dict[str, dict[str, int]], preprocessor: Any) -> dict:
        """The manifest ``counts``: ``meta`` is every parsed record without ``payload_columns``,
        ``split_stats`` the per-split sums of :meth:`shard_stats` (with ``documents``). Tasks add
        their own counts to these."""
        kinds = meta["kind"].to_numpy(zero_copy_only=False)
        return {"documents": {split: stats["documents"] for split, stats in split_stats.items()},
                "dropped_docs": int((kinds == "dropped").sum()), "quarantined": int((kinds == "quarantine").sum()),
                "input_files": len(set(meta["input_file"].to_pylist()))}

    def summary_lines(self, counts: dict) -> list[tuple[str, str]]:
        """``(label, value)`` rows the prepare table shows below the documents per split."""
        return [("quarantined records", f"{counts['quarantined']:,d}"), ("dropped documents", f"{counts['dropped_docs']:,d}")]
