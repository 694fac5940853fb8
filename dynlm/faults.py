"""Fault injection: a ``dynlm`` process SIGKILLs its driver at a named point of its work.

The kill -9 tests must kill a run at one exact moment: after the parse, in the middle of the
encode, between two uploaded files, right after a checkpoint is committed, right after a trial
finished. Polling the file system from outside for that moment races the run (on a loaded
2-core machine the run passed the point, or ended, before the poll saw it). Instead the test
starts ``dynlm`` with ``DYNLM_KILL_AT=<point>`` and the code itself calls :func:`kill_point` at
each point: when the names match, the driver gets ``SIGKILL`` there, as ``kill -9 <pid>`` would
deliver it. Nothing runs after it (no ``finally``, no ``atexit``), so what the test sees is what
a real kill leaves.

Points reached in a Ray worker (a training rank, a Tune trial) kill the *driver*, whose pid
:func:`arm` puts in ``DYNLM_KILL_PID`` before Ray starts (a local Ray's processes inherit the
driver's environment). Unset, every call is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import sys

KILL_AT_ENV = "DYNLM_KILL_AT"
KILL_PID_ENV = "DYNLM_KILL_PID"

# point -> where it is (the call sites name these strings; a test that names another one fails)
KILL_POINTS = {
    "prepare:parsed": "the inputs are read and parsed, nothing is encoded (pipelines/prepare.py)",
    "prepare:encoding": "the preprocessor is fitted; the Ray Data job that encodes and writes the "
                        "shards is defined, not yet started (pipelines/prepare.py)",
    "prepare:writing": "a worker wrote the first Parquet shard into the folder being built",
    "prepare:uploading": "the first file of the folder is in the object store, manifest.json is not",
    "train:checkpoint_committed": "rank 0, first step after Ray Train committed the previous "
                                  "epoch's checkpoint (pipelines/train.py)",
    "tune:trial_finished": "a trial's training ended and its MLflow run is FINISHED; the trial "
                           "function has not returned to Tune (pipelines/tune.py)",
}


def armed_point() -> str | None:
    """The point named by ``DYNLM_KILL_AT`` (None when unset).

    Raises:
        ValueError: the name is not one of :data:`KILL_POINTS` (a typo must not pass silently).
    """
    point = os.environ.get(KILL_AT_ENV) or None
    if point is not None and point not in KILL_POINTS:
        raise ValueError(f"{KILL_AT_ENV}={point!r}: not a kill point; known: {', '.join(KILL_POINTS)}")
    return point


def arm() -> None:
    """Called by the CLI before anything starts: check the point's name and make this process
    the one to kill (inherited by the Ray processes it starts)."""
    if armed_point() is not None and not os.environ.get(KILL_PID_ENV):
        os.environ[KILL_PID_ENV] = str(os.getpid())


def is_armed(point: str) -> bool:
    """True when ``DYNLM_KILL_AT`` names ``point`` (for call sites that must first wait for
    their moment, e.g. a checkpoint's commit)."""
    if point not in KILL_POINTS:
        raise ValueError(f"{point!r} is not one of KILL_POINTS")
    return armed_point() == point


def kill_point(point: str) -> None:
    """SIGKILL the armed process (the driver; this process when none was armed) if
    ``DYNLM_KILL_AT`` names ``point``; else return at once."""
    if not is_armed(point):
        return
    pid = int(os.environ.get(KILL_PID_ENV) or os.getpid())
    print(f"dynlm: fault injection: SIGKILL of pid {pid} at {point}", file=sys.stderr, flush=True)
    os.kill(pid, signal.SIGKILL)
    if pid == os.getpid():  # the signal is delivered before kill() returns; never go on
        signal.pause()
