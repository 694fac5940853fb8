"""MLflow tracking and model registry for dynlm: one run per training, champion/challenger aliases.

Where things go::

    tracking URI   --tracking-uri  >  $MLFLOW_TRACKING_URI  >  sqlite:///<cwd>/mlflow.db
    artifacts      $DYNLM_MLFLOW_ARTIFACTS  >  <folder of the SQLite file>/mlartifacts
                   (a server URI, http://..., keeps the server's own artifact store)

One training = one MLflow run, created on the driver (:func:`start_training_run`), fed per epoch
by rank 0 only (:func:`log_epoch_metrics`), closed on the driver (:func:`finish_training_run`,
which logs the learning curve and the pyfunc model). :func:`register_and_promote` then registers
the model as a version of ``dynlm-<model_type>`` with alias ``challenger`` and moves ``champion``
to it under the one promotion policy (``dynlm/promotion.py``): a relative margin, on the same
validation set (version tag ``valid_data_hash``). Stages are deprecated in MLflow 3; only aliases are used.

Runs are found by their tags (:func:`find_runs`: ``dynlm.kind``, ``dynlm.trial_id``, ...), never
by their names. Every ``mlflow`` call of dynlm goes through this module (the pyfunc model file
``pipelines/pyfunc_model.py`` excepted: it is loaded by MLflow on its own).

Ray workers do not see environment variables set in the driver after Ray started, so pass the
URI returned by :func:`tracking_uri` to the workers and on to :func:`log_epoch_metrics`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
import yaml
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from dynlm import checkpoint_folder, figures, promotion, serving, storage
from dynlm.config import ConfigError, flatten_config, seconds_from_env
from dynlm.data.prepared import PreparedData
from dynlm.tasks import DEFAULT_TASK, get_task
from pipelines import console

logger = logging.getLogger(__name__)

CHAMPION = "champion"
CHALLENGER = "challenger"
MODEL_ARTIFACT_NAME = "model"
# Run tags (and, for the data identities, model version tags too)
TAG_MODEL_URI = "dynlm.model_uri"  # the logged pyfunc model of the run
TAG_KIND = "dynlm.kind"  # what a run is: KIND_TRAINING | "tune" | "retrain"
TAG_TRIAL_ID = "dynlm.trial_id"  # the Tune trial a training run belongs to
TAG_DATA_HASH = "data_hash"  # DataConfig.data_hash() of the data the model TRAINED on
TAG_VALID_DATA_HASH = "valid_data_hash"  # identity of the validation set valid_ppl was measured on
TAG_VALID_OBJECTIVE = "valid_objective"  # version tag: the task's primary metric on that validation set
TAG_OBJECTIVE_METRIC = "objective_metric"  # version tag: which metric that is ("ppl", "f1_error", ...)
LEGACY_TAG_VALID_PPL = "valid_ppl"  # versions registered before the objective was task-named (metric "ppl")
KIND_TRAINING = "training"


# ---------------------------------------------------------------------------------------------
# Where: tracking URI, artifact location, experiment
# ---------------------------------------------------------------------------------------------


def tracking_uri(explicit: str | None = None) -> str:
    """The tracking URI: ``explicit`` > ``$MLFLOW_TRACKING_URI`` > ``sqlite:///<cwd>/mlflow.db``.

    Relative SQLite paths are made absolute, so Ray workers (other working directories) reach
    the same database.
    """
    uri = explicit or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = f"sqlite:///{Path(uri[len('sqlite:///'):]).resolve()}"
    elif not storage.is_uri(uri):
        raise ConfigError(
            f"tracking URI {uri!r} is a bare path: MLflow's file store is deprecated; "
            f"use sqlite:///{Path(uri).resolve() / 'mlflow.db'} or an http(s):// server"
        )
    return uri


def _uri(explicit: str | None) -> str:
    """:func:`tracking_uri` for functions whose ``tracking_uri`` argument hides it."""
    return tracking_uri(explicit)


def artifact_root(uri: str) -> str | None:
    """Artifact location for new experiments: ``$DYNLM_MLFLOW_ARTIFACTS``, else next to the
    SQLite file (``<db folder>/mlartifacts``); None for servers (they choose)."""
    override = os.environ.get("DYNLM_MLFLOW_ARTIFACTS")
    if override:
        return override if storage.is_uri(override) else Path(storage.absolute(override)).as_uri()
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
    return None


TRACKING_TIMEOUT_ENV = "DYNLM_TRACKING_TIMEOUT_S"
DEFAULT_TRACKING_TIMEOUT_S = 5.0
_RETRY_PAUSE_S = 0.5


class TrackingServerUnreachable(ConnectionError):
    """The tracking server of an ``http(s)://`` URI does not answer (a user error: exit 2)."""


