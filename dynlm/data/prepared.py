"""Read a prepared data folder (written by pipelines/prepare.py) with pyarrow only.

Layout (docs/ARCHITECTURE.md)::

    <root>/manifest.json       {"config", "config_hash", "counts", "preprocessor", "splits", "quarantine"}
    <root>/preprocessor.json   the Preprocessor artifact
    <root>/<split>/*.parquet   ENCODED_SCHEMA rows
    <root>/quarantine/*.parquet QUARANTINE_SCHEMA rows
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq

from dynlm.data.preprocessor import Preprocessor
from dynlm.vocab_spec import VocabSpec

SPLITS = ("train", "valid", "test")
MANIFEST = "manifest.json"


class PreparedData:
    """A prepared folder: manifest, preprocessor and the Parquet shards of each split.

    Build with :meth:`open`.
    """

    def __init__(self, root: Path, manifest: dict, preprocessor: Preprocessor):
        self.root = root
        self.manifest = manifest
        self.preprocessor = preprocessor

    @classmethod
    def open(cls, root: str | Path) -> "PreparedData":
        """Open ``root`` (the folder holding manifest.json).

        Raises:
            FileNotFoundError: no manifest.json (the folder was not prepared, or not finished).
            ValueError: the manifest lacks a required key.
        """
        root = Path(root)
        manifest_path = root / MANIFEST
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{manifest_path} not found: {root} is not a prepared data folder")
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        missing = [k for k in ("preprocessor", "splits") if k not in manifest]
        if missing:
            raise ValueError(f"{manifest_path}: missing keys {missing}")
        preprocessor = Preprocessor.load(root / manifest["preprocessor"])
        return cls(root, manifest, preprocessor)

    @property
    def spec(self) -> VocabSpec:
        return self.preprocessor.spec

    def _folder(self, split: str) -> Path:
        splits = self.manifest["splits"]
        if split not in splits:
            raise KeyError(f"unknown split {split!r}; this folder has {sorted(splits)}")
        return self.root / splits[split]

    def files(self, split: str) -> list[Path]:
        """The split's Parquet files, sorted by name (empty when the split has no documents)."""
        folder = self._folder(split)
        return sorted(folder.glob("*.parquet")) if folder.is_dir() else []

    def iter_rows(self, split: str, batch_size: int = 256) -> Iterator[dict]:
        """Encoded documents of a split as dicts of python lists, in file order."""
        for path in self.files(split):
            parquet = pq.ParquetFile(path)
            for batch in parquet.iter_batches(batch_size=batch_size):
                yield from batch.to_pylist()

    def num_documents(self, split: str) -> int:
        """Number of documents of a split (from the Parquet metadata, no data read)."""
        return sum(pq.ParquetFile(path).metadata.num_rows for path in self.files(split))

    def quarantine_rows(self) -> list[dict]:
        """All quarantined records (QUARANTINE_SCHEMA rows)."""
        folder = self.root / self.manifest.get("quarantine", "quarantine")
        rows: list[dict] = []
        for path in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
            rows.extend(pq.read_table(path).to_pylist())
        return rows
