"""pipelines.ray_env: the driver claims Ray's address file when it names no live cluster."""

from __future__ import annotations

import os
import socket

import pytest


@pytest.fixture
def address_file():
    """Ray's real address file, restored after the test."""
    from pipelines import ray_env

    before = ray_env.read_address_file()
    yield ray_env
    if before is None:
        ray_env.address_file().unlink(missing_ok=True)
    else:
        ray_env.write_address_file(before)


@pytest.mark.parametrize("env", [{}, {"TMPDIR": "/var/tmp/x"}, {"RAY_TMPDIR": "/srv/ray-tmp", "TMPDIR": "/var/tmp/x"}])
def test_the_address_file_is_where_ray_looks_for_it(env, monkeypatch):
    """dynlm reads and writes the file without Ray's private helpers; this pins it to Ray's own
    location (a private function, read here only), so a Ray upgrade that moves it fails here."""
    from ray._common.utils import get_ray_address_file

    from pipelines.ray_env import address_file

    for key in ("RAY_TMPDIR", "TMPDIR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert str(address_file()) == get_ray_address_file(None)


def test_a_stale_address_file_is_claimed_by_the_running_driver(ray_session, address_file):
    from pipelines.ray_env import init_ray

    address_file.write_address_file("127.0.0.1:1")  # what a finished test cluster leaves behind
    assert init_ray() == "existing"
    assert address_file.read_address_file() == ray_session.get_runtime_context().gcs_address


def test_an_address_file_naming_another_live_cluster_is_left_alone(ray_session, address_file):
    from pipelines.ray_env import claim_address_file

    with socket.socket() as other:  # something listens there: treated as a live `ray start`
        other.bind(("127.0.0.1", 0))
        other.listen()
        live = f"127.0.0.1:{other.getsockname()[1]}"
        address_file.write_address_file(live)
        claim_address_file()
        assert address_file.read_address_file() == live


def test_a_local_ray_gets_dynlm_settings_unless_the_user_set_them(monkeypatch):
    from pipelines.ray_env import export_local_ray_env, local_ray_env

    for key in local_ray_env(2):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "8")  # the user's value
    export_local_ray_env(2)
    assert local_ray_env(2) == {"RAY_DATA_PARQUET_FOOTER_NUM_ACTORS": "1", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
                                "RAY_num_workers_soft_limit": "6"}  # 2 CPUs + 4 idle workers kept
    assert os.environ["RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"] == "8"
    assert os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "0"
    assert os.environ["RAY_num_workers_soft_limit"] == "6"
    assert local_ray_env(None)["RAY_num_workers_soft_limit"] == str(os.cpu_count() + 4)


def test_the_session_ray_was_started_here(ray_session):
    """The session's Ray is started as `dynlm` starts a local one (start_local_ray): this process
    knows it started it (so missing workers fail at once and its size is not waited for)."""
    from pipelines.ray_env import started_here

    assert started_here()
