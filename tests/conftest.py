"""Shared fixtures and the suite's two tiers.

Tiers are chosen by what a test starts, not by hand (``docs/ARCHITECTURE.md``, "Tests"):

- ``unit``: pure Python / torch in this process. No Ray, no subprocess, no server.
  ``make test-fast`` runs this tier.
- ``e2e``: a test that uses a fixture which starts something: the session's local Ray
  (``ray_session``), child processes (``processes``, ``gloo_ranks``), a real ``mlflow server``
  (``mlflow_server``), or a fixture built on one of them (a prepared corpus, a trained champion).
  ``make test`` (CI, the README's test command) runs both tiers.

Two checks keep the tiers honest:

- a ``unit`` test that starts a process anyway (``subprocess``, ``os.fork``/``posix_spawn``) fails
  and names the command: it must use the ``processes`` fixture, which puts it in ``e2e`` and stops
  what it started;
- every process the suite starts carries ``DYNLM_TEST_SESSION`` in its environment (children
  inherit it, Ray's raylet and workers too); when the session ends, one that is still running
  fails the run (its command line is printed, then it is killed).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from child_processes import SESSION_ENV, Processes, processes_of_this_session

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("DYNLM_SHARED_DATA", REPO.parent / "shared" / "data"))

# --- tiers -----------------------------------------------------------------------------------

#: Fixtures that start something outside this process (directly or through a fixture they use).
E2E_FIXTURES = frozenset({"ray_session", "processes", "gloo_ranks", "mlflow_server"})
#: Libraries whose own helper processes a unit test may start, because the library waits for
#: them: torch.compile's inductor (the C++ compiler, a check that the built library loads),
#: GitPython (MLflow asks git for the source version of a run) and the standard library's
#: ``platform`` (``platform.processor()`` runs ``uname -p`` once per process: whichever test
#: first imports what asks for it). Matched on the calling frames.
ALLOWED_CALLERS = (f"{os.sep}torch{os.sep}_inductor{os.sep}", f"{os.sep}git{os.sep}cmd.py",
                   f"{os.sep}platform.py")
# inductor compiles in this process, not in a pool of compile workers that would outlive a test
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("DYNLM_TEST_STREAM"):
    # Two pytest processes on 2 cores (`make test-fast`'s xdist workers, `make test`'s streams):
    # torch's OpenMP threads of one spin while the other runs; the unit tier took 2 min 41 s in
    # two workers of 2 threads each, 57 s with one thread each, 1 min 22 s in one process.
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    for item in items:
        uses = E2E_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.e2e if uses else pytest.mark.unit)
        item.user_properties.append(("tier", "e2e" if uses else "unit"))
        if "ray_session" in item.fixturenames:  # scripts/run_tests.sh runs these beside the others
            item.add_marker(pytest.mark.session_ray)


_started: list[str] = []  # commands started since the current test began (audit hook below)


def _started_by_allowed_library() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if any(part in frame.f_code.co_filename for part in ALLOWED_CALLERS):
            return True
        frame = frame.f_back
    return False


def _audit(event: str, args) -> None:
    if event not in ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn"):
        return
    if _started_by_allowed_library():
        return
    if event == "subprocess.Popen":
        executable, argv = args[0], args[1]
        _started.append(" ".join(map(str, argv)) if isinstance(argv, (list, tuple)) else str(argv or executable))
    elif event == "os.posix_spawn":
        _started.append(" ".join(map(str, args[1])))
    else:
        _started.append(event)


sys.addaudithook(_audit)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    _started.clear()
    result = yield  # re-raises what the test raised
    if item.get_closest_marker("unit") is None:
        return result
    started = list(_started)
    if started:
        pytest.fail(f"a unit-tier test started {len(started)} process(es) ({started[0][:200]}): start them "
                    "through the `processes` fixture, so the test is in the e2e tier and they are stopped",
                    pytrace=False)
    return result


# --- nothing the suite starts outlives it ----------------------------------------------------

os.environ[SESSION_ENV] = uuid.uuid4().hex
OUTLIVE_GRACE_S = float(os.environ.get("DYNLM_TEST_OUTLIVE_GRACE_S", "30"))


@pytest.fixture(scope="session", autouse=True)
def _nothing_outlives_the_suite():
    """Fails the session (an error in the last test's teardown) when a process started by the
    suite still runs after every other fixture was torn down. Linux only (/proc)."""
    yield
    if not Path("/proc/self/environ").exists():
        return
    deadline = time.monotonic() + OUTLIVE_GRACE_S
    while (left := processes_of_this_session()) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        listing = "\n".join(f"  pid {pid}: {command[:300]}" for pid, command in left)
        pytest.fail(f"{len(left)} process(es) started by the test suite still ran {OUTLIVE_GRACE_S:.0f} s after "
                    f"it ended (killed now):\n{listing}", pytrace=False)


@pytest.fixture
def processes():
    """:class:`Processes` for this test: what it starts is stopped when the test ends."""
    started = Processes()
    yield started
    started.stop_all()


# --- the session's shared services and data --------------------------------------------------


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def ray_session(moto_s3_endpoint):
    """A local Ray cluster (2 CPUs) shared by every Ray test of the session (its workers see the
    session's moto S3 server: ``moto_s3_endpoint``)."""
    import ray

    from pipelines.ray_env import claim_address_file, start_local_ray

    if not ray.is_initialized():
        # as `dynlm` starts a local Ray (a fresh single-node cluster, never one left by another process)
        start_local_ray(num_cpus=2, include_dashboard=True, log_to_driver=False,
                        runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    claim_address_file()  # Train's placement-group cleaner finds this cluster through it
    yield ray
    ray.shutdown()
    _stop_ray_workers_left_after_shutdown()


#: how long a Ray worker may take to exit after the session's ``ray.shutdown()``
RAY_WORKER_EXIT_GRACE_S = 10.0


def _stop_ray_workers_left_after_shutdown() -> None:
    """SIGKILL the ``ray::*`` worker processes of this session still running
    :data:`RAY_WORKER_EXIT_GRACE_S` after ``ray.shutdown()``, and say so as a warning (in the
    run's warnings summary) instead of failing the run.

    Seen once in a fresh-clone run (2026-12-07): the ``ray::TrainController`` of
    ``test_worker_failure_restarts_from_checkpoint`` logged its core worker's complete shutdown
    and then never exited (orphaned, parent 1) until the session-end check killed it. A Ray
    worker hung in its interpreter's exit is Ray's, not a process a test forgot; anything else
    left running (a server, a raylet, a test's own cluster) still fails the run.
    """
    import warnings

    deadline = time.monotonic() + RAY_WORKER_EXIT_GRACE_S
    while (left := [(pid, command) for pid, command in processes_of_this_session() if command.startswith("ray::")]) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid, command in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        warnings.warn(f"a Ray worker still ran {RAY_WORKER_EXIT_GRACE_S:.0f} s after ray.shutdown() (killed now): "
                      f"pid {pid}: {command[:200]}", stacklevel=1)


@pytest.fixture(scope="session")
def empty_mlflow_db(tmp_path_factory) -> Path:
    """An MLflow SQLite store with its tables created and nothing in it, made once per session:
    creating the tables (MLflow's migrations) takes 1.5-2.5 s, copying the file 0.05 s."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()  # creates and migrates the tables
    return path


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch, empty_mlflow_db):
    """A fresh MLflow tracking + registry store on SQLite (a copy of the session's empty store),
    artifacts in tmp_path."""
    shutil.copy(empty_mlflow_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("DYNLM_MLFLOW_ARTIFACTS", str(tmp_path / "mlartifacts"))
    return uri


@pytest.fixture(scope="session")
def moto_s3_endpoint():
    """A moto S3 server on 127.0.0.1 for the whole session (a thread of this process); its
    endpoint, or None without the dev extra (moto[server]).

    pyarrow and boto3 reach it through the AWS environment variables, set in ``os.environ`` for
    the session before the session's Ray starts (``ray_session`` uses this fixture): Ray workers
    inherit them and write the shards of an ``s3://`` prepared folder as a cluster's nodes would
    with their own credentials.
    """
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        yield None
        return
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    settings = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    previous = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    yield settings["AWS_ENDPOINT_URL"]
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()


@pytest.fixture
def s3_bucket(moto_s3_endpoint):
    """A new, empty bucket of the session's moto S3 server; yields ``s3://<bucket>/prepared``.

    The bucket's name is new for every test: moto keeps its buckets in process-global state, so
    a fixed name would show a later test what an earlier one wrote. Skipped without the dev
    extra (moto[server]).
    """
    if moto_s3_endpoint is None:
        pytest.skip("moto[server] not installed (dev extra)")
    import boto3

    bucket = f"dynlm-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/prepared"


def _shared(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} not present (shared corpora are optional)")
    return path


@pytest.fixture(scope="session")
def litbank_dir() -> Path:
    return _shared("litbank/conll")


@pytest.fixture(scope="session")
def wikitext_dir() -> Path:
    return _shared("wikitext-2")


@pytest.fixture(scope="session")
def cmrc_dir() -> Path:
    return _shared("cmrc2017")


@pytest.fixture(scope="session")
def cbt_dir() -> Path:
    return _shared("cbt_sample")
