"""Ray-free preparation of a data folder (small corpora, tests, ``--local`` runs).

Same steps and output layout as the Ray Data job in pipelines/prepare.py (docs/ARCHITECTURE.md):
read every input file -> quarantine malformed documents -> anonymize -> split (the same rule:
named / config / hash, dynlm/data/split.py) ->
fit the Preprocessor on the train split's word counts -> encode -> Parquet shards + manifest.
The building blocks (:func:`input_files`, :func:`split_and_anonymize`, :func:`encode_row`,
:func:`write_manifest`) are shared with the Ray job so that both write the same thing.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dynlm.data.anonymize import anonymize, empty_stats
from dynlm.data.config import DataConfig
from dynlm.data.prepared import MANIFEST, SPLITS, PreparedData
from dynlm.data.preprocessor import Preprocessor
from dynlm.data.readers import parse_file
from dynlm.data.schema import ENCODED_SCHEMA, QUARANTINE_SCHEMA, Quarantined
from dynlm.data.split import assign_split, check_split_rule, file_split

PREPROCESSOR_FILE = "preprocessor.json"


def input_files(inputs: list[str]) -> list[Path]:
    """Expand files and folders (recursively, hidden files skipped) into a sorted file list."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            files.extend(p for p in sorted(path.rglob("*")) if p.is_file() and not p.name.startswith("."))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"input {item!r} does not exist")
    return sorted(set(files))


def split_and_anonymize(doc: dict, cfg: DataConfig, file_level_split: str | None) -> tuple[str, dict | None, dict]:
    """(split, anonymized document or None when dropped, stats) of one parsed document.

    ``file_level_split`` is its file's named or configured split (``split.file_split``); None
    means the hash split of unsplit inputs.
    """
    split = file_level_split or assign_split(doc["doc_id"], seed=cfg.split_seed,
                                             valid_fraction=cfg.valid_fraction, test_fraction=cfg.test_fraction)
    anonymized, stats = anonymize(doc, max_chains=cfg.max_chains, min_chain_mentions=cfg.min_chain_mentions,
                                  too_many_chains=cfg.too_many_chains)
    return split, anonymized, stats


def encode_row(preprocessor: Preprocessor, doc: dict) -> dict:
    """ENCODED_SCHEMA row of an anonymized document."""
    return {"doc_id": doc["doc_id"], "source_file": doc["source_file"],
            **preprocessor.encode_document(doc["sentences"])}


def write_manifest(root: Path, cfg: DataConfig, counts: dict, split_rule: str) -> Path:
    manifest = {
        "config": cfg.to_dict(),
        "config_hash": cfg.data_hash(),
        "counts": counts,
        "split_rule": split_rule,
        "preprocessor": PREPROCESSOR_FILE,
        "splits": {split: split for split in SPLITS},
        "quarantine": "quarantine",
    }
    path = root / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8")
    return path


def prepare_local(cfg: DataConfig, root: str | Path | None = None) -> PreparedData:
    """Prepare ``cfg.inputs`` into ``root`` (default ``<output_root>/<data_hash>``) in this process.

    Returns:
        The opened prepared folder. The manifest is written last, so a folder without one is
        unfinished.
    """
    root = Path(root) if root is not None else Path(cfg.output_root) / cfg.data_hash()
    root.mkdir(parents=True, exist_ok=True)
    by_split: dict[str, list[dict]] = {split: [] for split in SPLITS}
    quarantined: list[dict] = []
    stats = empty_stats()
    inputs = [os.path.abspath(item) for item in cfg.inputs]  # absolute like the files (links kept)
    splits = {split: [os.path.abspath(item) for item in paths] for split, paths in cfg.splits.items()}
    document_files: list[str] = []
    for path in input_files(cfg.inputs):
        _, file_level_split = file_split(os.path.abspath(path), inputs, splits)
        for item in parse_file(path.read_bytes(), str(path), cfg.format, lines_per_document=cfg.lines_per_document):
            if isinstance(item, Quarantined):
                quarantined.append(item.to_dict())
                continue
            split, anonymized, doc_stats = split_and_anonymize(item, cfg, file_level_split)
            for key, value in doc_stats.items():
                stats[key] += value
            if anonymized is not None:
                by_split[split].append(anonymized)
                document_files.append(os.path.abspath(path))
    split_rule = check_split_rule(document_files, inputs, splits,
                                  [split for split, docs in by_split.items() if docs])
    if not by_split["train"]:
        raise ValueError(f"no train documents in {cfg.inputs} ({len(quarantined)} quarantined)")
    word_counts = Counter(w for d in by_split["train"] for s in d["sentences"] for w in s)
    preprocessor = Preprocessor.fit(dict(word_counts), cfg)
    preprocessor.save(root / PREPROCESSOR_FILE)
    for split, docs in by_split.items():
        (root / split).mkdir(exist_ok=True)
        if docs:
            table = pa.Table.from_pylist([encode_row(preprocessor, d) for d in docs], schema=ENCODED_SCHEMA)
            pq.write_table(table, root / split / "part-00000.parquet")
    (root / "quarantine").mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pylist(quarantined, schema=QUARANTINE_SCHEMA),
                   root / "quarantine" / "part-00000.parquet")
    counts = {**stats, "quarantined": len(quarantined),
              **{f"{split}_documents": len(docs) for split, docs in by_split.items()},
              **{f"{split}_tokens": sum(len(s) + 2 for d in docs for s in d["sentences"])
                 for split, docs in by_split.items()}}
    write_manifest(root, cfg, counts, split_rule)
    return PreparedData.open(root)