def tracking_timeout_s() -> float:
    """How long :func:`check_reachable` tries a server: ``$DYNLM_TRACKING_TIMEOUT_S``, default 5 s."""
    return seconds_from_env(TRACKING_TIMEOUT_ENV, DEFAULT_TRACKING_TIMEOUT_S)


def check_reachable(explicit: str | None = None) -> str:
    """Fail fast, before Ray starts, when the tracking server of an ``http(s)://`` URI is down.

    MLflow's own client retries a dead server for minutes; this asks the server's ``/health``
    once per half second for :func:`tracking_timeout_s` seconds instead. Any HTTP answer (a
    proxy's 401 or 404 too) counts as reachable; other URIs (SQLite files) are not checked.

    Returns:
        the URI (:func:`tracking_uri`).

    Raises:
        TrackingServerUnreachable: ``MLflow tracking server <uri> is not reachable (<why>)``.
    """
    uri = tracking_uri(explicit)
    if not uri.startswith(("http://", "https://")):
        return uri
    budget = tracking_timeout_s()
    deadline = time.monotonic() + budget
    while True:
        try:
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=max(deadline - time.monotonic(), 0.1)).close()
            return uri
        except urllib.error.HTTPError:
            return uri  # the server (or its proxy) answered
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
        if time.monotonic() + _RETRY_PAUSE_S >= deadline:
            raise TrackingServerUnreachable(
                f"MLflow tracking server {uri} is not reachable ({reason}; tried for {budget:g} s, "
                f"${TRACKING_TIMEOUT_ENV}): start it, or give a running one with --tracking-uri "
                "or $MLFLOW_TRACKING_URI")
        time.sleep(_RETRY_PAUSE_S)


def configure(explicit: str | None = None) -> str:
    """Point the ``mlflow`` module (tracking + registry) at :func:`tracking_uri`; return it."""
    uri = tracking_uri(explicit)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return uri


def _client(uri: str | None = None) -> MlflowClient:
    """An MlflowClient on :func:`tracking_uri` (tracking and registry); private: callers use the
    functions of this module."""
    uri = tracking_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def ensure_experiment(name: str, uri: str | None = None) -> str:
    """Experiment id of ``name``, created with the local artifact root when missing."""
    uri = tracking_uri(uri)
    mlflow_client = _client(uri)
    experiment = mlflow_client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return mlflow_client.create_experiment(name, artifact_location=artifact_root(uri))
    except MlflowException:  # created concurrently by another process
        return mlflow_client.get_experiment_by_name(name).experiment_id


def start_run(experiment: str, *, run_name: str, tags: dict[str, str], params: dict[str, Any] | None = None,
              texts: dict[str, str] | None = None, tracking_uri: str | None = None) -> str:
    """Create a RUNNING run in ``experiment`` (created when missing) and return its id.

    Args:
        experiment: MLflow experiment name.
        run_name: shown in the UI (runs are found by ``tags``, never by this name).
        tags: run tags (``dynlm.kind``, ``mlflow.parentRunId``, ...).
        params: logged with ``log_batch`` (MLflow splits them into batches it accepts).
        texts: ``{artifact path: text}`` logged with ``log_text``.
        tracking_uri: None: :func:`tracking_uri`.
    """
    uri = _uri(tracking_uri)
    mlflow_client = _client(uri)
    run_id = mlflow_client.create_run(ensure_experiment(experiment, uri), run_name=run_name,
                                      tags=tags).info.run_id
    if params:
        mlflow_client.log_batch(run_id, params=[Param(k, str(v)) for k, v in sorted(params.items())])
    for path, text in (texts or {}).items():
        mlflow_client.log_text(run_id, text, path)
    return run_id


def set_tags(run_id: str, tags: dict[str, Any], *, tracking_uri: str | None = None) -> None:
    """Set run tags in one call (values become strings)."""
    _client(tracking_uri).log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def log_metrics(run_id: str, metrics: dict[str, Any], *, step: int = 0, tracking_uri: str | None = None) -> None:
    """Log the numeric values of ``metrics`` at ``step`` in one call (NaN/inf included; strings
    such as checkpoint paths and booleans are not metrics and are skipped)."""
    timestamp = int(time.time() * 1000)
    batch = [Metric(key, float(value), timestamp, int(step)) for key, value in sorted(metrics.items())
             if isinstance(value, (int, float)) and not isinstance(value, bool)]
    if batch:
        _client(tracking_uri).log_batch(run_id, metrics=batch)


def log_text(run_id: str, text: str, path: str, *, tracking_uri: str | None = None) -> None:
    """Log ``text`` as the artifact ``path`` (CSV, JSON, YAML ...), no temporary file."""
    _client(tracking_uri).log_text(run_id, text, path)


