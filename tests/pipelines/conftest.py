"""Fixtures of the pipeline tests: a real MLflow tracking server."""

from __future__ import annotations

import pytest
from child_processes import Processes
from server_process import free_port, mlflow_server_argv, running_server, server_env


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """One real ``mlflow server`` per session on a free local port: SQLite backend, artifacts served by the
    server (``--serve-artifacts``) from a local folder. Yields ``(uri, artifacts folder)``.

    Point dynlm at it with ``--tracking-uri`` (or ``MLFLOW_TRACKING_URI`` in the test), and unset
    ``DYNLM_MLFLOW_ARTIFACTS``: the server keeps the artifacts.
    """
    tmp = tmp_path_factory.mktemp("mlflow-server")
    artifacts = tmp / "artifacts"
    uri = f"http://127.0.0.1:{free_port()}"
    env = server_env()
    env.pop("MLFLOW_TRACKING_URI", None)
    started = Processes()
    try:
        with running_server(started, mlflow_server_argv(tmp, uri), f"{uri}/health", tmp / "server.log", env):
            yield uri, artifacts
    finally:
        started.stop_all()

