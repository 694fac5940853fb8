"""Read a prepared data folder (written by dynlm.data.prepared_writer) with pyarrow only.

Layout (docs/ARCHITECTURE.md)::

    <root>/manifest.json       {"task", "config", "config_hash", "counts", "preprocessor", "splits", "quarantine", ...}
    <root>/preprocessor.json   the task's preprocessor (the LM: dynlm.data.preprocessor.Preprocessor)
    <root>/<split>/*.parquet   the task's encoded_schema rows
    <root>/quarantine/*.parquet QUARANTINE_SCHEMA rows

``root`` is a local folder or a URI of any filesystem pyarrow knows (``s3://bucket/prepared/<hash>``,
``gs://...``, ``file:///...``); every read goes through :mod:`dynlm.storage` on that folder's
``pyarrow.fs`` filesystem (resolved once, when the folder is opened). A folder
without manifest.json is incomplete (the manifest is always written last).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dynlm import storage

SPLITS = ("train", "valid", "test")
MANIFEST = "manifest.json"


def is_prepared(root: str | Path) -> bool:
    """Whether ``root`` holds a manifest.json (a complete prepared folder)."""
    try:
        return storage.is_file(storage.join(root, MANIFEST))
    except (OSError, ValueError):  # an unknown scheme, or a bucket that cannot be reached
        return False


class PreparedData:
    """A prepared folder: manifest, preprocessor and the Parquet shards of each split.

    Build with :meth:`open`. ``root`` is what was opened (a ``Path``, or the URI string);
    ``filesystem`` + ``path`` address it for pyarrow (``path`` is inside ``filesystem``).
    """

    def __init__(self, root: Path | str, manifest: dict, preprocessor: Any,
                 filesystem: pafs.FileSystem | None = None, path: str | None = None):
        from dynlm.tasks import get_task  # lazy: the tasks import the data modules

        self.task = get_task(manifest["task"])
        self.root = root
        self.manifest = manifest
        self.preprocessor = preprocessor
        if filesystem is None:
            filesystem, path = storage.resolve(root)
        self.filesystem = filesystem
        self.path = path

    @classmethod
    def open(cls, root: str | Path) -> "PreparedData":
        """Open ``root`` (the folder holding manifest.json): a local path or a URI.

        Raises:
            FileNotFoundError: no manifest.json (the folder was not prepared, or not finished).
            ValueError: the manifest lacks a required key.
        """
        root = root.rstrip("/") if storage.is_uri(root) else Path(root)
        filesystem, path = storage.resolve(root)
        if not storage.is_file(f"{path}/{MANIFEST}", filesystem=filesystem):
            raise FileNotFoundError(f"{root}/{MANIFEST} not found: {root} is not a prepared data folder")
        manifest = json.loads(storage.read_bytes(f"{path}/{MANIFEST}", filesystem=filesystem))
        missing = [k for k in ("task", "preprocessor", "splits") if k not in manifest]
        if missing:
            raise ValueError(f"{root}/{MANIFEST}: missing keys {missing} (prepared by an older dynlm? prepare again)")
        from dynlm.tasks import get_task  # lazy: the tasks import the data modules

        preprocessor = get_task(manifest["task"]).load_preprocessor(
            storage.read_text(f"{path}/{manifest['preprocessor']}", filesystem=filesystem))
        return cls(root, manifest, preprocessor, filesystem, path)

    def read_bytes(self, name: str) -> bytes:
        """The bytes of the file ``<root>/<name>`` (e.g. ``"preprocessor.json"``)."""
        return storage.read_bytes(f"{self.path}/{name}", filesystem=self.filesystem)

    @property
    def spec(self):
        """The preprocessor's spec (the LM: a :class:`dynlm.vocab_spec.VocabSpec`)."""
        return self.preprocessor.spec

    def _display(self, relative: str) -> Path | str:
        """``<root>/<relative>`` as the caller named root: a Path, or a URI string."""
        return self.root / relative if isinstance(self.root, Path) else f"{self.root}/{relative}"

    def _parquet(self, folder: str) -> list[str]:
        """Names (relative to root) of the ``*.parquet`` files of ``folder``, sorted."""
        files = storage.list_files(f"{self.path}/{folder}", recursive=False, missing_ok=True,
                                   filesystem=self.filesystem)
        return [f"{folder}/{posixpath.basename(f)}" for f in files if f.endswith(".parquet")]

    def shard_names(self) -> list[str]:
        """Every Parquet file of the folder (splits and quarantine), relative to root, sorted."""
        folders = {*self.manifest["splits"].values(), self.manifest.get("quarantine", "quarantine")}
        return sorted(name for folder in folders for name in self._parquet(folder))

    def _folder(self, split: str) -> str:
        splits = self.manifest["splits"]
        if split not in splits:
            raise KeyError(f"unknown split {split!r}; this folder has {sorted(splits)}")
        return splits[split]

    def files(self, split: str) -> list[Path] | list[str]:
        """The split's Parquet files, sorted by name (empty when the split has no documents).

        Paths for a local root, URIs for a URI root: both go to ``ray.data.read_parquet``
        (with ``filesystem=self.filesystem`` for stores whose settings are not in the URI).
        """
        return [self._display(name) for name in self._parquet(self._folder(split))]

    def _tables(self, folder: str) -> Iterator[pq.ParquetFile]:
        """The Parquet files of ``folder`` in name order, each open while the caller reads it."""
        for name in self._parquet(folder):
            with self.filesystem.open_input_file(f"{self.path}/{name}") as handle:
                yield pq.ParquetFile(handle)

    def iter_rows(self, split: str, batch_size: int = 256) -> Iterator[dict]:
        """Encoded documents of a split as dicts of python lists, in file order."""
        for parquet in self._tables(self._folder(split)):
            for batch in parquet.iter_batches(batch_size=batch_size):
                yield from batch.to_pylist()

    def read_columns(self, split: str, columns: list[str]) -> pa.Table:
        """Some columns of a whole split, in file order (e.g. ``["sentence_lengths"]``)."""
        tables = [parquet.read(columns=columns) for parquet in self._tables(self._folder(split))]
        return pa.concat_tables(tables) if tables else self.task.encoded_schema.empty_table().select(columns)

    def num_documents(self, split: str) -> int:
        """Number of documents of a split (from the Parquet metadata, no data read)."""
        return sum(parquet.metadata.num_rows for parquet in self._tables(self._folder(split)))

    def split_bytes(self, split: str) -> int:
        """Uncompressed size of a split (its Arrow data in memory), from the Parquet metadata."""
        return sum(parquet.metadata.row_group(i).total_byte_size
                   for parquet in self._tables(self._folder(split)) for i in range(parquet.metadata.num_row_groups))

    def quarantine_rows(self) -> list[dict]:
        """All quarantined records (QUARANTINE_SCHEMA rows)."""
        rows: list[dict] = []
        for parquet in self._tables(self.manifest.get("quarantine", "quarantine")):
            rows.extend(parquet.read().to_pylist())
        return rows