# matplotlib is not thread-safe: two runs finishing at once in one process (two retrains in
# threads) broke its mathtext parser while both drew log-scale tick labels. Figures are built
# and rendered under this lock (re-entrant: log_figure takes it inside a drawing block too).
FIGURE_LOCK = threading.RLock()


def log_figure(run_id: str, figure, path: str, *, tracking_uri: str | None = None) -> None:
    """Log a Matplotlib figure as the artifact ``path`` (``*.png``) and close it."""
    with FIGURE_LOCK:
        try:
            _client(tracking_uri).log_figure(run_id, figure, path)
        finally:
            figures.pyplot().close(figure)


def end_run(run_id: str, status: str = "FINISHED", *, tags: dict[str, Any] | None = None,
            tracking_uri: str | None = None) -> None:
    """Set ``tags`` (if any), then close the run with ``status`` (FINISHED | FAILED | KILLED)."""
    if tags:
        set_tags(run_id, tags, tracking_uri=tracking_uri)
    _client(tracking_uri).set_terminated(run_id, status)


def get_run(run_id: str, *, tracking_uri: str | None = None):
    """The MLflow ``Run`` (``run.info.status``, ``run.data.tags``, ``run.data.metrics``)."""
    return _client(tracking_uri).get_run(run_id)


def find_runs(experiment_id: str, tags: dict[str, str], *, status: str | None = None,
              tracking_uri: str | None = None) -> list:
    """The runs of ``experiment_id`` whose tags have exactly these values, oldest first.

    Args:
        experiment_id: e.g. ``get_run(parent).info.experiment_id``.
        tags: ``{"mlflow.parentRunId": parent, "dynlm.trial_id": trial_id}``; values must not
            contain a single quote (ids and hashes never do).
        status: only runs with this status (``FINISHED`` ...).
    """
    clauses = []
    for key, value in tags.items():
        if "'" in str(value) or "`" in key:
            raise ValueError(f"find_runs: tag {key!r}={value!r} cannot be searched for")
        clauses.append(f"tags.`{key}` = '{value}'")
    if status is not None:
        clauses.append(f"attributes.status = '{status}'")
    return list(_client(tracking_uri).search_runs([experiment_id], " and ".join(clauses), max_results=10000,
                                                 order_by=["attributes.start_time ASC"]))


def read_run_text(run_id: str, path: str, *, tracking_uri: str | None = None) -> str:
    """The text of the artifact ``path`` of run ``run_id`` (e.g. ``config.yaml``)."""
    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path, dst_path=tmp,
                                                    tracking_uri=_uri(tracking_uri))
        return Path(local).read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# One run per training
# ---------------------------------------------------------------------------------------------


def start_training_run(job, prepared: PreparedData, *, parent_run_id: str | None = None,
                       run_name: str | None = None, tags: dict[str, str] | None = None) -> str:
    """Create the MLflow run of one training on the driver and return its id.

    Logs the whole job config as flattened params and as ``config.yaml``, the prepared data's
    ``preprocessor.json`` and ``manifest.json``, and the tags ``data_hash`` (the training data),
    ``valid_data_hash`` (its validation split), ``model_type``, ``training_hash``,
    ``dynlm.kind=training`` (and ``mlflow.parentRunId`` for Tune trials). The run stays RUNNING
    until :func:`finish_training_run`.

    Args:
        job: a :class:`dynlm.job.JobConfig`.
        prepared: the prepared data the job trains on.
        parent_run_id: the Tune parent run, for nested runs.
        run_name: MLflow run name (default: ``job.run.name`` or ``<model type>-<time>``).
        tags: more run tags (``dynlm.trial_id`` of a Tune trial).
    """
    texts = {"config.yaml": yaml.safe_dump(job.to_dict(), sort_keys=False)}
    for name in ("preprocessor.json", "manifest.json"):  # read through the filesystem: root may be a URI
        try:
            texts[f"data/{name}"] = prepared.read_bytes(name).decode("utf-8")
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{prepared.root}/{name} is missing: is {prepared.root} a complete "
                                    "prepared folder?") from exc
    run_tags = {
        TAG_KIND: KIND_TRAINING,
        TAG_DATA_HASH: job.data.data_hash(),
        TAG_VALID_DATA_HASH: promotion.valid_data_hash(prepared),
        "model_type": job.model_type,
        "training_hash": job.training_hash(),
        "dynlm.prepared_root": str(prepared.root),
        **(tags or {}),
    }
    if parent_run_id:
        run_tags["mlflow.parentRunId"] = parent_run_id
    run_id = start_run(job.run.experiment, tags=run_tags, params=flatten_config(job.to_dict()), texts=texts,
                       run_name=run_name or job.run.name or f"{job.model_type}-{time.strftime('%Y%m%d-%H%M%S')}",
                       tracking_uri=job.run.tracking_uri)
    log_prepared_datasets(run_id, prepared, tracking_uri=job.run.tracking_uri)
    return run_id


