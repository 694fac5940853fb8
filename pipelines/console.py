"""What ``dynlm`` shows on the terminal, and where everything else goes.

By default the terminal shows what runs, Ray Data's progress bars while preparing, one progress
bar per training epoch (loss, tokens/s), one line of metrics per epoch, the final table and where
to look next. Everything else goes to log files:

    Python logs of Ray, MLflow, alembic, ... (driver)   runs/logs/dynlm-<time>-<pid>.log
                                                         ($DYNLM_LOG_DIR overrides runs/logs)
    native (C++) lines of Ray's core worker (driver)     runs/logs/dynlm-<time>-<pid>.native.log
    output of Ray's workers and actors                   <ray temp dir>/session_latest/logs/

``dynlm --verbose <verb>`` leaves them all on the terminal, as Ray and MLflow print them.

Training runs in Ray Train workers, whose output does not reach the terminal by default
(``ray.init(log_to_driver=False)``). Rank 0 therefore sends its progress to a small actor
(:class:`ProgressRelay`) through :class:`EpochProgress`; the driver polls it and draws the bars
(:class:`TrainingConsole`, with ``dynlm.progress.EpochBar``). Both ends are no-ops when no relay
is set (Tune trials).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

from dynlm.log_file import install_log_file, installed_log_files
from dynlm.progress import EpochBar

VERBOSE_ENV = "DYNLM_VERBOSE"
LOG_DIR_ENV = "DYNLM_LOG_DIR"
DEFAULT_LOG_DIR = "runs/logs"
RELAY_NAMESPACE = "dynlm"
POLL_SECONDS = 0.5  # how often the driver asks the relay for news
STEP_EVENT_SECONDS = 0.5  # rank 0 sends at most one step event this often
# Loggers that print to the terminal on their own (they do not propagate to the root logger).
LIBRARY_LOGGERS = ("ray", "ray.data", "ray.train", "ray.tune", "mlflow", "alembic")


def verbose() -> bool:
    """True under ``dynlm --verbose`` (set by :func:`configure_output`, read by ``init_ray``)."""
    return os.environ.get(VERBOSE_ENV) == "1"


def configure_output(is_verbose: bool) -> Path | None:
    """Route library logs to a log file unless ``is_verbose``; called once by ``dynlm``'s main.

    Returns:
        The log file of this process (created only when something is logged), None when verbose.
    """
    os.environ[VERBOSE_ENV] = "1" if is_verbose else "0"
    if is_verbose:
        return None
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # model downloads
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")  # mlflow's logger then propagates
    path = install_log_file(os.environ.get(LOG_DIR_ENV) or DEFAULT_LOG_DIR)
    route_library_logs()
    redirect_native_stderr(path.with_suffix(".native.log"))
    return path


def redirect_native_stderr(path: Path) -> None:
    """Send what native code writes to this process's stderr (file descriptor 2) to ``path``,
    keeping Python's ``sys.stderr`` (dynlm's own lines, progress bars, tracebacks) on the terminal.

    Ray's core worker in the driver logs in C++ straight to descriptor 2 (e.g. the note that an
    actor pool's constructor arguments live in the object store: ``core_worker.cc ... max_restarts
    > 0``); the processes the driver starts (Ray's raylet and GCS) inherit the file too. Only in
    the ``dynlm`` process itself, whose ``sys.stderr`` is still the process's: a caller that
    replaced it (a test capturing output, an embedding application) keeps its descriptors. The
    file is removed at exit when nothing was written.
    """
    if sys.stderr is None or sys.stderr is not sys.__stderr__:
        return
    try:
        if sys.stderr.fileno() != 2:
            return
    except (AttributeError, OSError, ValueError):
        return
    import atexit

    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    terminal = os.dup(2)
    native = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(native, 2)
    os.close(native)
    sys.stderr = os.fdopen(terminal, "w", buffering=1, encoding=sys.__stderr__.encoding or "utf-8",
                           errors="backslashreplace")

    def remove_if_empty() -> None:
        try:
            if path.stat().st_size == 0:
                path.unlink()
        except OSError:
            pass

    atexit.register(remove_if_empty)


def route_library_logs() -> None:
    """Make the loggers that print on their own (Ray's, MLflow's) write to the log file instead.

    Their terminal handlers are removed and they propagate to the root logger, which
    :func:`configure_output` pointed at the file. Call it again after a library configures
    its loggers (``ray.init``). Does nothing under ``--verbose``.
    """
    if verbose() or os.environ.get(VERBOSE_ENV) is None:
        return  # verbose, or not run from the dynlm command (a library user keeps their logging)
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                logger.removeHandler(handler)
        logger.propagate = True
    if "ray.data" in sys.modules:  # one progress bar per dataset, not one per operator too
        sys.modules["ray.data"].DataContext.get_current().enable_operator_progress_bars = False
    mlflow_logging = sys.modules.get("mlflow.utils.logging_utils")
    if mlflow_logging is not None:  # MLflow also prints ("Successfully registered model ...")
        mlflow_logging.disable_logging()  # to a stream of its own; this mutes that stream


def log_locations() -> str:
    """One line saying where the logs that are not on the terminal are (for the end of a verb)."""
    import tempfile

    files = installed_log_files()
    ray_logs = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray" / "session_latest" / "logs"
    ours = f"{files[0]}, " if files and Path(files[0]).exists() else ""
    return f"logs: {ours}Ray's in {ray_logs} (dynlm --verbose prints them here)"


def ray_init_options() -> dict[str, Any]:
    """``ray.init`` arguments for the terminal: workers' and actors' output (Ray Train's
    reports, actor warnings) stays in Ray's session logs, unless ``--verbose``. Outside the
    ``dynlm`` command: none (Ray's defaults)."""
    if os.environ.get(VERBOSE_ENV) is None:
        return {}
    return {"log_to_driver": verbose()}


# ---------------------------------------------------------------------------------------------
# Rank 0 -> driver
# ---------------------------------------------------------------------------------------------


class ProgressRelay:
    """A mailbox actor: rank 0 puts events, the driver drains them (``ray.remote`` at use)."""

    def __init__(self):
        self.events: list[tuple] = []

    def put(self, event: tuple) -> None:
        self.events.append(event)

    def drain(self) -> list[tuple]:
        events, self.events = self.events, []
        return events


class EpochProgress:
    """Rank 0's side: sends step, epoch and note events to the relay named ``relay_name``.

    Args:
        relay_name: from :class:`TrainingConsole` (``WorkerSettings.progress_relay``); None:
            every method does nothing (a Tune trial, or a rank other than 0).
        world_size: number of ranks (tokens/s are estimated as rank 0's times this).
    """

    def __init__(self, relay_name: str | None, world_size: int = 1):
        self.world_size = world_size
        self.relay = None
        if relay_name is not None:
            import ray

            try:
                self.relay = ray.get_actor(relay_name, namespace=RELAY_NAMESPACE)
            except ValueError:  # the driver's relay is gone: train without the bar
                self.relay = None
        self.epoch, self.started, self.last_sent = 0, 0.0, 0.0

    def _send(self, event: tuple, wait: bool = False) -> None:
        """Steps: fire and forget. ``wait``: until the relay holds it (one caller's calls run in
        order, so every earlier step too) - an epoch's line is never lost when the worker exits."""
        if self.relay is None:
            return
        import ray

        try:
            ref = self.relay.put.remote(event)
            if wait:
                ray.get(ref)
        except ray.exceptions.RayActorError:  # the bar is cosmetic: training goes on without it
            self.relay = None

    def start_epoch(self, epoch: int) -> None:
        self.epoch, self.started, self.last_sent = epoch, time.perf_counter(), 0.0

    def step(self, totals: dict) -> None:
        """After an optimizer step; ``totals``: this rank's running sums (``steps``, ``tokens``,
        ``nll_sum``; the last two may be device scalars, read only when an event is sent)."""
        now = time.perf_counter()
        if self.relay is None or now - self.last_sent < STEP_EVENT_SECONDS:
            return
        self.last_sent = now
        tokens, nll_sum = int(totals["tokens"]), float(totals["nll_sum"])
        loss = nll_sum / tokens if tokens else float("nan")
        rate = tokens * self.world_size / max(now - self.started, 1e-9)
        self._send(("step", self.epoch, int(totals["steps"]), loss, rate))

    def end_epoch(self, record: dict) -> None:
        """The epoch's line: its numbers, and the name of its objective (what the line shows)."""
        sent = {k: v for k, v in record.items() if isinstance(v, (int, float)) or k == "objective_metric"}
        self._send(("epoch", sent), wait=True)

    def note(self, text: str) -> None:
        """A line for the terminal (without a relay: printed to this worker's log)."""
        if self.relay is None:
            print(text, flush=True)
        self._send(("note", text), wait=True)


class TrainingConsole:
    """The driver's side: a relay actor, and a thread drawing its events with an :class:`EpochBar`.

    Use as a context manager around ``TorchTrainer.fit()``; :attr:`relay_name` goes to rank 0.
    The arguments are :class:`dynlm.progress.EpochBar`'s.
    """

    def __init__(self, epochs: int, steps_per_epoch: int, stream: TextIO | None = None):
        self.bar = EpochBar(epochs, steps_per_epoch, stream)
        self.relay_name = f"dynlm-progress-{uuid.uuid4().hex[:12]}"
        self.relay = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> TrainingConsole:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # on the driver's node: a worker node that dies (and is replaced) must not take it along
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.relay = ray.remote(num_cpus=0)(ProgressRelay).options(
            name=self.relay_name, namespace=RELAY_NAMESPACE, scheduling_strategy=here).remote()
        # not waited for (0.8 s of a small run): a named actor is registered when .remote()
        # returns, so rank 0's lookup finds it, and what rank 0 sends waits for its start
        self._thread = threading.Thread(target=self._poll, name="dynlm-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        import ray

        self._stop.set()
        self._thread.join()
        try:
            self.bar.show(ray.get(self.relay.drain.remote()))  # what arrived after the last poll
            ray.kill(self.relay)
        except ray.exceptions.RayActorError:  # never fail a training over its progress display
            pass
        self.bar.close()

    def _poll(self) -> None:
        import ray

        while not self._stop.wait(POLL_SECONDS):
            try:
                self.bar.show(ray.get(self.relay.drain.remote()))
            except ray.exceptions.RayActorError:
                return
