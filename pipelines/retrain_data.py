"""Prepare a retrain's new documents with Ray Data, reusing a fitted preprocessor.

The stages are those of :mod:`pipelines.prepare` (parse -> anonymize -> split, encode with an
actor pool, sorted Parquet shards), with two differences a scheduled retrain needs:

* the preprocessor (vocabulary + short list + BPE) is GIVEN (the champion's preprocessor.json),
  so the challenger sees exactly the champion's ids; ``None`` refits it on the new train split;
* the folder is addressed by the CONTENT of the input files (plus the data settings and the
  preprocessor), ``<output_root>/retrain-<hash>/``: a folder whose files changed is a new
  folder, never a stale reuse.

Inputs are document files (CoNLL / plain text, as ``dynlm prepare`` reads them) or Parquet
files of DOCUMENT_SCHEMA rows (``doc_id, source_file, sentences, mentions``), not both.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pyarrow as pa

from dynlm import storage
from dynlm.config import config_hash
from dynlm.data.anonymize import anonymize
from dynlm.data.config import DataConfig
from dynlm.data.prepared import PreparedData
from dynlm.data.preprocessor import Preprocessor
from dynlm.data.schema import ENCODED_SCHEMA, QUARANTINE_SCHEMA
from dynlm.data.split import assign_split
from pipelines import prepare as base
from pipelines import prepare_stages as stages

DOCUMENT_COLUMNS = ["doc_id", "source_file", "sentences", "mentions"]


def _input_files(item: str) -> list[str]:
    """Every file of the input ``item`` (a file, or a folder: recursively, hidden files skipped),
    sorted: absolute paths, or URIs for a URI input."""
    try:
        return storage.list_files(item)
    except FileNotFoundError:
        raise FileNotFoundError(f"retrain input {item!r} does not exist") from None


def file_listing(inputs: list[str]) -> list[tuple[str, str]]:
    """``(name, sha256 of the bytes)`` of every file of ``inputs`` (hidden files skipped); the
    name is ``<input index>:<path below the input>`` (the file name for an input file)."""
    listing = []
    for index, item in enumerate(inputs):
        folder = storage.absolute(item).rstrip("/")
        for path in _input_files(item):
            name = path[len(folder):].lstrip("/") or path.rsplit("/", 1)[-1]  # a file: its name
            digest = hashlib.sha256()
            with storage.open_read(path) as stream:
                while chunk := stream.read(1 << 20):
                    digest.update(chunk)
            listing.append((f"{index}:{name}", digest.hexdigest()))
    return listing


def input_paths(inputs: list[str]) -> tuple[list[str], bool]:
    """Absolute paths / URIs of the input files, and whether they are Parquet documents."""
    paths = [path for item in inputs for path in _input_files(item)]
    if not paths:
        raise ValueError(f"retrain inputs {inputs}: no file found")
    parquet = [p.endswith(".parquet") for p in paths]
    if any(parquet) and not all(parquet):
        raise ValueError(f"retrain inputs {inputs} mix Parquet and other files; give one kind")
    return paths, all(parquet)


def _parse_document_rows(batch: pa.Table, cfg_dict: dict) -> pa.Table:
    """DOCUMENT_SCHEMA rows -> pipelines.prepare.PARSED_SCHEMA rows (anonymized, split)."""
    cfg = DataConfig.from_dict(cfg_dict)
    out: dict[str, list] = {f.name: [] for f in stages.PARSED_SCHEMA}
    for doc in batch.to_pylist():
        values = {"kind": "document", "doc_id": doc["doc_id"], "source_file": doc["source_file"], "split": "",
                  "sentences": [], "line": 0, "reason": "", **{k: 0 for k in stages.DOC_STATS}}
        try:
            anonymized, stats = anonymize(doc, max_chains=cfg.max_chains, min_chain_mentions=cfg.min_chain_mentions,
                                          too_many_chains=cfg.too_many_chains)
        except (ValueError, KeyError, TypeError) as exc:
            values.update(kind="quarantine", reason=f"anonymize: {type(exc).__name__}: {exc}")
            anonymized, stats = None, {}
        if anonymized is None and values["kind"] == "document":
            values.update(kind="dropped", reason=f"more than max_chains={cfg.max_chains} entity chains")
        elif anonymized is not None:
            values.update(sentences=anonymized["sentences"], split=assign_split(
                doc["doc_id"], seed=cfg.split_seed, valid_fraction=cfg.valid_fraction, test_fraction=cfg.test_fraction))
        values.update({k: stats.get(k, 0) for k in stages.DOC_STATS})
        values["num_sentences"] = len(values["sentences"])
        values["num_tokens"] = sum(len(s) for s in values["sentences"])
        for key, value in values.items():
            out[key].append(value)
    return pa.Table.from_pydict(out, schema=stages.PARSED_SCHEMA)


def _build(cfg: DataConfig, preprocessor: Preprocessor | None, out: Path, inputs_hash: str) -> dict:
    import ray

    from pipelines.ray_env import init_ray

    init_ray()
    started = time.perf_counter()
    paths, is_parquet = input_paths(cfg.inputs)
    if is_parquet:
        parsed = ray.data.read_parquet(paths, columns=DOCUMENT_COLUMNS).map_batches(
            _parse_document_rows, batch_format="pyarrow", fn_kwargs={"cfg_dict": cfg.to_dict()})
    else:
        parsed = ray.data.read_binary_files(paths, include_paths=True).map_batches(
            stages.parse_files, batch_format="pyarrow", batch_size=1, fn_kwargs={"cfg_dict": cfg.to_dict()})
    parsed = parsed.repartition(target_num_rows_per_block=base.DOCS_PER_BLOCK).materialize()
    meta = base._collect(parsed.drop_columns(["sentences"]))
    kinds = meta["kind"].to_numpy(zero_copy_only=False)
    documents = meta.filter(pa.array(kinds == "document"))
    if documents.num_rows == 0:
        raise ValueError(f"retrain inputs {cfg.inputs}: no document could be read")
    doc_ids = documents["doc_id"].to_pylist()
    if len(set(doc_ids)) != len(doc_ids):
        duplicate = next(d for d in doc_ids if doc_ids.count(d) > 1)
        raise ValueError(f"retrain inputs {cfg.inputs}: duplicate doc_id {duplicate!r}")

    if preprocessor is None:  # rebuild_vocabulary: fit on the new train split, like prepare
        word_counts = base._train_word_counts(parsed, ray)
        preprocessor = Preprocessor.fit(word_counts, cfg)
        source = "fit on the new train split"
    else:
        source = "given (the champion's)"
    preprocessor.save(out / "preprocessor.json")

    tables = base._encode_by_split(parsed, preprocessor, cfg, ray)  # sorted by doc_id per split
    files, doc_counts = {}, {}
    for split in base.SPLITS:
        table = tables[split]
        files[split] = base._write_shards(table, out / split, ENCODED_SCHEMA, base.ROWS_PER_SHARD)
        doc_counts[split] = table.num_rows
    quarantine = meta.filter(pa.array(kinds == "quarantine")).select(["source_file", "doc_id", "line", "reason"])
    files["quarantine"] = base._write_shards(quarantine, out / "quarantine", QUARANTINE_SCHEMA,
                                             max(1, quarantine.num_rows))
    return {
        "config": cfg.to_dict(), "config_hash": cfg.data_hash(), "inputs_hash": inputs_hash,
        "preprocessor": "preprocessor.json", "preprocessor_source": source,
        "splits": {s: s for s in base.SPLITS}, "quarantine": "quarantine", "files": files,
        "counts": {"documents": doc_counts, "quarantined": quarantine.num_rows,
                   "dropped_docs": int((kinds == "dropped").sum())},
        "timings_s": {"build": round(time.perf_counter() - started, 3)},
    }


def prepare_with_preprocessor(cfg: DataConfig, preprocessor: Preprocessor | None, *,
                              inputs_hash: str) -> PreparedData:
    """Prepare (or reuse) ``<cfg.output_root>/retrain-<hash>/`` for the documents of ``cfg.inputs``.

    Args:
        cfg: data settings (anonymization, split, and vocabulary sizes when refitting).
        preprocessor: the fitted artifact to encode with; None: fit one on the train split.
        inputs_hash: content hash of the input files (:func:`file_listing`), part of the address.

    Returns:
        The prepared folder (same layout as ``dynlm prepare``; manifest written last), local or
        at a URI ``output_root`` like :func:`pipelines.prepare.prepare`.
    """
    identity = {"data": cfg.data_hash(), "inputs": inputs_hash,
                "preprocessor": hashlib.sha256(preprocessor.to_json().encode()).hexdigest()
                if preprocessor is not None else "refit"}
    final = base.prepared_root(cfg.output_root, f"retrain-{config_hash(identity)}")
    manifest = base.publish(final, lambda out, _share: _build(cfg, preprocessor, out, inputs_hash))
    if manifest is None:  # concurrent retrains of the same inputs build it once
        print(f"[retrain] reusing prepared {final}")
    return PreparedData.open(final)