#: MLflow's dataset context of each split a training reads.
SPLIT_CONTEXTS = {"train": "training", "valid": "validation", "test": "test"}


def log_prepared_datasets(run_id: str, prepared: PreparedData, *, tracking_uri: str | None = None) -> None:
    """Log the prepared folder's splits as the run's MLflow datasets (``mlflow.data``, the run's
    "Datasets used" in the UI): one per split, named ``<folder>:<split>``, its source the folder
    (local path or URI), its digest a hash of the folder's content key, the split and its files
    (the folder is content-addressed: same digest, same data), its context ``training`` /
    ``validation`` / ``test``."""
    import hashlib

    from mlflow.entities import Dataset, DatasetInput, InputTag

    from dynlm.storage import is_uri

    root = str(prepared.root).rstrip("/")
    # what MLflow's own artifact dataset sources write: {"uri": ...}, typed by the scheme
    source_type = root.split("://", 1)[0] if is_uri(root) else "local"
    key = str(prepared.manifest.get("config_hash", ""))
    inputs = []
    for split, context in SPLIT_CONTEXTS.items():
        files = sorted(str(f).rsplit("/", 1)[-1] for f in prepared.files(split))
        if not files:
            continue
        digest = hashlib.sha256(json.dumps([key, split, files]).encode()).hexdigest()[:16]
        dataset = Dataset(name=f"{root.rsplit('/', 1)[-1]}:{split}", digest=digest, source_type=source_type,
                          source=json.dumps({"uri": root}))
        inputs.append(DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)]))
    if not inputs:
        return
    # MLflow's stores look the dataset up, then insert it: two runs logging the same new dataset
    # at once (concurrent retrains of one folder) both miss it, and the second insert breaks the
    # (experiment, name, digest) unique key. The store rolls that call back whole; the retry finds
    # the row the other run wrote.
    for attempt in range(_DATASET_RACE_RETRIES + 1):
        try:
            _client(tracking_uri).log_inputs(run_id, datasets=inputs)
            return
        except MlflowException as exc:
            if attempt == _DATASET_RACE_RETRIES or not _is_unique_violation(exc):
                raise
            time.sleep(0.05 * (attempt + 1))


#: how often :func:`log_prepared_datasets` retries a lost insert race before it gives up
_DATASET_RACE_RETRIES = 3


def _is_unique_violation(exc: BaseException) -> bool:
    """A unique-key violation as SQLite, PostgreSQL and MySQL word it (through MLflow's stores or
    its server's error message)."""
    text = str(exc).lower()
    return "unique constraint" in text or "duplicate key" in text or "duplicate entry" in text


def start_system_metrics(run_id: str, interval_s: float, *, tracking_uri: str | None = None) -> "SystemMetrics":
    """Start MLflow's system-metrics monitor on the run: CPU, memory, disk, network, and GPUs when
    ``nvidia-ml-py`` is installed, as ``system/...`` metrics every ``interval_s`` seconds, from a
    thread of this process. Returns at once (stop with :meth:`SystemMetrics.stop`)."""
    return SystemMetrics(run_id, interval_s, tracking_uri or _uri(None))


#: how long :meth:`SystemMetrics.stop` waits for the monitor's last write
SYSTEM_METRICS_STOP_S = 5.0


class SystemMetrics:
    """MLflow's ``SystemMetricsMonitor``, never blocking the training.

    The monitor talks to the tracking server when it is built (``resume_logging``: a restarted
    attempt or ``--resume`` goes on after the steps already logged) and after every sample, and
    MLflow's ``finish()`` joins its thread. With a server that stopped answering each call retries
    for minutes, so here the monitor is built and started in a daemon thread, and :meth:`stop`
    waits a bounded time; the samples not yet written are then lost, the run is not. A machine
    that cannot sample (psutil missing) logs one warning and trains on.
    """

    def __init__(self, run_id: str, interval_s: float, tracking_uri: str):
        self._lock = threading.Lock()
        self._stopped = False
        self._monitor = None
        threading.Thread(target=self._start, args=(run_id, interval_s, tracking_uri),
                         name="dynlm-system-metrics-start", daemon=True).start()

    def _start(self, run_id: str, interval_s: float, tracking_uri: str) -> None:
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, resume_logging=True,
                                           tracking_uri=tracking_uri)
        except Exception as exc:  # noqa: BLE001 - system metrics are a nicety; the training is not
            logger.warning("no system metrics for run %s: %s", run_id, exc)
            return
        with self._lock:
            if not self._stopped:
                monitor.start()
                self._monitor = monitor

    def stop(self, timeout_s: float = SYSTEM_METRICS_STOP_S) -> None:
        """Stop sampling; write what was sampled if the server answers within ``timeout_s``."""
        with self._lock:
            self._stopped, monitor = True, self._monitor
        if monitor is None:
            return
        done = threading.Event()

        def finish() -> None:
            try:
                monitor.finish()
            finally:
                done.set()

        threading.Thread(target=finish, name="dynlm-system-metrics-stop", daemon=True).start()
        if not done.wait(timeout_s):
            logger.warning("the system-metrics monitor did not stop within %.0f s (tracking server unreachable?); "
                           "its last samples are not logged", timeout_s)


