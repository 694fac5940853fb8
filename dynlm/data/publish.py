"""Prepared folders are written once and reused: the key, the atomic publish, gamma derivation.

:func:`prepare_folder` is every prepare's entry point (the Ray Data job of
``pipelines/prepare.py`` and :func:`dynlm.tasks.local.prepare_local` pass it their ``build``
function): ``<output_root>/<key>/`` is reused when complete (it has a manifest), derived when a
folder of the same encoding exists (the LM: another ``gamma``: its shards hard-linked, its own
preprocessor, about a second), else built. The key is ``cfg.data_hash()`` (what the inputs
contain + the settings: :mod:`dynlm.data.fingerprint`), plus the preprocessor's digest when one
is given (new documents encoded with a champion's vocabulary).

``output_root`` is a local folder or a URI (``s3://bucket/prepared``, ``gs://...``):

* local: built in a temporary sibling folder and renamed into place under a file lock, so
  concurrent callers build it once;
* URI: the shards written in place by the Ray workers that hold them, then the small files
  uploaded from a local temporary folder, ``manifest.json`` last (object stores have neither
  rename nor lock; see :func:`_publish_uri` for why a race is harmless).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dynlm import faults, storage
from dynlm.data.config import CORPUS_FIELDS
from dynlm.data.prepared import MANIFEST, PreparedData, is_prepared
from dynlm.data.prepared_writer import PREPROCESSOR_FILE, format_summary

# share(sibling, name): put the sibling's shard ``name`` (e.g. "train/part-00000.parquet") into
# the folder being published (a hard link in the local temporary folder, or a server-side copy).
Share = Callable[[PreparedData, str], None]
# build(out, shard_root) -> manifest: run the task's stages; the shards go to shard_root (the
# folder being published: the local temporary folder, or the URI itself), the small files
# (preprocessor, quarantine) into the empty local folder out.
Build = Callable[[Path, str], dict]
# make(out, shard_root, share) -> manifest: what publish() calls (build, or derive from a sibling).
Make = Callable[[Path, str, Share], dict]


class QuarantineError(RuntimeError):
    """``strict`` was asked and some inputs were quarantined.

    Attributes:
        counts: the manifest counts of the (complete, written) prepared folder.
        root: the prepared folder; its ``quarantine/`` Parquet lists file, doc_id, line, reason.
    """

    def __init__(self, counts: dict, root: Path | str, examples: list[str]):
        self.counts = counts
        self.root = root
        super().__init__(f"{counts['quarantined']} input record(s) quarantined (strict mode); see "
                         f"{root}/quarantine. First: " + "; ".join(examples))


class PreparedDataMissing(FileNotFoundError):
    """``build=False`` was asked and the folder neither exists nor can be derived (gamma)."""


def prepared_root(output_root: str, name: str) -> Path | str:
    """``<output_root>/<name>``: an absolute local Path, or a URI string for a URI output root."""
    if storage.is_uri(output_root):
        return storage.join(output_root, name)
    return Path(storage.absolute(output_root)) / name


def folder_key(cfg, preprocessor: Any | None = None) -> str:
    """The folder name: ``data_hash``, plus ``-p<digest>`` of a given preprocessor."""
    if preprocessor is None:
        return cfg.data_hash()
    return f"{cfg.data_hash()}-p{hashlib.sha256(preprocessor.to_json().encode()).hexdigest()[:12]}"


def encoding_sibling(output_root: str, cfg) -> PreparedData | None:
    """A complete folder under ``output_root`` whose shards ``cfg`` can share (same
    ``encoding_hash``, fitted preprocessor), built ones first. Listed through the filesystem,
    so a URI root works like a local one."""
    wanted = cfg.encoding_hash()
    if wanted == cfg.data_hash():
        return None  # this config shares nothing: a sibling would be the folder itself
    filesystem, base = storage.resolve(output_root)
    matches = []
    for name in storage.list_dirs(base, filesystem=filesystem):  # hidden .tmp-* folders skipped
        try:
            manifest = json.loads(storage.read_bytes(f"{base}/{name}/{MANIFEST}", filesystem=filesystem))
        except (OSError, ValueError):  # no manifest (incomplete), or not ours: skip it
            continue
        if manifest.get("encoding_hash") == wanted and manifest.get("preprocessor_source") != "given":
            matches.append(("derived_from" in manifest, name))
    if not matches:
        return None
    return PreparedData.open(prepared_root(output_root, min(matches)[1]))


def derive(task, cfg, out: Path, sibling: PreparedData, share: Share) -> dict:
    """Write the folder of ``cfg`` from ``sibling`` (same encoding): shared shards, the task's
    derived preprocessor (into ``out``), a new manifest. The result equals a full build (tested)."""
    start = time.perf_counter()
    manifest = sibling.manifest
    for name in sibling.shard_names():
        share(sibling, name)
    (out / PREPROCESSOR_FILE).write_text(task.derive_preprocessor(sibling.preprocessor, cfg).to_json(), encoding="utf-8")
    seconds = round(time.perf_counter() - start, 3)
    return {**manifest, "config": cfg.to_dict(), "config_hash": cfg.data_hash(),
            "encoding_hash": cfg.encoding_hash(), "inputs": cfg.input_listing(),
            "derived_from": manifest.get("derived_from", posixpath.basename(sibling.path)),  # the built one
            "timings_s": {"derive_from_sibling": seconds, "build": seconds}}


def _write_manifest(out: Path, manifest: dict) -> None:
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)  # shards are never modified in place: sharing them is safe
    except OSError:  # another filesystem, or no hard links there
        shutil.copy2(source, target)


def _publish_local(final: Path, make: Make) -> dict | None:
    """Build into a temporary sibling folder of ``final``, then rename it into place, under a
    file lock: concurrent callers build it once. None when it was complete (a concurrent build).
    A temporary folder of ``final`` found under the lock is a killed build's and is removed."""
    with storage.lock(final):  # concurrent callers with the same folder wait here
        if (final / MANIFEST).exists():
            return None
        for stale in final.parent.glob(f".tmp-{final.name}-*"):  # a killed build's: we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            manifest = make(tmp, str(tmp), lambda sibling, name: _link_or_copy(sibling.root / name, tmp / name))
            _write_manifest(tmp, manifest)
            if final.exists():  # an incomplete folder (no manifest) left by hand: replace it
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return manifest


