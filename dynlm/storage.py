"""One storage layer: read, write, list and lock files on a local path or a filesystem URI.

A *location* is a local path (``runs/prepared``, ``~/data``; made absolute before use) or a URI
of any filesystem pyarrow knows (``s3://bucket/prepared``, ``gs://bucket/x``,
``file:///abs/path``). Every function goes through :mod:`pyarrow.fs`, the filesystem layer Ray
uses for its own storage, so the same call works on a laptop and on a cluster's object store::

    from dynlm import storage

    storage.write_text("s3://bucket/runs/info.json", "{}")      # parent "folders" created
    storage.read_text("runs/ray/info.json")                       # a local path
    storage.list_files("s3://bucket/corpus")                      # every file below, sorted
    with storage.lock("runs/prepared/3f2a"):                      # one builder at a time (local)
        ...

Functions that take a location also take ``filesystem=``: then the location is a path inside
that filesystem (the pyarrow convention, e.g. ``pq.read_table(path, filesystem=fs)``). Callers
that make many calls on one folder resolve it once with :func:`resolve` and pass the
filesystem on, instead of building a new one per call (for S3 each build may ask the store for
the bucket's region).

Locks: object stores have no lock. :func:`lock` holds a real inter-process lock for a local
path and holds nothing for a URI; see its docstring for what callers do instead.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import pyarrow.fs as pafs

Location = str | Path


def is_uri(location: Location) -> bool:
    """True for ``scheme://...`` (object stores, ``file://``); False for a local path."""
    return "://" in str(location)


def absolute(location: Location) -> str:
    """``location`` as other processes can use it: a URI unchanged, a local path made absolute
    (``~`` expanded, symlinks resolved). Ray workers do not share the driver's working folder."""
    if is_uri(location):
        return str(location)
    return str(Path(location).expanduser().resolve())


def join(location: Location, *parts: str) -> str:
    """``location/part/...`` with ``/`` (for URIs and local paths alike; no trailing slash)."""
    return "/".join([str(location).rstrip("/"), *(part.strip("/") for part in parts)])