#: the system metrics ``dynlm train`` summarizes at the end (MLflow's names)
SYSTEM_SUMMARY = {"CPU": "system/cpu_utilization_percentage", "memory": "system/system_memory_usage_percentage"}


def system_metrics_summary(run_id: str, *, tracking_uri: str | None = None) -> str | None:
    """``"mean CPU 71 %, memory 12 %, GPU 0 43 %"`` over the run's system metrics, or None when
    it has none."""
    run = _client(tracking_uri).get_run(run_id)
    names = dict(SYSTEM_SUMMARY)
    names.update({f"GPU {key.split('_')[1]}": key for key in sorted(run.data.metrics)
                  if key.startswith("system/gpu_") and key.endswith("_utilization_percentage")})
    parts = []
    for label, key in names.items():
        if key not in run.data.metrics:
            continue
        values = [m.value for m in _client(tracking_uri).get_metric_history(run_id, key)]
        if values:
            parts.append(f"{label} {sum(values) / len(values):.0f} %")
    return f"mean {', '.join(parts)}" if parts else None


def log_epoch_metrics(run_id: str, epoch: int, metrics: dict[str, Any], *,
                      tracking_uri: str | None = None) -> None:
    """Log one epoch's metrics (step = epoch). Call from rank 0 only.

    Args:
        run_id: from :func:`start_training_run`.
        epoch: the step of every metric.
        metrics: ``{"train_ppl": 95.1, "valid_ppl_first_mention": 240.3, ...}``. Numeric values
            are logged (non-finite ones too, MLflow stores NaN/inf); strings such as checkpoint
            paths are not metrics and are not logged.
        tracking_uri: the URI resolved on the driver (Ray workers do not see the driver's
            environment); None: resolved here.
    """
    log_metrics(run_id, metrics, step=epoch, tracking_uri=tracking_uri)


def finish_training_run(run_id: str, checkpoint_dir: str | Path, prepared: PreparedData,
                        history: list[dict[str, Any]], *, tracking_uri: str | None = None,
                        status: str = "FINISHED") -> str:
    """Close a training run: learning curve, final metrics, the pyfunc model. Returns the model URI.

    Args:
        run_id: from :func:`start_training_run`.
        checkpoint_dir: the best checkpoint (a folder holding one dynlm checkpoint ``*.pt``, or
            the file itself).
        prepared: the prepared data (its ``preprocessor.json`` goes into the model).
        history: one metrics dict per epoch, as logged with :func:`log_epoch_metrics`.
        tracking_uri: the run's tracking URI (None: :func:`tracking_uri`).
        status: final run status.

    Returns:
        ``models:/<model id>``, also stored as the run tag ``dynlm.model_uri``.
    """
    from dynlm import checkpoint

    uri = _uri(tracking_uri)
    with FIGURE_LOCK:  # drawn and rendered by one thread at a time
        if history:
            run = _client(uri).get_run(run_id)
            title = f"run {run.info.run_name} ({run_id[:8]}), model {run.data.tags.get('model_type', '?')}"
            log_figure(run_id, figures.plot_learning_curve(history, title), "learning_curve.png", tracking_uri=uri)
        for name, figure in figures.best_epoch_figures(history, prepared.manifest["task"]).items():
            log_figure(run_id, figure, name, tracking_uri=uri)
    log_text(run_id, json.dumps(history, indent=1, default=str), "history.json", tracking_uri=uri)
    valid = [row["valid_objective"] for row in history if "valid_objective" in row]
    final = {"epochs_completed": len(history)}
    if valid:
        final["best_valid_objective"] = min(valid)
    log_metrics(run_id, final, step=len(history), tracking_uri=uri)

    loaded = checkpoint.load_checkpoint(checkpoint_folder.find_checkpoint_file(checkpoint_dir))
    with tempfile.TemporaryDirectory() as tmp:  # a local copy: the prepared root may be a URI
        preprocessor_path = Path(tmp) / "preprocessor.json"
        preprocessor_path.write_bytes(prepared.read_bytes(prepared.manifest["preprocessor"]))
        model_uri = log_pyfunc_model(run_id, loaded.model, loaded.model_cfg, loaded.spec, preprocessor_path,
                                     task=prepared.manifest["task"], tracking_uri=uri)
    end_run(run_id, status, tags={TAG_MODEL_URI: model_uri}, tracking_uri=uri)
    return model_uri


