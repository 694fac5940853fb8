"""Connect to Ray the same way from every verb.

Order: reuse a Ray that this process already initialized (tests, notebooks, Tune trials);
else join a cluster named by ``RAY_ADDRESS`` or started with ``ray start`` on this machine
(``ray.init(address="auto")``); else start a local Ray on this machine.
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
    host, _, port = address.rpartition(":")
    try:  # a stale file (the cluster was killed) would make ray.init hang on retries
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        logger.warning("ignoring the stale Ray address file (nothing listens at %s)", address)
        return False


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

    if ray.is_initialized():
        return "existing"
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address="auto")  # raises ConnectionError naming the address if it is down
        return "cluster"
    if _cluster_address_file_exists():
        try:
            ray.init(address="auto")
            return "cluster"
        except ConnectionError as exc:  # a stale address file from a stopped `ray start`
            logger.warning("no Ray cluster at the recorded address (%s); starting a local Ray", exc)
    ray.init(address="local", **local_init_kwargs)  # never the recorded (stale) cluster
    return "local"
