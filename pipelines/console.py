"""What ``dynlm`` shows on the terminal, and where everything else goes.

By default the terminal shows what runs, Ray Data's progress bars while preparing, one progress
bar per training epoch (loss, tokens/s), one line of metrics per epoch, the final table and where
to look next. Everything else goes to log files:

    Python logs of Ray, MLflow, alembic, ... (driver)   runs/logs/dynlm-<time>-<pid>.log
                                                         ($DYNLM_LOG_DIR overrides runs/logs)
    output of Ray's workers and actors                   <ray temp dir>/session_latest/logs/

``dynlm --verbose <verb>`` leaves them all on the terminal, as Ray and MLflow print them.

Training runs in Ray Train workers, whose output does not reach the terminal by default
(``ray.init(log_to_driver=False)``). Rank 0 therefore sends its progress to a small actor
(:class:`ProgressRelay`) through :class:`EpochProgress`; the driver polls it and draws the bars
(:class:`TrainingConsole`). Both ends are no-ops when no relay is set (Tune trials).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

VERBOSE_ENV = "DYNLM_VERBOSE"
LOG_DIR_ENV = "DYNLM_LOG_DIR"
DEFAULT_LOG_DIR = "runs/logs"
RELAY_NAMESPACE = "dynlm"
POLL_SECONDS = 0.5  # how often the driver asks the relay for news
STEP_EVENT_SECONDS = 0.5  # rank 0 sends at most one step event this often
# Loggers that print to the terminal on their own (they do not propagate to the root logger).
LIBRARY_LOGGERS = ("ray", "ray.data", "ray.train", "ray.tune", "mlflow", "alembic")
VALID_DETAILS = (("first_mention", "first mention"), ("reappearing", "re-appearing"),
                 ("after_entity", "after entity"), ("oov", "OOV"))


def verbose() -> bool:
    """True under ``dynlm --verbose`` (set by :func:`configure_output`, read by ``init_ray``)."""
    return os.environ.get(VERBOSE_ENV) == "1"


class _LazyFileHandler(logging.FileHandler):
    """A FileHandler that creates its file (and folder) at the first record, not before."""

    def _open(self):
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


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
    folder = Path(os.environ.get(LOG_DIR_ENV) or DEFAULT_LOG_DIR).resolve()
    path = folder / f"dynlm-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _LazyFileHandler)]:
        root.removeHandler(handler)  # main() called again in one process (tests)
    handler = _LazyFileHandler(path, delay=True, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)  # DeprecationWarnings of the libraries go to the file too
    route_library_logs()
    return path


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

    files = [h.baseFilename for h in logging.getLogger().handlers if isinstance(h, _LazyFileHandler)]
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
# Lines
# ---------------------------------------------------------------------------------------------


def _number(value: float) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.2f}"


def format_epoch_line(record: dict[str, Any], epochs: int) -> str:
    """One line of metrics for an epoch record of ``train_fn_per_worker``.

    Example: ``epoch 1/4  train loss 5.117 ppl 166.8 | valid ppl 150.2 (first mention 310.4,
    re-appearing 80.1, after entity 95.0, OOV 700.2) | 1,234 tok/s, 25.6 s``.
    """
    details = ", ".join(f"{label} {_number(record[f'valid_ppl_{key}'])}" for key, label in VALID_DETAILS
                        if f"valid_ppl_{key}" in record)
    line = (f"epoch {record['epoch']}/{epochs}  train loss {record['train_loss']:.3f} "
            f"ppl {_number(record['train_ppl'])} | valid ppl {_number(record['valid_ppl'])}"
            + (f" ({details})" if details else "")
            + f" | {record['train_tokens_per_s']:,.0f} tok/s, {record['train_seconds']:.1f} s")
    if record.get("stopped_early"):
        line += "  (early stop)"
    return line


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
        """After an optimizer step; ``totals``: this rank's running sums (``steps``, ``tokens``, ``nll_sum``)."""
        now = time.perf_counter()
        if self.relay is None or now - self.last_sent < STEP_EVENT_SECONDS:
            return
        self.last_sent = now
        tokens = totals["tokens"]
        loss = totals["nll_sum"] / tokens if tokens else float("nan")
        rate = tokens * self.world_size / max(now - self.started, 1e-9)
        self._send(("step", self.epoch, int(totals["steps"]), loss, rate))

    def end_epoch(self, record: dict) -> None:
        self._send(("epoch", {k: v for k, v in record.items() if isinstance(v, (int, float))}), wait=True)

    def note(self, text: str) -> None:
        """A line for the terminal (without a relay: printed to this worker's log)."""
        if self.relay is None:
            print(text, flush=True)
        self._send(("note", text), wait=True)


class TrainingConsole:
    """The driver's side: a relay actor, and a thread drawing its events on ``stream``.

    Use as a context manager around ``TorchTrainer.fit()``; :attr:`relay_name` goes to rank 0.

    Args:
        epochs: ``train.epochs`` (for "epoch 2/4").
        steps_per_epoch: expected optimizer steps of an epoch (the bar's length; an estimate).
        stream: where to draw (default stderr, like Ray Data's bars).
    """

    def __init__(self, epochs: int, steps_per_epoch: int, stream: TextIO | None = None):
        self.epochs, self.steps_per_epoch = epochs, max(1, steps_per_epoch)
        self.stream = stream if stream is not None else sys.stderr
        self.relay_name = f"dynlm-progress-{uuid.uuid4().hex[:12]}"
        self.relay = None
        self.bar = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> TrainingConsole:
        import ray

        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # on the driver's node: a worker node that dies (and is replaced) must not take it along
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.relay = ray.remote(num_cpus=0)(ProgressRelay).options(
            name=self.relay_name, namespace=RELAY_NAMESPACE, scheduling_strategy=here).remote()
        ray.get(self.relay.drain.remote())  # started before rank 0 looks it up
        self._thread = threading.Thread(target=self._poll, name="dynlm-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        import ray

        self._stop.set()
        self._thread.join()
        try:
            self._show(ray.get(self.relay.drain.remote()))  # what arrived after the last poll
            ray.kill(self.relay)
        except ray.exceptions.RayActorError:  # never fail a training over its progress display
            pass
        self._close_bar()

    def _poll(self) -> None:
        import ray

        while not self._stop.wait(POLL_SECONDS):
            try:
                self._show(ray.get(self.relay.drain.remote()))
            except ray.exceptions.RayActorError:
                return

    def _show(self, events: list[tuple]) -> None:
        for kind, *payload in events:
            if kind == "step":
                self._step(*payload)
            elif kind == "epoch":
                self._close_bar()
                print(format_epoch_line(payload[0], self.epochs), file=self.stream, flush=True)
            else:
                self._close_bar()
                print(payload[0], file=self.stream, flush=True)

    def _step(self, epoch: int, steps: int, loss: float, tokens_per_s: float) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=self.steps_per_epoch, desc=f"epoch {epoch}/{self.epochs}", file=self.stream,
                            bar_format="{desc} {bar} {n}/{total} steps [{elapsed}<{remaining}{postfix}]",
                            leave=False, dynamic_ncols=True, disable=None)  # disable=None: only on a terminal
        self.bar.n = min(steps, self.steps_per_epoch)
        self.bar.set_postfix_str(f"loss {loss:.3f}, {tokens_per_s:,.0f} tok/s", refresh=True)

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
