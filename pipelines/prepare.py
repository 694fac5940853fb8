"""Ray Data preprocessing job: input files -> anonymized, split, encoded Parquet shards.

Stages (one Ray Dataset flows through them; raw text never comes back to the driver)::

    read_binary_files(inputs, include_paths=True)       one row per input file
    map_batches(parse_files)                            parse_file -> anonymize -> split
                                                        (documents and quarantine records, one table)
    --- driver: one split rule for all files (named / config / hash, dynlm/data/split.py) ---
    map_batches(count_train_words).groupby("word").sum("count")    word counts of the TRAIN split
    --- driver: Preprocessor.fit(word counts) (vocabulary + short list + BPE), saved as JSON ---
    map_batches(EncodeDocuments, ActorPoolStrategy)     each actor loads the preprocessor JSON once
    --- driver: encoded ids streamed with iter_batches, sorted by doc_id per split, written ---

Output: ``<output_root>/<data_hash>/`` (the key covers what the inputs contain, not their paths:
:mod:`dynlm.data.fingerprint`) with ``train|valid|test/part-NNNNN.parquet``
(ENCODED_SCHEMA), ``quarantine/part-00000.parquet``, ``preprocessor.json`` and, written last,
``manifest.json``; a complete folder (one with a manifest) is reused as is. ``output_root`` is a
local folder or a URI (``s3://bucket/prepared``, ``gs://...``, ``file:///...``):

* local: built in a temporary folder and renamed into place under a file lock, so concurrent
  callers build it once;
* URI: built in a local temporary folder, then uploaded with ``manifest.json`` last (object
  stores have neither rename nor lock; see :func:`_publish_uri` for why a race is harmless).

Configs that differ only in ``gamma`` share the encoded shards (same ``encoding_hash``): the
second folder hard-links (URI: copies inside the store) the first one's shards and writes its own
``preprocessor.json`` (another short list) in about a second, so ``gamma`` is searched over a
continuous range.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dynlm import storage
from dynlm.data.config import DataConfig
from dynlm.data.fingerprint import input_listing
from dynlm.data.prepared import MANIFEST, PreparedData, is_prepared
from dynlm.data.preprocessor import Preprocessor
from dynlm.data.schema import ENCODED_SCHEMA, QUARANTINE_SCHEMA
from dynlm.data.split import check_split_rule
from pipelines.prepare_stages import DOC_STATS, EncodeDocuments, count_train_words, parse_files

SPLITS = ("train", "valid", "test")
ROWS_PER_SHARD = 256  # documents per Parquet file (fixed: part of the byte-identical output)
ROW_GROUP_SIZE = 64  # documents per Parquet row group
DOCS_PER_BLOCK = 32  # Ray Data block size after parsing (spreads one big file over the actors)


class QuarantineError(RuntimeError):
    """``strict`` was asked and some inputs were quarantined.

    Attributes:
        counts: the manifest counts of the (complete, written) prepared folder.
        root: the prepared folder; its ``quarantine/`` Parquet lists file, doc_id, line, reason.
    """

    def __init__(self, counts: dict, root: Path | str, examples: list[str]):
        self.counts = counts
        self.root = root
        super().__init__(
            f"{counts['quarantined']} input record(s) quarantined (strict mode); see "
            f"{root}/quarantine. First: " + "; ".join(examples)
        )


def _resolve_inputs(inputs: list[str]) -> list[str]:
    """Absolute local paths (Ray workers do not share the driver's cwd); URIs as given."""
    resolved = [storage.absolute(item) for item in inputs]
    for item, path in zip(inputs, resolved):
        if not storage.is_uri(item) and not storage.exists(path):
            raise FileNotFoundError(f"DataConfig.inputs: {item!r} does not exist (resolved to {path})")
    return resolved


def _collect(ds) -> pa.Table | None:
    """A small dataset (one row per document, no text) as one Arrow table on the driver."""
    tables = list(ds.iter_batches(batch_format="pyarrow", batch_size=None))
    return pa.concat_tables(tables) if tables else None


def _write_shards(table: pa.Table, folder: Path, schema: pa.Schema, rows_per_shard: int) -> list[str]:
    """Write ``table`` as ``part-00000.parquet``, ... (at least one file, maybe empty)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for index, start in enumerate(range(0, max(table.num_rows, 1), rows_per_shard)):
        part = table.slice(start, rows_per_shard).cast(schema).combine_chunks()
        name = f"part-{index:05d}.parquet"
        pq.write_table(part, folder / name, row_group_size=ROW_GROUP_SIZE, compression="zstd",
                       use_dictionary=False, write_statistics=True)
        names.append(f"{folder.name}/{name}")
    return names


def _token_stats(table: pa.Table, spec) -> tuple[int, int, int]:
    """(word tokens, OOV word tokens, subwords of word tokens) of encoded rows (no specials/entities)."""
    if table.num_rows == 0:
        return 0, 0, 0
    word_ids = pc.list_flatten(table["word_ids"]).to_numpy()
    entity_ids = pc.list_flatten(table["entity_ids"]).to_numpy()
    lengths = pc.list_flatten(table["subword_lengths"]).to_numpy()
    is_word = (entity_ids == 0) & (word_ids != spec.bos_id) & (word_ids != spec.eos_id)
    return int(is_word.sum()), int((word_ids[is_word] == spec.unk_id).sum()), int(lengths[is_word].sum())


def _build(cfg: DataConfig, out: Path, progress: bool) -> dict:
    """Run the Ray Data job into ``out`` (an empty temporary folder); returns the manifest."""
    import ray

    from pipelines.ray_env import init_ray

    init_ray()
    ctx = ray.data.DataContext.get_current()
    previous_progress, ctx.enable_progress_bars = ctx.enable_progress_bars, progress
    try:
        return _run_job(cfg, out, ray)
    finally:
        ctx.enable_progress_bars = previous_progress


def _check_documents(meta: pa.Table | None, cfg: DataConfig) -> None:
    """Clear errors for no input, no readable document, or a doc_id seen twice."""
    if meta is None:
        raise ValueError(f"DataConfig.inputs {cfg.inputs}: no input files were found")
    kinds = meta["kind"].to_numpy(zero_copy_only=False)
    if not (kinds == "document").any():
        raise ValueError(f"DataConfig.inputs {cfg.inputs}: no document could be read ({int((kinds == 'quarantine').sum())} "
                         f"quarantined, {int((kinds == 'dropped').sum())} dropped)")
    seen: dict[str, str] = {}
    for kind, doc_id, source in zip(kinds, meta["doc_id"].to_pylist(), meta["source_file"].to_pylist()):
        if kind != "document":
            continue
        if doc_id in seen:
            raise ValueError(f"duplicate doc_id {doc_id!r} in {seen[doc_id]} and {source} "
                             "(is a file listed twice in DataConfig.inputs?)")
        seen[doc_id] = source


def _with_absolute_paths(cfg: DataConfig) -> DataConfig:
    """``cfg`` with absolute ``inputs`` and ``splits`` paths, as Ray Data's rows name the files
    (the workers read a file's split from its path below its input: dynlm/data/split.py)."""
    splits = {split: [storage.absolute(item) for item in paths] for split, paths in cfg.splits.items()}
    return cfg.replace(inputs=_resolve_inputs(cfg.inputs), splits=splits)


def _check_split_rule(meta: pa.Table, resolved: DataConfig) -> str:
    """The split rule all documents followed (``named`` / ``config`` / ``hash``), or SplitRuleError."""
    documents = meta.filter(pc.equal(meta["kind"], "document"))
    return check_split_rule(documents["source_file"].to_pylist(), resolved.inputs, resolved.splits,
                            documents["split"].to_pylist())


def _train_word_counts(parsed, ray) -> dict[str, int]:
    """Word counts of the train split: per-batch value counts, then a Ray Data groupby-sum."""
    num_partitions = max(1, min(16, int(ray.cluster_resources().get("CPU", 1))))
    counted = parsed.map_batches(count_train_words, batch_format="pyarrow", batch_size=None)
    word_counts: dict[str, int] = {}
    for batch in counted.groupby("word", num_partitions=num_partitions).sum("count").iter_batches(
            batch_format="pyarrow", batch_size=None):
        word_counts.update(zip(batch["word"].to_pylist(), batch["sum(count)"].to_pylist()))
    return word_counts


def _encode_by_split(parsed, preprocessor: Preprocessor, cfg: DataConfig, ray) -> dict[str, pa.Table]:
    """Encode on an actor pool; stream the encoded ids back, sorted by doc_id per split."""
    encoded = parsed.map_batches(
        EncodeDocuments, fn_constructor_kwargs={"preprocessor_json": preprocessor.to_json()},
        compute=ray.data.ActorPoolStrategy(size=cfg.num_encode_actors), batch_format="pyarrow", batch_size=None,
    )
    parts: dict[str, list[pa.Table]] = defaultdict(list)
    for batch in encoded.iter_batches(batch_format="pyarrow", batch_size=None):
        for split in SPLITS:
            part = batch.filter(pc.equal(batch["split"], split))
            if part.num_rows:
                parts[split].append(part.drop_columns(["split"]))
    return {
        split: (pa.concat_tables(parts[split]) if parts[split] else ENCODED_SCHEMA.empty_table())
        .sort_by([("doc_id", "ascending")])
        for split in SPLITS
    }


def _summarize(meta: pa.Table, tables: dict[str, pa.Table], spec) -> dict:
    """The manifest counts (documents/sentences/tokens per split, anonymization, OOV, subwords)."""
    counts: dict = {"documents": {}, "sentences": {}, "tokens": {}}
    words_total = subwords_total = oov_valid = words_valid = 0
    for split in SPLITS:
        rows = meta.filter(pc.and_(pc.equal(meta["kind"], "document"), pc.equal(meta["split"], split)))
        counts["documents"][split] = tables[split].num_rows
        counts["sentences"][split] = int(pc.sum(rows["num_sentences"]).as_py() or 0)
        counts["tokens"][split] = int(pc.sum(rows["num_tokens"]).as_py() or 0)
        words, oov, subwords = _token_stats(tables[split], spec)
        words_total, subwords_total = words_total + words, subwords_total + subwords
        if split == "valid":
            oov_valid, words_valid = oov, words
    for key in DOC_STATS:
        counts[key] = int(pc.sum(meta[key]).as_py() or 0)
    kinds = meta["kind"].to_numpy(zero_copy_only=False)
    counts["dropped_docs"] = int((kinds == "dropped").sum())
    counts["quarantined"] = int((kinds == "quarantine").sum())
    counts["input_files"] = len(set(meta["source_file"].to_pylist()))
    counts["oov_rate_valid"] = round(oov_valid / words_valid, 6) if words_valid else 0.0
    counts["subwords_per_word"] = round(subwords_total / words_total, 6) if words_total else 0.0
    counts["vocab_words"] = spec.num_words
    counts["subword_vocab"] = spec.num_subwords
    return counts


def _run_job(cfg: DataConfig, out: Path, ray) -> dict:
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        timings[stage] = round(time.perf_counter() - clock, 3)
        clock = time.perf_counter()

    resolved = _with_absolute_paths(cfg)
    files = ray.data.read_binary_files(resolved.inputs, include_paths=True)
    parsed = (
        files.map_batches(parse_files, batch_format="pyarrow", batch_size=1,
                          fn_kwargs={"cfg_dict": resolved.to_dict()})
        .repartition(target_num_rows_per_block=DOCS_PER_BLOCK)
        .materialize()
    )
    meta = _collect(parsed.drop_columns(["sentences"]))  # one small row per document, no text
    _check_documents(meta, cfg)
    split_rule = _check_split_rule(meta, resolved)
    lap("read_parse_anonymize")
    word_counts = _train_word_counts(parsed, ray)
    lap("count_words")
    preprocessor = Preprocessor.fit(word_counts, cfg)
    preprocessor.save(out / "preprocessor.json")
    lap("fit_preprocessor")
    tables = _encode_by_split(parsed, preprocessor, cfg, ray)
    lap("encode")

    files_written = {split: _write_shards(tables[split], out / split, ENCODED_SCHEMA, ROWS_PER_SHARD)
                     for split in SPLITS}
    quarantine = meta.filter(pc.equal(meta["kind"], "quarantine")).select(
        ["source_file", "doc_id", "line", "reason"]).sort_by(
        [("source_file", "ascending"), ("line", "ascending"), ("doc_id", "ascending"), ("reason", "ascending")])
    files_written["quarantine"] = _write_shards(quarantine, out / "quarantine", QUARANTINE_SCHEMA,
                                                max(1, quarantine.num_rows))
    counts = _summarize(meta, tables, preprocessor.spec)
    lap("write")
    timings["build"] = round(sum(timings.values()), 3)
    return {
        "config": cfg.to_dict(),
        "config_hash": cfg.data_hash(),
        "encoding_hash": cfg.encoding_hash(),
        "inputs": input_listing(cfg.inputs),  # [name, size, digest] per file: what the key covers
        "counts": counts,
        "split_rule": split_rule,
        "preprocessor": "preprocessor.json",
        "splits": {split: split for split in SPLITS},
        "quarantine": "quarantine",
        "files": files_written,
        "timings_s": timings,
    }


def prepared_root(output_root: str, name: str) -> Path | str:
    """``<output_root>/<name>``: an absolute local Path, or a URI string for a URI output root."""
    if storage.is_uri(output_root):
        return storage.join(output_root, name)
    return Path(storage.absolute(output_root)) / name


def _encoding_sibling(output_root: str, cfg: DataConfig) -> PreparedData | None:
    """A complete folder under ``output_root`` whose shards this config can share (same
    ``encoding_hash``: it differs at most in ``gamma``). Listed through the filesystem, so a
    URI root (``s3://...``) works like a local one."""
    wanted = cfg.encoding_hash()
    filesystem, base = storage.resolve(output_root)
    matches = []
    for name in storage.list_dirs(base, filesystem=filesystem):  # hidden .tmp-* folders skipped
        try:
            manifest = json.loads(storage.read_bytes(f"{base}/{name}/{MANIFEST}", filesystem=filesystem))
        except (OSError, ValueError):  # no manifest (incomplete), or not ours: skip it
            continue
        if manifest.get("encoding_hash") == wanted:
            matches.append(("derived_from" in manifest, name))
    if not matches:
        return None
    return PreparedData.open(prepared_root(output_root, min(matches)[1]))  # a built folder first


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)  # shards are never modified in place: sharing them is safe
    except OSError:  # another filesystem, or no hard links there
        shutil.copy2(source, target)


# share(sibling, name): put the sibling's shard ``name`` (e.g. "train/part-00000.parquet") into
# the folder being published (a hard link in the local temporary folder, or a server-side copy).
Share = Callable[[PreparedData, str], None]


def _derive(cfg: DataConfig, out: Path, sibling: PreparedData, share: Share) -> dict:
    """Write the folder of ``cfg`` from ``sibling`` (same encoding, other gamma): shared shards,
    the preprocessor with this gamma's short list (into ``out``), a new manifest.

    A gamma search therefore preprocesses once per encoding, and gamma can be searched over a
    continuous range. The result is the same as a full build (tested).
    """
    start = time.perf_counter()
    manifest = sibling.manifest
    for name in sibling.shard_names():
        share(sibling, name)
    sibling.preprocessor.with_gamma(cfg.gamma).save(out / "preprocessor.json")
    seconds = round(time.perf_counter() - start, 3)
    return {**manifest, "config": cfg.to_dict(), "config_hash": cfg.data_hash(),
            "encoding_hash": cfg.encoding_hash(), "inputs": input_listing(cfg.inputs),
            "derived_from": manifest.get("derived_from", posixpath.basename(sibling.path)),  # the built one
            "timings_s": {"derive_from_sibling": seconds, "build": seconds}}


def _write_manifest(out: Path, manifest: dict) -> None:
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _publish_local(final: Path, make: Callable[[Path, Share], dict]) -> dict | None:
    """Build into a temporary sibling folder of ``final``, then rename it into place, under a
    file lock: concurrent callers build it once. None when it was complete (a concurrent build)."""
    with storage.lock(final):  # concurrent callers with the same folder wait here
        if (final / MANIFEST).exists():
            return None
        tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            manifest = make(tmp, lambda sibling, name: _link_or_copy(sibling.root / name, tmp / name))
            _write_manifest(tmp, manifest)
            if final.exists():  # an incomplete folder (no manifest) left by hand: replace it
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return manifest


def _publish_uri(final: str, make: Callable[[Path, Share], dict]) -> dict | None:
    """Build into a local temporary folder, then upload it to ``final`` (a URI), manifest.json last.

    Object stores have no rename and no lock. Readers treat a folder without manifest.json as
    incomplete, and the manifest is uploaded only after every other file, so nobody reads a
    half-written folder. Two callers building the same config at once both upload; the output is
    deterministic (byte-identical for the same config, tested), so the second upload rewrites
    the same bytes and the race is harmless, only wasted work. None when it was complete.
    """
    filesystem, path = storage.resolve(final)
    if storage.is_file(f"{path}/{MANIFEST}", filesystem=filesystem):
        return None

    def share(sibling: PreparedData, name: str) -> None:  # same store: a server-side copy
        storage.copy(f"{sibling.path}/{name}", f"{path}/{name}", source_filesystem=sibling.filesystem,
                     target_filesystem=filesystem)

    with tempfile.TemporaryDirectory(prefix="dynlm-prepare-") as tmp:
        out = Path(tmp)
        manifest = make(out, share)
        _write_manifest(out, manifest)
        files = sorted((p for p in out.rglob("*") if p.is_file()), key=lambda p: (p.name == MANIFEST, p))
        for local in files:  # manifest.json last: it marks the folder complete
            storage.write_bytes(f"{path}/{local.relative_to(out).as_posix()}", local.read_bytes(),
                                filesystem=filesystem)
    return manifest


def publish(final: Path | str, make: Callable[[Path, Share], dict]) -> dict | None:
    """Write the prepared folder ``final`` (a local Path or a URI string) once.

    ``make(out, share)`` writes the files into ``out`` (an empty local folder) and returns the
    manifest; ``share`` puts an existing folder's shard into ``final`` without copying it through
    ``out``. Returns the manifest written, or None when ``final`` was already complete.
    """
    return _publish_uri(final, make) if storage.is_uri(final) else _publish_local(Path(final), make)


SPLIT_RULE_TEXT = {
    "named": "named: the split each input's file/folder names (train, valid/dev, test)",
    "config": "config: the input paths listed in data.splits",
    "hash": "hash: unsplit inputs, a hash of each document id (valid/test_fraction)",
}


def format_summary(counts: dict, split_rule: str) -> str:
    """The end-of-job table of the manifest counts, after the split rule that was used."""
    lines = [f"{'split rule':28s}{SPLIT_RULE_TEXT[split_rule]}",
             f"{'':28s}{'train':>12s}{'valid':>12s}{'test':>12s}"]
    for key in ("documents", "sentences", "tokens"):
        lines.append(f"{key:28s}" + "".join(f"{counts[key][s]:>12,d}" for s in SPLITS))
    for key, label in (("chains", "chains"), ("anonymized_mentions", "anonymized mentions"),
                       ("dropped_nested", "dropped nested mentions"),
                       ("dropped_overlapping", "dropped overlapping mentions"),
                       ("dropped_docs_too_many_chains", "dropped docs (too many chains)"),
                       ("truncated_chains", "truncated chains"), ("quarantined", "quarantined records")):
        lines.append(f"{label:28s}{counts[key]:>12,d}")
    lines.append(f"{'OOV rate (valid)':28s}{counts['oov_rate_valid']:>12.4f}")
    lines.append(f"{'subwords per word':28s}{counts['subwords_per_word']:>12.3f}")
    return "\n".join(lines)


def _check_strict(prepared: PreparedData, strict: bool) -> None:
    counts = prepared.manifest["counts"]
    if strict and counts["quarantined"]:
        rows = prepared.quarantine_rows()[:3]
        examples = [f"{r['source_file']}:{r['line']} {r['doc_id']!r}: {r['reason']}" for r in rows]
        raise QuarantineError(counts, prepared.root, examples)


class PreparedDataMissing(FileNotFoundError):
    """``build=False`` was asked and the folder neither exists nor can be derived (gamma)."""


def prepare(cfg: DataConfig, *, strict: bool = False, progress: bool = True, build: bool = True) -> PreparedData:
    """Prepare (or reuse) the data folder ``<cfg.output_root>/<cfg.data_hash()>/``.

    ``cfg.output_root`` is a local folder or a filesystem URI (``s3://...``); the driver writes
    it (Ray workers only read the inputs), so the driver needs the store's credentials.

    Args:
        cfg: the data config; ``output_root`` and ``num_encode_actors`` do not change the output.
        strict: raise :class:`QuarantineError` when any input record was quarantined (the
            folder is still written, with its quarantine Parquet, for inspection).
        progress: show Ray Data progress bars.
        build: False never starts a Ray Data job: the folder must exist or be derivable from a
            folder of the same encoding (another gamma, hard links, < 1 s). A Tune trial passes
            False: a Ray Data job inside its placement group could never be scheduled.

    Returns:
        The prepared folder, opened.

    Raises:
        QuarantineError: strict and something was quarantined.
        PreparedDataMissing: ``build=False`` and there is nothing to reuse or derive.
        FileNotFoundError / ValueError: missing inputs, no readable document, duplicate doc ids.
    """
    final = prepared_root(cfg.output_root, cfg.data_hash())
    if is_prepared(final):
        print(f"prepare: reusing {final} (complete; nothing recomputed)")
        prepared = PreparedData.open(final)
        _check_strict(prepared, strict)
        return prepared

    def make(out: Path, share: Share) -> dict:
        sibling = _encoding_sibling(cfg.output_root, cfg)
        if sibling is None and not build:
            raise PreparedDataMissing(
                f"no prepared folder {final} for data config {cfg.data_hash()} "
                f"(bpe_merges={cfg.bpe_merges}, gamma={cfg.gamma}, vocab_size={cfg.vocab_size}), "
                f"and none of the same encoding to derive it from")
        if sibling is None:
            return _build(cfg, out, progress)
        print(f"prepare: {cfg.data_hash()} differs from {posixpath.basename(sibling.path)} only in gamma: "
              f"sharing its shards, short list of gamma={cfg.gamma}")
        return _derive(cfg, out, sibling, share)

    manifest = publish(final, make)
    if manifest is None:
        print(f"prepare: reusing {final} (built by a concurrent caller)")
    else:
        print(f"prepare: wrote {final} in {manifest['timings_s']['build']:.1f} s")
    prepared = PreparedData.open(final)
    print(format_summary(prepared.manifest["counts"], prepared.manifest["split_rule"]))
    _check_strict(prepared, strict)
    return prepared