def resolve(location: Location, filesystem: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, path inside it)`` of a location.

    A URI goes to ``pyarrow.fs.FileSystem.from_uri`` (which raises ``ValueError`` / ``OSError``
    for an unknown scheme or an unreachable bucket); a local path gives ``LocalFileSystem`` and
    the absolute path. With ``filesystem`` given, ``location`` already is a path inside it.
    """
    if filesystem is not None:
        return filesystem, str(location)
    if is_uri(location):
        return pafs.FileSystem.from_uri(str(location).rstrip("/"))
    return pafs.LocalFileSystem(), absolute(location)


def _type(location: Location, filesystem: pafs.FileSystem | None) -> pafs.FileType:
    fs, path = resolve(location, filesystem)
    return fs.get_file_info(path).type


def exists(location: Location, *, filesystem: pafs.FileSystem | None = None) -> bool:
    """Whether a file or a folder is at ``location``."""
    return _type(location, filesystem) != pafs.FileType.NotFound


def is_file(location: Location, *, filesystem: pafs.FileSystem | None = None) -> bool:
    """Whether ``location`` is a file."""
    return _type(location, filesystem) == pafs.FileType.File


def is_dir(location: Location, *, filesystem: pafs.FileSystem | None = None) -> bool:
    """Whether ``location`` is a folder (on an object store: a prefix that has objects below it)."""
    return _type(location, filesystem) == pafs.FileType.Directory


def mtime(location: Location, *, filesystem: pafs.FileSystem | None = None) -> float:
    """Last modification time of a file, in seconds since the epoch (FileNotFoundError if absent)."""
    fs, path = resolve(location, filesystem)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"{location} does not exist")
    return info.mtime.timestamp()


@contextmanager
def open_read(location: Location, *, filesystem: pafs.FileSystem | None = None) -> Iterator[BinaryIO]:
    """A sequential binary stream of the file ``location`` (``read(n)`` until ``b""``)."""
    fs, path = resolve(location, filesystem)
    with fs.open_input_stream(path) as stream:
        yield stream


def read_bytes(location: Location, *, filesystem: pafs.FileSystem | None = None) -> bytes:
    """The bytes of the file ``location`` (FileNotFoundError if absent)."""
    with open_read(location, filesystem=filesystem) as stream:
        return stream.read()


def read_text(location: Location, *, encoding: str = "utf-8",
              filesystem: pafs.FileSystem | None = None) -> str:
    """The text of the file ``location``."""
    return read_bytes(location, filesystem=filesystem).decode(encoding)


def write_bytes(location: Location, data: bytes, *, filesystem: pafs.FileSystem | None = None) -> None:
    """Write ``data`` to the file ``location`` (replaced if present; parent folders created)."""
    fs, path = resolve(location, filesystem)
    fs.create_dir(posixpath.dirname(path), recursive=True)
    with fs.open_output_stream(path) as out:
        out.write(data)


def write_text(location: Location, text: str, *, encoding: str = "utf-8",
               filesystem: pafs.FileSystem | None = None) -> None:
    """Write ``text`` to the file ``location`` (replaced if present; parent folders created)."""
    write_bytes(location, text.encode(encoding), filesystem=filesystem)


def _hidden(relative: str) -> bool:
    return any(part.startswith(".") for part in relative.split("/"))


def list_files(location: Location, *, recursive: bool = True, include_hidden: bool = False,
               missing_ok: bool = False, filesystem: pafs.FileSystem | None = None) -> list[str]:
    """The files at or below ``location``, sorted by their path below it.

    Args:
        location: a folder (its files, in subfolders too when ``recursive``) or one file
            (returned alone, hidden or not).
        recursive: descend into subfolders.
        include_hidden: also files whose path below ``location`` has a part starting with ``.``
            (``.lock`` files, ``.git/...``, temporary ``.tmp-*`` folders).
        missing_ok: an absent ``location`` gives ``[]`` instead of FileNotFoundError.

    Returns:
        Locations of the same kind as ``location``: ``join(location, relative path)`` for a URI
        (or a path inside ``filesystem``), absolute paths for a local path.
    """
    fs, path = resolve(location, filesystem)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        if missing_ok:
            return []
        raise FileNotFoundError(f"{location} does not exist")
    prefix = str(location) if is_uri(location) or filesystem is not None else path
    if info.type == pafs.FileType.File:
        return [prefix.rstrip("/")]
    relatives = sorted(
        child.path[len(path):].lstrip("/")
        for child in fs.get_file_info(pafs.FileSelector(path, recursive=recursive))
        if child.type == pafs.FileType.File)
    return [join(prefix, rel) for rel in relatives if include_hidden or not _hidden(rel)]


def list_dirs(location: Location, *, include_hidden: bool = False,
              filesystem: pafs.FileSystem | None = None) -> list[str]:
    """Names of the folders directly under ``location``, sorted ([] when it does not exist)."""
    fs, path = resolve(location, filesystem)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(info.base_name for info in infos if info.type == pafs.FileType.Directory
                  and (include_hidden or not info.base_name.startswith(".")))


def copy(source: Location, target: Location, *, source_filesystem: pafs.FileSystem | None = None,
         target_filesystem: pafs.FileSystem | None = None) -> None:
    """Copy the file ``source`` to ``target`` (parent folders created).

    Inside one store (same filesystem type and settings) the store copies it, so the bytes do
    not travel through this process (S3: a server-side copy); across stores they are streamed.
    """
    source_fs, source_path = resolve(source, source_filesystem)
    target_fs, target_path = resolve(target, target_filesystem)
    target_fs.create_dir(posixpath.dirname(target_path), recursive=True)
    if source_fs.equals(target_fs):
        source_fs.copy_file(source_path, target_path)
    else:
        pafs.copy_files(source_path, target_path, source_filesystem=source_fs,
                        destination_filesystem=target_fs)


@contextmanager
def lock(location: Location, *, timeout: float = -1) -> Iterator[str | None]:
    """Hold an exclusive lock on ``location`` while the ``with`` block runs.

    Local path: a :class:`filelock.FileLock` on the file ``.<name>.lock`` next to
    ``location`` (its parent folder is created). Processes on this machine, and on machines
    sharing the folder where the filesystem supports ``flock``, wait for each other; the lock
    is released when the block ends, also on an error, or when the process dies.

    URI (``s3://``, ``gs://``, and ``file://`` too, treated like a store): object stores have no
    lock, so nothing is held and the block runs at once. Code that can race there must be
    safe without a lock. The prepare job is: a prepared folder is content-addressed and
    deterministic, and its ``manifest.json`` is written last, so two concurrent builders write
    the same bytes and readers never see a half-written folder (pipelines/prepare.py
    ``_publish_uri``).

    Args:
        location: what is locked (it need not exist).
        timeout: seconds to wait before ``filelock.Timeout`` is raised; -1 waits forever.

    Yields:
        The lock file path, or None for a URI (nothing held).
    """
    if is_uri(location):
        yield None
        return
    from filelock import FileLock

    path = Path(absolute(location))
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_file = str(path.parent / f".{path.name}.lock")
    with FileLock(lock_file, timeout=timeout):
        yield lock_file