def _pyfunc_kwargs(artifacts: dict[str, str], task: str) -> dict[str, Any]:
    """Arguments shared by save/log: models-from-code file, artifacts, signature, example, env
    (the signature and input example are the task's: ``Task.serving_inputs`` ... ``serving_example``)."""
    import importlib.metadata

    import dynlm
    from pipelines import pyfunc_model

    def pinned(dist: str) -> str:  # the public version: "2.13.0+cpu" -> "2.13.0" (an index serves no local label)
        return f"{dist}=={importlib.metadata.version(dist).split('+')[0]}"

    def from_minor(dist: str) -> str:  # "2.13.0+cpu" -> ">=2.13,<3": the host's own build (CUDA, CPU) of a
        major, minor = importlib.metadata.version(dist).split("+")[0].split(".")[:2]  # release that loads it
        return f"{dist}>={major}.{minor},<{int(major) + 1}"

    return {
        "python_model": str(Path(pyfunc_model.__file__).resolve()),
        "artifacts": artifacts,
        # dynlm's source goes with the model, so a served model runs the code it was trained with.
        "code_paths": [str(Path(dynlm.__file__).resolve().parent)],
        "signature": pyfunc_model.signature_for(get_task(task)),
        "input_example": pyfunc_model.input_example_for(get_task(task)),
        # Listed, not inferred: inference would load the model in a subprocess (slow).
        # torch as a range: a state_dict of torch 2.x loads in later 2.x releases, and a GPU host
        # keeps the CUDA build it has; the rest pinned to what the model was saved with.
        "pip_requirements": [pinned("mlflow"), from_minor("torch"), pinned("tokenizers"),
                             pinned("pyarrow"), pinned("numpy"), pinned("pandas"), pinned("pyyaml")],
    }


def save_pyfunc_model(path: str | Path, model, model_cfg, spec, preprocessor_path: str | Path, *,
                      task: str = DEFAULT_TASK) -> Path:
    """Save the pyfunc model to a local folder (no tracking server); ``mlflow.pyfunc.load_model(path)``."""
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = serving.write_artifacts(tmp, model, model_cfg, spec, preprocessor_path, task=task)
        mlflow.pyfunc.save_model(str(path), **_pyfunc_kwargs(artifacts, task))
    return Path(path)


def log_pyfunc_model(run_id: str, model, model_cfg, spec, preprocessor_path: str | Path, *,
                     task: str = DEFAULT_TASK, tracking_uri: str | None = None) -> str:
    """Log the pyfunc model of ``task`` (name ``model``) in run ``run_id``; return ``models:/<model id>``."""
    configure(tracking_uri)
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = serving.write_artifacts(tmp, model, model_cfg, spec, preprocessor_path, task=task)
        with mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None):
            info = mlflow.pyfunc.log_model(name=MODEL_ARTIFACT_NAME, **_pyfunc_kwargs(artifacts, task))
    return info.model_uri


# ---------------------------------------------------------------------------------------------
# Registry: challenger / champion
# ---------------------------------------------------------------------------------------------


