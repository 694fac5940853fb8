"""What a list of input paths contains: the key of a prepared data folder.

A prepared folder is addressed by the *content* of its inputs, not by how their paths were
spelled: ``runs/synth``, ``./runs/synth``, ``/home/me/runs/synth`` and a symlink to it give the
same key, while changing one byte of one file, or adding a file to an input folder, gives a new
one. :func:`input_listing` returns one entry per file that the prepare job reads::

    ["<input index>:<path relative to that input>", <size in bytes>, "<content digest>"]

* local files (paths and ``file://`` URIs): ``sha256:<hex>`` of the bytes, cached in this process by (real path, size,
  mtime): an unchanged file costs one ``stat`` after the first hash;
* URIs (``s3://``, ``gs://``, ...): the store's own identity of the object, ``mtime:<ns>`` with
  the size, because reading every object to hash it would cost a full download; a store that
  reports no modification time is read and hashed like a local file.

The listing follows Ray Data's file listing (``read_binary_files``): folders are walked
recursively, sorted, and files whose path relative to the input starts with ``.`` or ``_`` are
skipped, so the listing names exactly the files the job reads. A data config may keep fewer
files of its input folders (``keep``, :meth:`dynlm.data.config.CorpusConfig.keeps_file`: the
naming task reads ``*.py`` outside test folders); the prepare job then reads the same filtered
list (``CorpusConfig.input_files``) that the key lists (``CorpusConfig.input_listing``). Absolute
locations are not part of the key; the relative names are (they become document ids).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

import pyarrow.fs as pafs

from dynlm import storage

SKIPPED_PREFIXES = (".", "_")  # Ray Data's default exclude_prefixes for folder listings
_CHUNK = 1 << 20

# (real path, size, mtime_ns) -> "sha256:<hex>"; an unchanged file is hashed once per process
_DIGEST_CACHE: dict[tuple[str, int, int], str] = {}


def _stream_digest(filesystem: pafs.FileSystem, path: str) -> str:
    digest = hashlib.sha256()
    with filesystem.open_input_stream(path) as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def _local_digest(path: str) -> tuple[int, str]:
    """(size, digest) of a local file, hashed at most once per (path, size, mtime)."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    key = (real, stat.st_size, stat.st_mtime_ns)
    if key not in _DIGEST_CACHE:
        _DIGEST_CACHE[key] = _stream_digest(pafs.LocalFileSystem(), real)
    return stat.st_size, _DIGEST_CACHE[key]


KeepFile = Callable[[str], bool]  # path relative to its input folder (posix) -> read it?


def _files_of(filesystem: pafs.FileSystem, path: str, item: str, keep: KeepFile | None) -> list[pafs.FileInfo]:
    """The files one input names (itself, or the files under a folder that ``keep`` keeps), sorted
    by path. A file named as an input is always read."""
    info = filesystem.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"DataConfig.inputs: {item!r} does not exist (resolved to {path})")
    if info.type == pafs.FileType.File:
        return [info]
    found = filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
    base = path.rstrip("/") + "/"
    return sorted((f for f in found if f.type == pafs.FileType.File
                   and not f.path[len(base):].startswith(SKIPPED_PREFIXES)
                   and (keep is None or keep(f.path[len(base):]))), key=lambda f: f.path)


def input_files(inputs: list[str], keep: KeepFile | None = None) -> list[str]:
    """The files Ray Data reads for ``inputs`` (the same skip rule, then ``keep``), in input
    order: absolute local paths, or URIs for URI inputs.

    Raises:
        FileNotFoundError: an input does not exist.
    """
    files: list[str] = []
    for item in inputs:
        filesystem, path = storage.resolve(item)
        prefix = item.rstrip("/") if storage.is_uri(item) else path.rstrip("/")
        for info in _files_of(filesystem, path, item, keep):
            files.append(prefix + info.path[len(path.rstrip("/")):])
    return files


def input_listing(inputs: list[str], keep: KeepFile | None = None) -> list[list]:
    """One ``[name, size, digest]`` entry per input file that ``keep`` keeps (module docstring).

    Raises:
        FileNotFoundError: an input does not exist.
    """
    listing: list[list] = []
    for index, item in enumerate(inputs):
        filesystem, path = storage.resolve(item)
        local = isinstance(filesystem, pafs.LocalFileSystem)  # a path, or a file:// URI
        for info in _files_of(filesystem, path, item, keep):
            name = info.base_name if info.path == path else info.path[len(path.rstrip("/")) + 1:]
            if local:
                size, digest = _local_digest(info.path)
            elif info.mtime_ns is not None:
                size, digest = info.size, f"mtime:{info.mtime_ns}"
            else:
                size, digest = info.size, _stream_digest(filesystem, info.path)
            listing.append([f"{index}:{name}", int(size), digest])
    return listing
