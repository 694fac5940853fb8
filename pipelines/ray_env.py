"""Connect to Ray the same way from every verb.

Order: reuse a Ray that this process already initialized (tests, notebooks, Tune trials);
else join a cluster named by ``RAY_ADDRESS`` or started with ``ray start`` on this machine
(``ray.init(address="auto")``); else start a local Ray on this machine.

A local Ray started here also claims the address file ``<tmp>/ray/ray_current_cluster``
(:func:`claim_address_file`). Ray components that look a cluster up without an address read
that file: Ray Train's ``PlacementGroupCleaner`` (it asks the State API whether a trial's
controller is still alive) fails when the file names a cluster that is gone, and then the
placement groups of every ended Tune trial leak until the next trial cannot be scheduled.

A driver killed with SIGKILL takes its local Ray's head processes with it (Ray binds them to
the driver). Two of the raylet's children, the dashboard agent and the runtime env agent, see
the raylet gone and wait for the dead GCS until Ray's GCS reconnect timeout ends them (60 s by
default, ``RAY_gcs_rpc_server_reconnect_timeout_s``; measured 60-70 s, ray 2.60). Nothing of a
killed run outlives that: ``tests/pipelines/test_train_sigkill.py`` checks it. dynlm does not
look for or kill processes itself.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)


#: Settings of a local Ray that dynlm starts (one machine, local disk, no autoscaler), exported before
#: ``ray.init`` so its workers inherit them; a value set in the environment wins. Ray's defaults
#: are sized for a cluster, and on a local Ray they cost process start-ups that a small run pays
#: again in every training and every Tune trial (each helper actor is a new Python process that
#: imports Ray Train and torch: ~2 CPU-seconds). Measured: ``benchmarks/bench_fixed_costs.py
#: --local-env`` (``benchmarks/results/fixed_costs.md``).
LOCAL_RAY_ENV = {
    # Ray Data's Parquet reader (datasource V2) reads footers on a pool of actors, 32 by default,
    # each with 128 IO threads, started for every read and killed after it; a prepared split on
    # local disk is a few files: one reader.
    "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS": "1",
    # Ray Train's preemption watcher (one actor per training) polls for node drain notices, which
    # only a cluster's autoscaler sends.
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}
#: Ray keeps at most ``num_workers_soft_limit`` worker processes (its default: the node's CPUs),
#: counting actors, and kills idle task workers above it after a second. A training on a small
#: local Ray has ~10 actors alive (controller, workers, Ray Train's helpers), so every idle task
#: worker died and the next read task, or the next actor, started a new process (~2 CPU-s each,
#: twice per training on 2 cores). A local Ray started here keeps this many more.
IDLE_WORKERS_KEPT = 4
SOFT_LIMIT_ENV = "RAY_num_workers_soft_limit"

def address_file() -> Path:
    """Where ``ray start`` records its cluster's address and ``ray.init()`` looks for it:
    ``/tmp/ray/ray_current_cluster`` (``ray.init``'s documentation), in Ray's temporary folder
    (``$RAY_TMPDIR``, else ``$TMPDIR`` on Linux, else ``/tmp``; ``tempfile``'s elsewhere).
    ``tests/pipelines/test_ray_env.py`` checks that Ray still agrees."""
    if os.environ.get("RAY_TMPDIR"):
        base = os.environ["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and os.environ.get("TMPDIR"):
        base = os.environ["TMPDIR"]
    else:
        base = "/tmp" if sys.platform.startswith(("linux", "darwin")) else tempfile.gettempdir()
    return Path(base) / "ray" / "ray_current_cluster"


def read_address_file() -> str | None:
    """The address in :func:`address_file`, None when there is none (or it cannot be read)."""
    try:
        return address_file().read_text().strip() or None
    except OSError:
        return None


def write_address_file(address: str) -> None:
    """Record ``address`` in :func:`address_file` (written whole, then renamed into place)."""
    path = address_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    partial.write_text(address)
    os.replace(partial, path)


def _cluster_address_file_exists() -> bool:
    """True when the address file names a live cluster (``ray start`` on this machine)."""
    address = read_address_file()
    if not address:
        return False
    if _address_alive(address):  # a stale file (the cluster was killed) would make ray.init hang
        return True
    logger.warning("ignoring the stale Ray address file (nothing listens at %s)", address)
    return False


def _address_alive(address: str | None) -> bool:
    if not address:
        return False
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def claim_address_file() -> None:
    """Point ``<tmp>/ray/ray_current_cluster`` at this driver's Ray when it names no live cluster.

    Call it in the driver after connecting. A file naming another live cluster (a ``ray start``
    the user runs beside this one) is left alone.
    """
    import ray

    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is not None:
        return  # not a driver (a Tune trial or a Train worker): the driver owns the file
    ours = ray.get_runtime_context().gcs_address
    recorded = read_address_file()
    if recorded == ours or (recorded and _address_alive(recorded)):
        return
    try:
        write_address_file(ours)
    except OSError as exc:  # a read-only /tmp: Ray then finds the cluster by its process
        logger.warning("could not record the Ray address %s: %s", ours, exc)


_STARTED_HERE: set[str] = set()  # GCS addresses of the local Rays start_local_ray started


def started_here() -> bool:
    """True when this process started the Ray it is connected to (:func:`start_local_ray`: a
    local Ray of this machine, whose CPUs and GPUs are all there is); False for a cluster it
    joined (``RAY_ADDRESS``, ``ray start``, a cluster launched by ``ray up`` or KubeRay)."""
    import ray

    return ray.is_initialized() and ray.get_runtime_context().gcs_address in _STARTED_HERE


def start_local_ray(**init_kwargs):
    """Start a new local Ray on this machine the way every dynlm verb does: export
    :func:`local_ray_env`, ``ray.init(address="local", **init_kwargs)``, remember that this
    process started it (:func:`started_here`) and claim the address file.

    Returns:
        ``ray.init``'s context (its ``address_info`` names the session folder and the GCS).
    """
    import ray

    export_local_ray_env(init_kwargs.get("num_cpus"))
    context = ray.init(address="local", **init_kwargs)  # never the recorded (stale) cluster
    _STARTED_HERE.add(context.address_info["gcs_address"])
    claim_address_file()
    return context


def cluster_cpus() -> tuple[float, float]:
    """(CPUs of the connected Ray cluster, CPUs of its largest alive node), as Ray reports them
    now (``run.cpus_per_worker=auto`` is resolved from them: :func:`dynlm.job.with_worker_cpus`)."""
    import ray

    largest = max((node["Resources"].get("CPU", 0.0) for node in ray.nodes() if node.get("Alive")), default=0.0)
    return float(ray.cluster_resources().get("CPU", 0.0)), float(largest)


def local_ray_env(num_cpus: float | None = None) -> dict[str, str]:
    """:data:`LOCAL_RAY_ENV` plus the worker soft limit of a local Ray with ``num_cpus`` CPUs
    (None: this machine's): :data:`IDLE_WORKERS_KEPT` above Ray's default."""
    cpus = int(num_cpus) if num_cpus is not None else (os.cpu_count() or 1)
    return {**LOCAL_RAY_ENV, SOFT_LIMIT_ENV: str(cpus + IDLE_WORKERS_KEPT)}


def export_local_ray_env(num_cpus: float | None = None) -> None:
    """Export :func:`local_ray_env` (where not set) before a local ``ray.init`` in this process."""
    for key, value in local_ray_env(num_cpus).items():
        os.environ.setdefault(key, value)


def init_ray(**local_init_kwargs) -> str:
    """Make sure Ray is initialized in this process.

    Args:
        local_init_kwargs: passed to ``ray.init`` only when a new local Ray is started
            (e.g. ``num_cpus=2``).

    Returns:
        How Ray was reached: ``"existing"``, ``"cluster"`` or ``"local"``.

    Raises:
        ConnectionError: ``RAY_ADDRESS`` is set but no cluster answers there.
    """
    import ray
    import ray.data  # noqa: F401  (configures its loggers at import: routed below with Ray's)

    from pipelines import console

    console.route_library_logs()  # under the dynlm command, Ray's log lines go to its log file
    if ray.is_initialized():
        claim_address_file()  # another cluster (a test's, a finished `ray start`) may have left it
        return "existing"
    output = console.ray_init_options()  # workers' output stays in Ray's logs unless --verbose
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address="auto", **output)  # raises ConnectionError naming the address if it is down
        return "cluster"
    if _cluster_address_file_exists():
        try:
            ray.init(address="auto", **output)
            return "cluster"
        except ConnectionError as exc:  # a stale address file from a stopped `ray start`
            logger.warning("no Ray cluster at the recorded address (%s); starting a local Ray", exc)
    start_local_ray(**{**output, **local_init_kwargs})
    return "local"
