"""Start a real server process for a test (``mlflow server``, ``mlflow models serve``), post to
it, and stop it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

STARTUP_TIMEOUT_S = 180  # a loaded 2-core CI machine needs ~10-60 s
BIN_DIR = Path(sys.executable).parent  # mlflow's servers start uvicorn by name: it must be on PATH


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_env(**variables: str) -> dict[str, str]:
    """This process's environment with the venv's ``bin`` first on PATH, plus ``variables``.

    ``mlflow server`` (3.x) also starts a pool of job-runner processes (huey consumers, for its
    GenAI jobs and trace roll-ups), six or more Python processes that import MLflow at every server
    start; dynlm uses none of it, so the test servers run without them."""
    return {**os.environ, "PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **variables}


def mlflow_server_argv(folder: Path, uri: str) -> list[str]:
    """``mlflow server`` at ``uri`` (``http://127.0.0.1:PORT``): SQLite backend
    ``folder/mlflow.db``, artifacts served by the server from ``folder/artifacts``. The same
    ``folder`` and ``uri`` start the same server again (same runs, same registry)."""
    return [str(BIN_DIR / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
            "--serve-artifacts", "--artifacts-destination", str(folder / "artifacts"),
            "--host", "127.0.0.1", "--port", uri.rsplit(":", 1)[1], "--workers", "1"]


@contextmanager
def running_server(processes, argv: list[str], ready_url: str, log_path: Path,
                   env: dict[str, str]) -> Iterator[None]:
    """Run ``argv`` through ``processes`` (the ``processes`` fixture: its own process group,
    output in ``log_path``) until ``ready_url`` answers 200; stop the whole group (SIGTERM, then
    SIGKILL) on exit. The test fails with the log's tail when the server exits or is not up
    after :data:`STARTUP_TIMEOUT_S`."""
    with open(log_path, "wb") as log:
        server = processes.popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"{argv[:2]} exited with {server.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(ready_url, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{argv[:2]} not up after {STARTUP_TIMEOUT_S} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield
    finally:
        processes.stop(server, grace_s=20)


def post_json(url: str, payload: dict | bytes) -> tuple[int, dict]:
    """POST ``payload`` (a dict as JSON, or raw bytes as they are) to a started server; return
    (status, JSON body), an HTTP error's too (a served model's 400 says why in its body)."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
