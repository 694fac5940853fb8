"""Connect to Ray the same way from every verb.

Order: reuse a Ray that this process already initialized (tests, notebooks, Tune trials);
else join a cluster named by ``RAY_ADDRESS`` or started with ``ray start`` on this machine
(``ray.init(address="auto")``); else start a local Ray on this machine.

A local Ray started here also claims the address file ``<tmp>/ray/ray_current_cluster``
(:func:`claim_address_file`). Ray components that look a cluster up without an address read
that file: Ray Train's ``PlacementGroupCleaner`` (it asks the State API whether a trial's
controller is still alive) fails when the file names a cluster that is gone, and then the
placement groups of every ended Tune trial leak until the next trial cannot be scheduled.
"""

from __future__ import annotations

import logging
import os
import socket

logger = logging.getLogger(__name__)


def _cluster_address_file_exists() -> bool:
    """True when ``ray start`` left its address file (``<tmp>/ray/ray_current_cluster``)."""
    import ray._private.utils as ray_utils  # the file's location is only exposed here

    try:
        address = ray_utils.read_ray_address()
    except Exception:  # an unreadable address file means "no cluster here"
        return False
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
    import ray._private.utils as ray_utils  # the file's location is only exposed here

    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is not None:
        return  # not a driver (a Tune trial or a Train worker): the driver owns the file
    ours = ray.get_runtime_context().gcs_address
    try:
        recorded = ray_utils.read_ray_address()
    except OSError:
        recorded = None
    if recorded == ours or (recorded and _address_alive(recorded)):
        return
    try:
        ray_utils.write_ray_address(ours)
    except OSError as exc:  # a read-only /tmp: Ray then finds the cluster by its process
        logger.warning("could not record the Ray address %s: %s", ours, exc)


def started_here() -> bool:
    """True when this process started the Ray it is connected to (a local Ray of this machine:
    ``init_ray``'s ``"local"``, a test's ``ray.init(address="local")``); False for a cluster it
    joined (``RAY_ADDRESS``, ``ray start``, a cluster launched by ``ray up`` or KubeRay)."""
    import ray
    import ray._private.worker as ray_worker  # the driver's node object is only exposed here

    node = ray_worker._global_node
    return ray.is_initialized() and node is not None and bool(node.head)


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
    ray.init(address="local", **{**output, **local_init_kwargs})  # never the recorded (stale) cluster
    claim_address_file()
    return "local"