def _publish_uri(final: str, make: Make) -> dict | None:
    """Write the shards straight into ``final`` (a URI: the Ray workers that hold them), the small
    files into a local temporary folder, then upload those, manifest.json last.

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
        manifest = make(out, final.rstrip("/"), share)
        _write_manifest(out, manifest)
        files = sorted((p for p in out.rglob("*") if p.is_file()), key=lambda p: (p.name == MANIFEST, p))
        for local in files:  # manifest.json last: it marks the folder complete
            storage.write_bytes(f"{path}/{local.relative_to(out).as_posix()}", local.read_bytes(),
                                filesystem=filesystem)
            if local.name != MANIFEST:
                faults.kill_point("prepare:uploading")
    return manifest


def publish(final: Path | str, make: Make) -> dict | None:
    """Write the prepared folder ``final`` (a local Path or a URI string) once.

    ``make(out, shard_root, share)`` writes the shards into ``shard_root`` (the temporary
    folder of a local ``final``, ``final`` itself for a URI), the small files into ``out`` (an
    empty local folder), and returns the manifest; ``share`` puts an existing folder's shard
    into ``final`` without copying it through ``out``. Returns the manifest written, or None when ``final`` was already complete.
    """
    return _publish_uri(final, make) if storage.is_uri(final) else _publish_local(Path(final), make)


def _check_strict(prepared: PreparedData, strict: bool) -> None:
    counts = prepared.manifest["counts"]
    if strict and counts["quarantined"]:
        rows = prepared.quarantine_rows()[:3]
        examples = [f"{r['source_file']}:{r['line']} {r['doc_id']!r}: {r['reason']}" for r in rows]
        raise QuarantineError(counts, prepared.root, examples)


def prepare_folder(task, cfg, build: Build, *, preprocessor: Any | None = None, strict: bool = False,
                   may_build: bool = True, log: Callable[[str], None] = print) -> PreparedData:
    """Reuse, derive or build the prepared folder of ``cfg`` (module docstring) and open it.

    Args:
        task: the :class:`dynlm.tasks.Task` whose folder this is.
        cfg: its data config; ``output_root`` and ``num_encode_actors`` do not change the output.
        build: ``build(out, shard_root) -> manifest`` (the stages; it encodes with ``preprocessor``
            if given; :data:`Build`).
        preprocessor: encode with this fitted preprocessor instead of fitting one on the train split.
        strict: raise :class:`QuarantineError` when any input record was quarantined (the
            folder is still written, with its quarantine Parquet, for inspection).
        may_build: False never calls ``build``: the folder must exist or be derivable (a Tune
            trial: a Ray Data job inside its placement group could never be scheduled).

    Raises:
        QuarantineError, PreparedDataMissing (``may_build=False`` and nothing to reuse or derive).
    """
    final = prepared_root(cfg.output_root, folder_key(cfg, preprocessor))
    if is_prepared(final):
        log(f"prepare: reusing {final} (complete; nothing recomputed)")
        prepared = PreparedData.open(final)
        _check_strict(prepared, strict)
        return prepared

    def make(out: Path, shard_root: str, share: Share) -> dict:
        sibling = encoding_sibling(cfg.output_root, cfg) if preprocessor is None else None
        if sibling is not None:
            log(f"prepare: {cfg.data_hash()} differs from {posixpath.basename(sibling.path)} only in its "
                "preprocessor: sharing its shards")
            return derive(task, cfg, out, sibling, share)
        if not may_build:
            settings = ", ".join(f"{k}={v}" for k, v in cfg.to_dict().items() if k not in CORPUS_FIELDS)
            raise PreparedDataMissing(f"no prepared folder {final} for data config {cfg.data_hash()} "
                                      f"({settings}), and none of the same encoding to derive it from")
        started = time.perf_counter()
        manifest = build(out, shard_root)
        return {**manifest, "timings_s": {**manifest.get("timings_s", {}),
                                          "build": round(time.perf_counter() - started, 3)}}

    manifest = publish(final, make)
    if manifest is None:
        log(f"prepare: reusing {final} (built by a concurrent caller)")
    else:
        log(f"prepare: wrote {final} in {manifest['timings_s']['build']:.1f} s")
    prepared = PreparedData.open(final)
    log(format_summary(task, prepared.manifest["counts"], prepared.manifest["split_rule"]))
    _check_strict(prepared, strict)
    return prepared
