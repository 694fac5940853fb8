"""Run ``dynlm train`` as a subprocess with its own local Ray (for the tests that kill or cut
off a real training: the driver must be a process of its own)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from child_processes import processes_using

from dynlm.faults import KILL_AT_ENV, KILL_PID_ENV
from pipelines.train import committed_checkpoints

TINY = ["train.epochs=2", "train.batch_size=4", "train.early_stopping_patience=0", "model.embed_dim=16",
        "model.hidden_dim=16", "data.vocab_size=300", "data.bpe_merges=30", "data.num_encode_actors=1",
        "run.cpus_per_worker=0.4", "run.num_workers=2"]
RUN_TIMEOUT_S = 420
#: A driver killed with SIGKILL leaves its raylet's dashboard and runtime-env agents waiting on the
#: dead GCS until Ray's GCS reconnect timeout (``gcs_rpc_server_reconnect_timeout_s``, 60 s) ends
#: them (measured 60-70 s, ray 2.60); everything of the killed run must be gone by then.
ORPHANED_AGENTS_EXIT_S = 90


def ray_tmp(name: str) -> Path:
    """A short RAY_TMPDIR of its own (Ray's socket paths must stay under 107 characters)."""
    folder = Path(tempfile.gettempdir()) / f"ray-train-{os.getpid()}-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def left_after(folder: Path, seconds: float) -> list[str]:
    """Command lines of the processes still using ``folder`` after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while (left := processes_using(str(folder))) and time.monotonic() < deadline:
        time.sleep(0.5)
    return [command for _, command in left]


def stop_and_remove(folder: Path) -> None:
    """SIGKILL every process still using the RAY_TMPDIR ``folder``, then remove it."""
    for pid, _ in processes_using(str(folder)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(folder, ignore_errors=True)


def start_train(processes, tmp: Path, run_name: str, ray_dir: Path | None, *extra: str, tracking_uri: str,
                kill_at: str | None = None, ray_address: str | None = None) -> subprocess.Popen:
    """Through ``processes`` (the ``processes`` fixture): ``dynlm train`` of the :data:`TINY` job on ``tmp/synth`` (prepared under ``tmp/prepared``,
    Ray storage ``tmp/ray``) as run ``run_name``, tracked at ``tracking_uri``; output piped.
    ``ray_dir``: the RAY_TMPDIR of the process's own local Ray (a test that kills the driver
    needs a Ray of its own); ``ray_address``: instead, join that running Ray (the session's: no
    cold start). ``kill_at``: a :mod:`dynlm.faults` kill point where the driver SIGKILLs itself."""
    assert (ray_dir is None) != (ray_address is None), "give a Ray of its own or one to join"
    env = {**os.environ, "DYNLM_MLFLOW_ARTIFACTS": str(tmp / "artifacts")}
    for variable in ("RAY_ADDRESS", "RAY_TMPDIR", "MLFLOW_TRACKING_URI", KILL_AT_ENV, KILL_PID_ENV):
        env.pop(variable, None)
    if ray_dir is not None:
        env["RAY_TMPDIR"] = str(ray_dir)
    else:
        env["RAY_ADDRESS"] = ray_address
    if kill_at:
        env[KILL_AT_ENV] = kill_at
    if not tracking_uri.startswith("sqlite:"):
        env.pop("DYNLM_MLFLOW_ARTIFACTS")  # a server keeps its own artifacts
    args = [sys.executable, "-m", "pipelines.cli", "train", "--tracking-uri", tracking_uri]
    for item in [*TINY, f"data.inputs=[{tmp / 'synth'}]", f"data.output_root={tmp / 'prepared'}",
                 f"run.storage_path={tmp / 'ray'}", f"run.name={run_name}"]:
        args += ["--set", item]
    args += extra  # after: an extra --set wins over TINY's
    return processes.popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def output_of(process: subprocess.Popen, expected_returncode: int = 0) -> str:
    """Wait for ``process``; its output (stdout and stderr), after checking its exit status."""
    output, _ = process.communicate(timeout=RUN_TIMEOUT_S)
    text = output.decode()
    assert process.returncode == expected_returncode, text[-4000:]
    return text


RAY_FORWARDED_LINE = re.compile(r"^(\x1b\[[0-9;]*m)*\(")  # "(raylet) ...", "(pid=12) ...", coloured or not


def own_lines(text: str) -> list[str]:
    """The lines of ``text`` that the driver printed itself: Ray forwards its workers' and raylet's
    output asynchronously (prefixed "(raylet)", "(pid=…)", …), so such a line can come after the
    driver's last one."""
    return [line for line in text.strip().splitlines() if not RAY_FORWARDED_LINE.match(line)]


def prepared_folder(output: str) -> Path:
    """The folder that ``dynlm prepare`` printed as its last own line ("prepared data: PATH")."""
    return Path(own_lines(output)[-1].removeprefix("prepared data: "))


def committed(run_dir: Path, checkpoint: str) -> bool:
    """True once Ray Train has committed ``checkpoint`` (e.g. ``epoch_0001``) for the run."""
    return checkpoint in committed_checkpoints(str(run_dir))


def wait_until(process: subprocess.Popen, reached, what: str) -> None:
    """Poll ``reached()`` every 50 ms until it is true; fail when ``process`` ends first or after
    :data:`RUN_TIMEOUT_S`."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not reached():
        assert process.poll() is None, (f"the run ended before {what}", process.stdout.read().decode()[-4000:])
        assert time.monotonic() < deadline, f"not reached in {RUN_TIMEOUT_S} s: {what}"
        time.sleep(0.05)
