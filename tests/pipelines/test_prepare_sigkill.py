"""``dynlm prepare`` killed with SIGKILL while it builds: no folder a later run would reuse, and
the next run completes (and removes the killed build's temporary folder).

The kill points are seen from outside, on the file system: the build's temporary folder
appears (the Ray Data job is reading and parsing), then its first Parquet shard (encoding and
writing). Each killed run is a real ``dynlm prepare`` subprocess with its own local Ray.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dynlm.data.prepared import is_prepared
from dynlm.data.publish import UPLOAD_PAUSE_ENV
from dynlm.data.synth import SynthConfig, write_conll

pytestmark = pytest.mark.skipif(
    os.environ.get("DYNLM_SIGKILL_TESTS") != "1",
    reason="SIGKILL-at-a-moment tests race the process they kill: in the full suite on 2 cores they "
           "missed their kill point (2026-12-02); run them with DYNLM_SIGKILL_TESTS=1 until the kill "
           "points are fault-injection hooks instead of polling")

KILL_POINTS = {
    "building (read, parse)": lambda root: any(root.glob(".tmp-*")),
    "writing shards (encode)": lambda root: any(root.glob(".tmp-*/**/*.parquet")),
}
RUN_TIMEOUT_S = 300


def _ray_tmp(name: str) -> Path:
    """A short RAY_TMPDIR of its own (Ray's socket paths must stay under 107 characters)."""
    return Path(tempfile.gettempdir()) / f"ray-sigkill-{os.getpid()}-{name}"


def _prepare(corpus: Path, root: Path | str, ray_tmp: Path, upload_pause_s: float = 0.0) -> subprocess.Popen:
    ray_tmp.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), UPLOAD_PAUSE_ENV: str(upload_pause_s)}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "prepare", "--input", str(corpus), "--output-root", str(root),
         "--set", "vocab_size=300", "--set", "bpe_merges=30", "--set", "num_encode_actors=1", "--no-progress"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _stop_group(process: subprocess.Popen, ray_tmp: Path) -> None:
    """SIGKILL what is left of the driver's session (its local Ray's processes); remove its Ray folder."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def _kill_when(process: subprocess.Popen, reached, what: str) -> None:
    """SIGKILL the driver as soon as ``reached()`` is true (polled every 10 ms)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not reached():
        assert process.poll() is None, (f"{what}: the run ended before the kill point",
                                        process.stdout.read().decode()[-3000:])
        assert time.monotonic() < deadline, f"{what}: not reached in {RUN_TIMEOUT_S} s"
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)  # the driver dies at this point


@pytest.mark.slow
def test_prepare_killed_anywhere_leaves_nothing_reusable(tmp_path):
    corpus = tmp_path / "corpus"
    write_conll(SynthConfig(num_documents=40, docs_per_file=10), corpus)
    root = tmp_path / "prepared"
    for index, (point, reached) in enumerate(KILL_POINTS.items()):
        ray_tmp = _ray_tmp(f"k{index}")
        process = _prepare(corpus, root, ray_tmp)
        _kill_when(process, lambda: reached(root), point)
        _stop_group(process, ray_tmp)
        complete = [p.name for p in root.iterdir() if not p.name.startswith(".") and is_prepared(p)]
        assert complete == [], (point, complete)  # nothing a later run would reuse
        assert any(root.glob(".tmp-*")), point  # the killed build's folder: hidden, not a prepared folder

    ray_tmp = _ray_tmp("last")
    process = _prepare(corpus, root, ray_tmp)
    output, _ = process.communicate(timeout=RUN_TIMEOUT_S)
    _stop_group(process, ray_tmp)
    text = output.decode()
    assert process.returncode == 0, text[-3000:]
    assert "reusing" not in text  # built, not reused
    (folder,) = [p for p in root.iterdir() if not p.name.startswith(".")]
    assert f"prepared data: {folder}" in text and is_prepared(folder)
    assert not any(root.glob(".tmp-*"))  # the killed builds' temporary folders are gone


@pytest.mark.slow
def test_prepare_killed_during_the_upload_leaves_nothing_reusable(tmp_path, s3_bucket):
    """An S3 output root (moto): killed after the first object is uploaded, before manifest.json;
    the folder has no manifest (incomplete, never reused) and the next run completes it."""
    import boto3

    corpus = tmp_path / "corpus"
    write_conll(SynthConfig(num_documents=40, docs_per_file=10), corpus)
    s3 = boto3.client("s3")
    bucket, prefix = s3_bucket[len("s3://"):].split("/", 1)

    def keys() -> list[str]:
        """The uploaded files (pyarrow's folder markers, keys ending in "/", left out)."""
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])
        return [o["Key"] for o in listed if not o["Key"].endswith("/")]

    ray_tmp = _ray_tmp("s3")
    process = _prepare(corpus, s3_bucket, ray_tmp, upload_pause_s=30.0)  # the kill comes within the pause
    _kill_when(process, lambda: bool(keys()), "uploading")  # a first file is in the store
    _stop_group(process, ray_tmp)
    uploaded = keys()
    assert uploaded and not any(key.endswith("/manifest.json") for key in uploaded), uploaded

    ray_tmp = _ray_tmp("s3-last")
    process = _prepare(corpus, s3_bucket, ray_tmp)
    output, _ = process.communicate(timeout=RUN_TIMEOUT_S)
    _stop_group(process, ray_tmp)
    assert process.returncode == 0, output.decode()[-3000:]
    folders = {key.split("/")[1] for key in keys()}
    assert len(folders) == 1, keys()
    (folder,) = folders
    assert f"{prefix}/{folder}/manifest.json" in keys() and is_prepared(f"{s3_bucket}/{folder}")
