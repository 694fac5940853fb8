"""dynlm.storage on the three kinds of location: a local path, a file:// URI and s3:// (moto)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from dynlm import storage


@pytest.fixture(params=["local", "file_uri", "s3"])
def root(request, tmp_path) -> str:
    """An empty folder of each kind, as a location string."""
    if request.param == "local":
        return str(tmp_path / "store")
    if request.param == "file_uri":
        return f"file://{tmp_path}/store"
    return request.getfixturevalue("s3_bucket") + "/store"  # moto; skipped without it


def _fill(root: str) -> None:
    storage.write_text(storage.join(root, "b.txt"), "bee")
    storage.write_bytes(storage.join(root, "a/x.bin"), b"\x00\x01")
    storage.write_text(storage.join(root, "a/deep/y.json"), '{"k": 1}')
    storage.write_text(storage.join(root, ".hidden/z.txt"), "hidden folder")
    storage.write_text(storage.join(root, "a/.lock"), "hidden file")


def test_round_trips_and_exists(root):
    assert not storage.exists(root) and not storage.exists(storage.join(root, "b.txt"))
    _fill(root)  # parent folders are created by the writes
    assert storage.read_text(storage.join(root, "b.txt")) == "bee"
    assert storage.read_bytes(storage.join(root, "a/x.bin")) == b"\x00\x01"
    assert storage.read_text(storage.join(root, "a/deep/y.json")) == '{"k": 1}'
    assert storage.is_file(storage.join(root, "b.txt")) and not storage.is_dir(storage.join(root, "b.txt"))
    assert storage.is_dir(storage.join(root, "a")) and not storage.is_file(storage.join(root, "a"))
    assert storage.exists(root) and storage.is_dir(root)
    storage.write_text(storage.join(root, "b.txt"), "replaced")
    assert storage.read_text(storage.join(root, "b.txt")) == "replaced"
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(storage.join(root, "missing.txt"))
    assert abs(storage.mtime(storage.join(root, "b.txt")) - time.time()) < 300


def test_list_files_is_sorted_recursive_and_skips_hidden(root):
    _fill(root)
    prefix = root if storage.is_uri(root) else str(Path(root).resolve())
    assert storage.list_files(root) == [f"{prefix}/a/deep/y.json", f"{prefix}/a/x.bin", f"{prefix}/b.txt"]
    assert storage.list_files(root, recursive=False) == [f"{prefix}/b.txt"]
    assert storage.list_files(root, include_hidden=True) == [
        f"{prefix}/.hidden/z.txt", f"{prefix}/a/.lock", f"{prefix}/a/deep/y.json", f"{prefix}/a/x.bin",
        f"{prefix}/b.txt"]
    assert storage.list_files(storage.join(root, "a/x.bin")) == [f"{prefix}/a/x.bin"]  # one file
    assert storage.list_dirs(root) == ["a"]
    assert storage.list_dirs(root, include_hidden=True) == [".hidden", "a"]
    assert storage.list_dirs(storage.join(root, "nothing")) == []
    assert storage.list_files(storage.join(root, "nothing"), missing_ok=True) == []
    with pytest.raises(FileNotFoundError, match="nothing does not exist"):
        storage.list_files(storage.join(root, "nothing"))


def test_a_resolved_filesystem_is_reused(root):
    _fill(root)
    fs, path = storage.resolve(root)
    assert storage.read_text(f"{path}/b.txt", filesystem=fs) == "bee"
    assert storage.list_files(f"{path}/a", filesystem=fs) == [f"{path}/a/deep/y.json", f"{path}/a/x.bin"]
    storage.write_text(f"{path}/c/new.txt", "via fs", filesystem=fs)
    assert storage.read_text(storage.join(root, "c/new.txt")) == "via fs"


def test_copy_inside_a_store_and_across_stores(root, tmp_path):
    _fill(root)
    # two resolves of one store give equal filesystems: copy() lets the store copy (S3: server-side)
    assert storage.resolve(root)[0].equals(storage.resolve(storage.join(root, "a"))[0])
    storage.copy(storage.join(root, "a/x.bin"), storage.join(root, "copies/x.bin"))
    assert storage.read_bytes(storage.join(root, "copies/x.bin")) == b"\x00\x01"
    local = tmp_path / "elsewhere" / "y.json"
    storage.copy(storage.join(root, "a/deep/y.json"), local)
    assert local.read_text() == '{"k": 1}'
    storage.copy(local, storage.join(root, "back/y.json"))
    assert storage.read_text(storage.join(root, "back/y.json")) == '{"k": 1}'


def test_join_is_uri_and_absolute(tmp_path, monkeypatch):
    assert storage.join("s3://b/prefix/", "x", "/y.txt") == "s3://b/prefix/x/y.txt"
    assert storage.join("runs", "ray") == "runs/ray"
    assert storage.is_uri("gs://b/x") and storage.is_uri("file:///tmp") and not storage.is_uri(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert storage.absolute("runs/ray") == str(tmp_path.resolve() / "runs" / "ray")
    assert storage.absolute("s3://b/runs/") == "s3://b/runs/"  # URIs unchanged
    fs, path = storage.resolve("runs")
    assert fs.type_name == "local" and path == str(tmp_path.resolve() / "runs")


def test_lock_excludes_a_second_holder_on_a_local_path(tmp_path):
    from filelock import Timeout

    target = tmp_path / "prepared" / "abc"  # need not exist; its parent is created
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:  # another open of the lock file: flock excludes it like another process
        with storage.lock(target):
            entered.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert entered.wait(30)
        with pytest.raises(Timeout):
            with storage.lock(target, timeout=0.2):
                pass
    finally:
        release.set()
        holder.join(30)
    with storage.lock(target, timeout=5) as lock_file:  # free again once the holder left
        assert lock_file == str(tmp_path.resolve() / "prepared" / ".abc.lock")


def test_lock_on_a_uri_holds_nothing(tmp_path):
    with storage.lock(f"file://{tmp_path}/prepared/abc") as outer:
        with storage.lock(f"file://{tmp_path}/prepared/abc", timeout=0) as inner:  # no wait
            assert outer is None and inner is None
    assert not list(tmp_path.rglob("*"))  # no lock file written into the store