@contextmanager
def promotion_lock(uri: str, name: str):
    """One promotion of ``name`` at a time: a file lock next to a SQLite store (every process
    and thread of this machine). A tracking server has no shared file; the re-read of
    ``champion`` under this lock (:func:`register_and_promote`) is then the only guard."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    with storage.lock(Path(uri[len("sqlite:///"):]).with_name(f"{name}.promotion")):
        yield


def register_and_promote(run_id: str, valid_objective: float, *, margin: float = 0.0, metric: str = "ppl",
                         valid_data_hash: str | None = None, champion: promotion.MeasuredChampion | None = None,
                         tags: dict[str, str] | None = None, before_promote: Callable[[], None] | None = None,
                         tracking_uri: str | None = None) -> promotion.RegistrationResult:
    """Register the run's model as ``dynlm-<model_type>@challenger``; maybe move ``champion``.

    The one registration path of train, tune and retrain. The decision is
    ``dynlm.promotion.decide_registration`` (relative ``margin``, same validation set), taken
    under :func:`promotion_lock` against the champion read there, and the alias move is the
    last registry write, so concurrent callers promote at most once per champion they beat:

    * ``champion=None``: the champion's own version tags ``valid_objective`` / ``valid_data_hash``
      are compared (train and tune: models validated on their prepared data's valid split); a
      champion scored by another ``objective_metric`` counts as validated elsewhere;
    * ``champion=MeasuredChampion(v, ppl)`` (``dynlm.promotion``): the caller scored version
      ``v`` on the challenger's validation set; if ``champion`` no longer points at ``v``
      (another caller promoted meanwhile) the decision is ``conflict`` and nothing moves (retrain).

    The new version gets the tags ``valid_objective``, ``objective_metric``, ``valid_data_hash``, ``data_hash`` (the
    training data, from the run), ``run_id``, ``promotion`` (the reason) and ``tags``.

    Args:
        run_id: a run closed by :func:`finish_training_run` (tags ``dynlm.model_uri``,
            ``model_type``, ``data_hash``, ``valid_data_hash``).
        valid_objective: the task's primary metric of the registered weights on validation data
            (lower is better: the LM's perplexity, the naming task's 1 - F1).
        metric: that metric's name (the task's ``primary_metric``).
        margin: relative margin in ``[0, 1)`` (``run.promotion_margin``, retrain's ``margin``).
        valid_data_hash: the validation set ``valid_objective`` was measured on; None: the run's
            ``valid_data_hash`` tag (its prepared data's valid split).
        champion: see above.
        tags: more version tags.
        before_promote: called under the lock right before the alias moves (fault injection).
        tracking_uri: None: :func:`tracking_uri`.
    """
    uri = _uri(tracking_uri)
    mlflow_client = _client(uri)
    run_tags = get_run(run_id, tracking_uri=uri).data.tags
    if TAG_MODEL_URI not in run_tags:
        raise ValueError(f"run {run_id} has no logged model (tag {TAG_MODEL_URI}); "
                         "call finish_training_run first")
    valid_hash = valid_data_hash or run_tags[TAG_VALID_DATA_HASH]
    name = promotion.registered_name(run_tags["model_type"])
    configure(uri)
    console.route_library_logs()  # mute "Successfully registered ..." (log_model turns MLflow's prints back on)
    version = str(mlflow.register_model(run_tags[TAG_MODEL_URI], name, tags={
        TAG_VALID_OBJECTIVE: repr(float(valid_objective)), TAG_OBJECTIVE_METRIC: metric, TAG_VALID_DATA_HASH: valid_hash,
        TAG_DATA_HASH: run_tags[TAG_DATA_HASH], "run_id": run_id, **(tags or {})}).version)
    mlflow_client.set_registered_model_alias(name, CHALLENGER, version)
    with promotion_lock(uri, name):
        current = version_by_alias(name, CHAMPION, tracking_uri=uri)
        current_version = None if current is None else str(current.version)
        current_tags = {} if current is None else current.tags
        current_metric = current_tags.get(TAG_OBJECTIVE_METRIC, "ppl")
        current_hash = current_tags.get(TAG_VALID_DATA_HASH)
        if current_metric != metric:  # another task's number: as if validated on another set
            current_hash = f"{current_hash} (scored by {current_metric})"
        decision, reason = promotion.decide_registration(
            version, valid_objective, valid_hash, margin, champion=champion, current_version=current_version,
            current_ppl=float(current_tags.get(TAG_VALID_OBJECTIVE, current_tags.get(LEGACY_TAG_VALID_PPL, "nan"))),
            current_hash=current_hash, metric=metric)
        if decision == "promoted":
            if before_promote is not None:
                before_promote()
            mlflow_client.set_registered_model_alias(name, CHAMPION, version)  # the last step
            current_version = version
    mlflow_client.set_model_version_tag(name, version, "promotion", reason)
    set_tags(run_id, {"registered_version": f"{name}/{version}"}, tracking_uri=uri)
    return promotion.RegistrationResult(name=name, version=version, decision=decision, reason=reason,
                                        champion_version=current_version)


def version_by_alias(name: str, alias: str, *, tracking_uri: str | None = None):
    """The ModelVersion that ``name@alias`` points at, or None when the model or the alias is absent."""
    mlflow_client = _client(tracking_uri)
    try:
        model = mlflow_client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    version = model.aliases.get(alias)
    return None if version is None else mlflow_client.get_model_version(name, str(version))


def load_model(uri: str, *, tracking_uri: str | None = None):
    """Load a logged or registered dynlm model, e.g. ``models:/dynlm-dntm@champion``.

    Returns:
        ``(task, model, model_cfg, spec, preprocessor)``: the model's task, the torch model in
        eval mode with the registered weights, its config, spec and saved preprocessor.
    """
    configure(tracking_uri)
    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp)
        return serving.load_model_dir(local)


def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats as None, for JSON (which has no NaN or infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


EVALUATE_EXPERIMENT = "dynlm-evaluate"
TAG_EVALUATION_RUN = "evaluation_run_id"  # on a registered version: its latest evaluation run


def log_evaluation(model_uri: str, *, task: str, data: str, metrics: dict[str, Any], table: str,
                   extra: dict[str, Any] | None = None, tracking_uri: str | None = None) -> str:
    """Record one evaluation of a logged or registered model: a FINISHED run in experiment
    ``dynlm-evaluate`` with the metrics, the printed table (``evaluation.txt``) and every number
    (``evaluation.json``), tagged with the model URI, the data it scored and, for a registered
    model, its name, version and training run; the version gets the tag ``evaluation_run_id``.

    Args:
        model_uri: ``models:/<name>@<alias>``, ``models:/<name>/<version>`` or ``runs:/<id>/...``.
        task: the model's task name. data: what was scored (a prepared folder and split, files).
        metrics: the task's evaluation dict. table: the text ``dynlm evaluate`` printed.
        extra: more results to keep in ``evaluation.json`` (dynamic evaluation's settings and metrics).

    Returns:
        The evaluation run's id.
    """
    uri = _uri(tracking_uri)
    mlflow_client = _client(uri)
    tags = {"dynlm.kind": "evaluate", "model_uri": model_uri, "task": task, "data": data}
    version = None
    if model_uri.startswith("models:/"):
        reference = model_uri[len("models:/"):]
        name, _, alias = reference.partition("@")
        if alias:
            version = mlflow_client.get_model_version_by_alias(name, alias)
        elif "/" in reference and reference.rsplit("/", 1)[1].isdigit():
            name, number = reference.rsplit("/", 1)
            version = mlflow_client.get_model_version(name, number)
    elif model_uri.startswith("runs:/"):
        tags["model_run_id"] = model_uri[len("runs:/"):].split("/", 1)[0]
    if version is not None:
        tags.update({"registered_model": version.name, "model_version": str(version.version),
                     "model_run_id": version.run_id or ""})
    label = f"{tags.get('registered_model', model_uri)} v{tags['model_version']}" if version is not None else model_uri
    run_id = start_run(EVALUATE_EXPERIMENT, run_name=f"evaluate {label}", tags=tags,
                       texts={"evaluation.txt": table,
                              "evaluation.json": json.dumps(json_safe({"metrics": metrics, **(extra or {})}),
                                                            indent=1, default=str)},
                       tracking_uri=uri)
    log_metrics(run_id, metrics, tracking_uri=uri)
    end_run(run_id, "FINISHED", tracking_uri=uri)
    if version is not None:
        mlflow_client.set_model_version_tag(version.name, str(version.version), TAG_EVALUATION_RUN, run_id)
    return run_id


class TrainedButNotTracked(TrackingServerUnreachable):
    """The training finished (its checkpoints are Ray's) but the tracking server did not answer
    when its MLflow run was to be closed: nothing is lost, ``--resume`` logs and registers it."""


#: OSErrors about a local file: a bug or a missing checkpoint, never a tracking server that is down
LOCAL_FILE_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError)


def server_down_reason(exc: BaseException) -> str | None:
    """Why ``exc`` means the tracking server does not answer (one line), or None when it is
    another error (a bad request, a missing run: those are not retried)."""
    if isinstance(exc, TrackingServerUnreachable):
        return str(exc)
    if isinstance(exc, OSError) and not isinstance(exc, LOCAL_FILE_ERRORS):  # requests' ConnectionError and
        return f"{type(exc).__name__}: {exc}"  # Timeout are OSErrors; a missing local file is not the server
    if isinstance(exc, MlflowException) and ("Max retries exceeded" in str(exc) or "Connection" in str(exc)):
        return str(exc).splitlines()[0][:300]
    return None


def try_log_epoch_metrics(run_id: str, epoch: int, metrics: dict[str, Any], *,
                          tracking_uri: str | None = None) -> str | None:
    """:func:`log_epoch_metrics`, unless the tracking server does not answer.

    A server that is down must not stop the training: its check costs
    :func:`tracking_timeout_s` seconds (not MLflow's minutes of retries), the epoch's metrics
    stay in the checkpoint's history, and :func:`log_missing_epochs` logs them at the end of
    the run (or on ``--resume``).

    Returns:
        None when logged, else the one-line reason the server was not reached.
    """
    try:
        check_reachable(tracking_uri)
        log_epoch_metrics(run_id, epoch, metrics, tracking_uri=tracking_uri)
    except Exception as exc:
        reason = server_down_reason(exc)
        if reason is None:
            raise
        return reason
    return None


def log_missing_epochs(run_id: str, history: list[dict[str, Any]], *, tracking_uri: str | None = None) -> list[int]:
    """Log the epochs of ``history`` the run does not hold yet (those logged while the server
    was down); return their numbers. An epoch counts as logged when its ``valid_objective`` is."""
    logged = {m.step for m in _client(tracking_uri).get_metric_history(run_id, "valid_objective")}
    missing = [record for record in history if record["epoch"] not in logged]
    for record in missing:
        log_epoch_metrics(run_id, record["epoch"], record, tracking_uri=tracking_uri)
    return [record["epoch"] for record in missing]
