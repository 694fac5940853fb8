"""``dynlm prepare`` killed with SIGKILL while it builds: no folder a later run would reuse, and
the next run completes (and removes the killed build's temporary folder).

Each kill is a real ``dynlm prepare`` subprocess with its own local Ray, started with
``DYNLM_KILL_AT=<point>`` (:mod:`dynlm.faults`): the driver SIGKILLs itself at that point of its
own code, so the moment is exact however loaded the machine is (polling the file system from
outside raced the run and missed its moment on 2 busy cores).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from dynlm.data.prepared import is_prepared
from dynlm.data.synth import SynthConfig, write_conll
from dynlm.faults import KILL_AT_ENV, KILL_PID_ENV

LOCAL_KILL_POINTS = ("prepare:parsed", "prepare:encoding", "prepare:writing")
RUN_TIMEOUT_S = 300


def _ray_tmp(name: str) -> Path:
    """A short RAY_TMPDIR of its own (Ray's socket paths must stay under 107 characters)."""
    return Path(tempfile.gettempdir()) / f"ray-sigkill-{os.getpid()}-{name}"


def _prepare(processes, corpus: Path, root: Path | str, name: str, kill_at: str | None = None) -> tuple[int, str]:
    """Run ``dynlm prepare`` to its end (or its SIGKILL); its exit status and output. Whatever is
    left of its session (its local Ray's processes) is SIGKILLed and its Ray folder removed."""
    ray_tmp = _ray_tmp(name)
    ray_tmp.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp)}
    for variable in ("RAY_ADDRESS", KILL_AT_ENV, KILL_PID_ENV):
        env.pop(variable, None)
    if kill_at:
        env[KILL_AT_ENV] = kill_at
    process = processes.popen(
        [sys.executable, "-m", "pipelines.cli", "prepare", "--input", str(corpus), "--output-root", str(root),
         "--set", "vocab_size=300", "--set", "bpe_merges=30", "--set", "num_encode_actors=1", "--no-progress"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        output, _ = process.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)
        worker_lines = _fault_lines_of_workers(ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return process.returncode, output.decode() + worker_lines


def _fault_lines_of_workers(ray_tmp: Path) -> str:
    """The fault-injection lines a Ray worker wrote (a kill point reached in a worker, such as
    ``prepare:writing``, kills the driver from there and says so in that worker's log)."""
    lines = []
    for log in ray_tmp.rglob("worker-*.err"):
        lines += [line for line in log.read_text(errors="replace").splitlines() if "dynlm: fault injection" in line]
    return "".join(f"{line}\n" for line in lines)


def _assert_killed_at(returncode: int, text: str, point: str) -> None:
    assert returncode == -signal.SIGKILL, (point, returncode, text[-3000:])
    assert f"at {point}" in text, (point, text[-3000:])  # killed there, not by something else


def test_prepare_killed_anywhere_leaves_nothing_reusable(tmp_path, processes):
    corpus = tmp_path / "corpus"
    write_conll(SynthConfig(num_documents=40, docs_per_file=10), corpus)
    root = tmp_path / "prepared"
    for index, point in enumerate(LOCAL_KILL_POINTS):
        _assert_killed_at(*_prepare(processes, corpus, root, f"k{index}", kill_at=point), point)
        complete = [p.name for p in root.iterdir() if not p.name.startswith(".") and is_prepared(p)]
        assert complete == [], (point, complete)  # nothing a later run would reuse
        (build,) = root.glob(".tmp-*")  # the killed build's folder: hidden, not a prepared folder
        shards = list(build.glob("**/*.parquet"))
        assert bool(shards) == (point == "prepare:writing"), (point, shards)

    returncode, text = _prepare(processes, corpus, root, "last")
    assert returncode == 0, text[-3000:]
    assert "reusing" not in text  # built, not reused
    (folder,) = [p for p in root.iterdir() if not p.name.startswith(".")]
    assert f"prepared data: {folder}" in text and is_prepared(folder)
    assert not any(root.glob(".tmp-*"))  # the killed builds' temporary folders are gone


def test_prepare_killed_during_the_upload_leaves_nothing_reusable(tmp_path, s3_bucket, processes):
    """An S3 output root (moto): the workers wrote the shards in place, the driver is killed
    after uploading the first of its small files, before manifest.json; the folder has no
    manifest (incomplete, never reused) and the next run completes it."""
    import boto3

    corpus = tmp_path / "corpus"
    write_conll(SynthConfig(num_documents=40, docs_per_file=10), corpus)
    s3 = boto3.client("s3")
    bucket, prefix = s3_bucket[len("s3://"):].split("/", 1)

    def keys() -> list[str]:
        """The uploaded files (pyarrow's folder markers, keys ending in "/", left out)."""
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])
        return [o["Key"] for o in listed if not o["Key"].endswith("/")]

    _assert_killed_at(*_prepare(processes, corpus, s3_bucket, "s3", kill_at="prepare:uploading"), "prepare:uploading")
    uploaded = keys()
    assert any("/train/part-" in key for key in uploaded), uploaded  # the workers' shards
    assert not any(key.endswith("/manifest.json") for key in uploaded), uploaded
    assert not is_prepared(f"{s3_bucket}/{uploaded[0].split('/')[1]}")  # <prefix>/<folder>/...

    returncode, text = _prepare(processes, corpus, s3_bucket, "s3-last")
    assert returncode == 0, text[-3000:]
    folders = {key.split("/")[1] for key in keys()}
    assert len(folders) == 1, keys()
    (folder,) = folders
    assert f"{prefix}/{folder}/manifest.json" in keys() and is_prepared(f"{s3_bucket}/{folder}")

