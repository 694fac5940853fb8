"""MLflow tracking and model registry for dynlm: one run per training, champion/challenger aliases.

Where things go::

    tracking URI   --tracking-uri  >  $MLFLOW_TRACKING_URI  >  sqlite:///<cwd>/mlflow.db
    artifacts      $DYNLM_MLFLOW_ARTIFACTS  >  <folder of the SQLite file>/mlartifacts
                   (a server URI, http://..., keeps the server's own artifact store)

One training = one MLflow run, created on the driver (:func:`start_training_run`), fed per epoch
by rank 0 only (:func:`log_epoch_metrics`), closed on the driver (:func:`finish_training_run`,
which logs the learning curve and the pyfunc model). :func:`register_and_promote` then registers
the model as a version of ``dynlm-<model_type>`` with alias ``challenger`` and moves ``champion``
to it only when it beats the champion's validation perplexity on the same data (same data hash).
Stages are deprecated in MLflow 3; only aliases are used.

Ray workers do not see environment variables set in the driver after Ray started, so pass the
URI returned by :func:`tracking_uri` to the workers and on to :func:`log_epoch_metrics`.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import yaml
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException

from dynlm import storage
from dynlm.data.prepared import PreparedData
from pipelines import console

MODEL_NAME_PREFIX = "dynlm-"
CHAMPION = "champion"
CHALLENGER = "challenger"
MODEL_ARTIFACT_NAME = "model"
TAG_MODEL_URI = "dynlm.model_uri"  # run tag: the logged pyfunc model of the run
_PARAM_BATCH = 100  # MLflow accepts at most 100 params per log_batch call
_PARAM_VALUE_MAX = 6000

_RUN_URIS: dict[str, str] = {}  # run_id -> tracking URI it was created on (this process)


@dataclass
class RegistrationResult:
    """What :func:`register_and_promote` did.

    Attributes:
        name: registered model name, ``dynlm-<model_type>``.
        version: the new version (alias ``challenger``).
        promoted: whether ``champion`` now points at ``version``.
        reason: one sentence saying why (also stored as the version tag ``promotion``).
        champion_version: the version ``champion`` points at after the call (None: none).
    """

    name: str
    version: str
    promoted: bool
    reason: str
    champion_version: str | None


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
        raise ValueError(
            f"tracking URI {uri!r} is a bare path: MLflow's file store is deprecated; "
            f"use sqlite:///{Path(uri).resolve() / 'mlflow.db'} or an http(s):// server"
        )
    return uri


def artifact_root(uri: str) -> str | None:
    """Artifact location for new experiments: ``$DYNLM_MLFLOW_ARTIFACTS``, else next to the
    SQLite file (``<db folder>/mlartifacts``); None for servers (they choose)."""
    override = os.environ.get("DYNLM_MLFLOW_ARTIFACTS")
    if override:
        return override if storage.is_uri(override) else Path(storage.absolute(override)).as_uri()
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
    return None


def configure(explicit: str | None = None) -> str:
    """Point the ``mlflow`` module (tracking + registry) at :func:`tracking_uri`; return it."""
    uri = tracking_uri(explicit)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return uri


def client(uri: str | None = None) -> MlflowClient:
    uri = tracking_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def ensure_experiment(name: str, uri: str | None = None) -> str:
    """Experiment id of ``name``, created with the local artifact root when missing."""
    uri = tracking_uri(uri)
    mlflow_client = client(uri)
    experiment = mlflow_client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return mlflow_client.create_experiment(name, artifact_location=artifact_root(uri))
    except MlflowException:  # created concurrently by another process
        return mlflow_client.get_experiment_by_name(name).experiment_id


def _uri_of(run_id: str, explicit: str | None) -> str:
    return tracking_uri(explicit or _RUN_URIS.get(run_id))


# ---------------------------------------------------------------------------------------------
# One run per training
# ---------------------------------------------------------------------------------------------


def flatten_config(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"model": {"dntm": {"merge_fn": "gru"}}}`` -> ``{"model.dntm.merge_fn": "gru"}``.

    Lists and None become JSON text so every value is a string MLflow accepts as a param.
    """
    flat: dict[str, str] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_config(value, prefix=f"{dotted}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            if len(text) > _PARAM_VALUE_MAX:
                raise ValueError(f"config value {dotted} is {len(text)} characters; MLflow "
                                 f"params hold at most {_PARAM_VALUE_MAX}")
            flat[dotted] = text
    return flat


def start_training_run(job, prepared: PreparedData, *, parent_run_id: str | None = None,
                       run_name: str | None = None) -> str:
    """Create the MLflow run of one training on the driver and return its id.

    Logs the whole job config as flattened params and as ``config.yaml``, the prepared data's
    ``preprocessor.json`` and ``manifest.json``, and the tags ``data_hash``, ``model_type``,
    ``training_hash`` (and ``mlflow.parentRunId`` for Tune trials). The run stays RUNNING until
    :func:`finish_training_run`.

    Args:
        job: a :class:`pipelines.config.JobConfig`.
        prepared: the prepared data the job trains on.
        parent_run_id: the Tune parent run, for nested runs.
        run_name: MLflow run name (default: ``job.run.name`` or ``<model type>-<time>``).
    """
    uri = tracking_uri(job.run.tracking_uri)
    experiment_id = ensure_experiment(job.run.experiment, uri)
    mlflow_client = client(uri)
    tags = {
        "data_hash": job.data.data_hash(),
        "model_type": job.model.type,
        "training_hash": job.training_hash(),
        "dynlm.prepared_root": str(prepared.root),
    }
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    name = run_name or job.run.name or f"{job.model.type}-{time.strftime('%Y%m%d-%H%M%S')}"
    run = mlflow_client.create_run(experiment_id, run_name=name, tags=tags)
    run_id = run.info.run_id
    _RUN_URIS[run_id] = uri

    params = [Param(k, v) for k, v in sorted(flatten_config(job.to_dict()).items())]
    for start in range(0, len(params), _PARAM_BATCH):
        mlflow_client.log_batch(run_id, params=params[start:start + _PARAM_BATCH])
    mlflow_client.log_text(run_id, yaml.safe_dump(job.to_dict(), sort_keys=False), "config.yaml")
    for name in ("preprocessor.json", "manifest.json"):  # read through the filesystem: root may be a URI
        try:
            text = prepared.read_bytes(name).decode("utf-8")
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{prepared.root}/{name} is missing: is {prepared.root} a complete "
                                    "prepared folder?") from exc
        mlflow_client.log_text(run_id, text, f"data/{name}")
    return run_id


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
    timestamp = int(time.time() * 1000)
    batch = [Metric(key, float(value), timestamp, int(epoch)) for key, value in sorted(metrics.items())
             if isinstance(value, (int, float)) and not isinstance(value, bool)]
    if batch:
        client(_uri_of(run_id, tracking_uri)).log_batch(run_id, metrics=batch)


def plot_learning_curve(history: list[dict[str, Any]], path: str | Path) -> Path:
    """Save a PNG of every perplexity in ``history`` (one dict per epoch) against the epoch.

    Left panel: ``*ppl`` keys (train/valid perplexity); right: the other ``*ppl_*`` keys
    (first mention, re-appearing, after entity, OOV). Log-scale y. Matplotlib's Agg backend.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not history:
        raise ValueError("plot_learning_curve: empty history (no epoch finished)")
    epochs = [row["epoch"] if "epoch" in row else i for i, row in enumerate(history)]
    keys = sorted({k for row in history for k, v in row.items()
                   if "ppl" in k and isinstance(v, (int, float)) and not isinstance(v, bool)})
    overall = [k for k in keys if k.endswith("ppl")]
    detailed = [k for k in keys if not k.endswith("ppl")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for axis, group, title in ((axes[0], overall, "perplexity"), (axes[1], detailed, "by token kind")):
        for key in group:
            points = [(e, row[key]) for e, row in zip(epochs, history)
                      if key in row and math.isfinite(row[key]) and row[key] > 0]
            if points:
                axis.plot(*zip(*points), marker="o", label=key)
        axis.set_yscale("log")
        axis.set_xlabel("epoch")
        axis.set_title(title)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


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
        tracking_uri: None: the URI the run was created on.
        status: final run status.

    Returns:
        ``models:/<model id>``, also stored as the run tag ``dynlm.model_uri``.
    """
    from dynlm import checkpoint

    uri = _uri_of(run_id, tracking_uri)
    mlflow_client = client(uri)
    with tempfile.TemporaryDirectory() as tmp:
        if history:
            png = plot_learning_curve(history, Path(tmp) / "learning_curve.png")
            mlflow_client.log_artifact(run_id, str(png))
        mlflow_client.log_text(run_id, json.dumps(history, indent=1, default=str), "history.json")
    valid = [row["valid_ppl"] for row in history if "valid_ppl" in row]
    final = {"epochs_completed": len(history)}
    if valid:
        final["best_valid_ppl"] = min(valid)
    log_epoch_metrics(run_id, len(history), final, tracking_uri=uri)

    model, model_cfg, spec, _extra = checkpoint.load(find_checkpoint_file(checkpoint_dir))
    with tempfile.TemporaryDirectory() as tmp:  # a local copy: the prepared root may be a URI
        preprocessor_path = Path(tmp) / "preprocessor.json"
        preprocessor_path.write_bytes(prepared.read_bytes(prepared.manifest["preprocessor"]))
        model_uri = log_pyfunc_model(run_id, model, model_cfg, spec, preprocessor_path, tracking_uri=uri)
    mlflow_client.set_tag(run_id, TAG_MODEL_URI, model_uri)
    mlflow_client.set_terminated(run_id, status)
    return model_uri


def _pyfunc_kwargs(artifacts: dict[str, str]) -> dict[str, Any]:
    """Arguments shared by save/log: models-from-code file, artifacts, signature, example, env."""
    import importlib.metadata

    import dynlm
    from pipelines import pyfunc_model

    def pinned(dist: str) -> str:
        return f"{dist}=={importlib.metadata.version(dist)}"

    return {
        "python_model": str(Path(pyfunc_model.__file__).resolve()),
        "artifacts": artifacts,
        # dynlm's source goes with the model, so a served model runs the code it was trained with.
        "code_paths": [str(Path(dynlm.__file__).resolve().parent)],
        "signature": pyfunc_model.SIGNATURE,
        "input_example": pyfunc_model.INPUT_EXAMPLE,
        # Listed, not inferred: inference would load the model in a subprocess (slow).
        "pip_requirements": [pinned("mlflow"), pinned("torch"), pinned("tokenizers"),
                             pinned("pyarrow"), pinned("numpy"), pinned("pandas"), pinned("pyyaml")],
    }


def save_pyfunc_model(path: str | Path, model, model_cfg, spec, preprocessor_path: str | Path) -> Path:
    """Save the pyfunc model to a local folder (no tracking server); ``mlflow.pyfunc.load_model(path)``."""
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = pyfunc_model_artifacts(tmp, model, model_cfg, spec, preprocessor_path)
        mlflow.pyfunc.save_model(str(path), **_pyfunc_kwargs(artifacts))
    return Path(path)


def log_pyfunc_model(run_id: str, model, model_cfg, spec, preprocessor_path: str | Path, *,
                     tracking_uri: str | None = None) -> str:
    """Log the pyfunc model (name ``model``) in run ``run_id``; return ``models:/<model id>``."""
    configure(_uri_of(run_id, tracking_uri))
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = pyfunc_model_artifacts(tmp, model, model_cfg, spec, preprocessor_path)
        with mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None):
            info = mlflow.pyfunc.log_model(name=MODEL_ARTIFACT_NAME, **_pyfunc_kwargs(artifacts))
    return info.model_uri


def pyfunc_model_artifacts(folder, model, model_cfg, spec, preprocessor_path) -> dict[str, str]:
    from pipelines import pyfunc_model

    return pyfunc_model.write_artifacts(folder, model, model_cfg, spec, preprocessor_path)


def find_checkpoint_file(checkpoint: str | Path) -> Path:
    """The dynlm checkpoint file in a checkpoint folder (``model.pt``, else the only ``*.pt``)."""
    path = Path(checkpoint)
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if (path / "model.pt").is_file():
        return path / "model.pt"
    candidates = sorted(path.glob("*.pt"))
    if len(candidates) != 1:
        raise FileNotFoundError(
            f"checkpoint folder {path} must hold model.pt or exactly one *.pt file; "
            f"found {[p.name for p in path.iterdir()]}")
    return candidates[0]


# ---------------------------------------------------------------------------------------------
# Registry: challenger / champion
# ---------------------------------------------------------------------------------------------


def registered_name(model_type: str) -> str:
    return f"{MODEL_NAME_PREFIX}{model_type}"


def register_and_promote(run_id: str, model_type: str, valid_ppl: float, data_hash: str, *,
                         margin: float = 0.0, tracking_uri: str | None = None) -> RegistrationResult:
    """Register the run's model as ``dynlm-<model_type>@challenger``; maybe move ``champion``.

    ``champion`` moves to the new version when there is no champion yet, or when the champion
    was validated on the same data (version tag ``data_hash``) and
    ``valid_ppl < champion valid_ppl - margin``. A champion on other data is never replaced
    automatically (the perplexities are not comparable); the reason says so. The new version
    gets the tags ``valid_ppl``, ``data_hash``, ``run_id`` and ``promotion`` (the reason).

    Args:
        run_id: a run closed by :func:`finish_training_run` (its tag ``dynlm.model_uri``).
        model_type: ``rnn`` | ``dntm`` | ``dynamical``.
        valid_ppl: validation perplexity of the registered weights.
        data_hash: ``DataConfig.data_hash()`` of the data they were validated on.
        margin: perplexity points the challenger must win by.
    """
    uri = _uri_of(run_id, tracking_uri)
    mlflow_client = client(uri)
    run = mlflow_client.get_run(run_id)
    model_uri = run.data.tags.get(TAG_MODEL_URI)
    if model_uri is None:
        raise ValueError(f"run {run_id} has no logged model (tag {TAG_MODEL_URI}); "
                         "call finish_training_run first")
    name = registered_name(model_type)
    configure(uri)
    console.route_library_logs()  # mute "Successfully registered ..." (log_model turns MLflow's prints back on)
    version = mlflow.register_model(
        model_uri, name,
        tags={"valid_ppl": repr(float(valid_ppl)), "data_hash": data_hash, "run_id": run_id},
    ).version
    mlflow_client.set_registered_model_alias(name, CHALLENGER, version)

    champion = version_by_alias(mlflow_client, name, CHAMPION)
    promoted = False
    if not math.isfinite(valid_ppl):
        reason = f"not promoted: valid_ppl {valid_ppl} is not finite"
    elif champion is None:
        promoted, reason = True, "promoted: there was no champion yet"
    elif champion.tags.get("data_hash") != data_hash:
        reason = (f"not promoted: champion v{champion.version} was validated on data "
                  f"{champion.tags.get('data_hash')}, v{version} on {data_hash}; perplexities on "
                  "different data are not comparable (evaluate both on one dataset and set the "
                  "alias by hand)")
    else:
        champion_ppl = float(champion.tags["valid_ppl"])
        if valid_ppl < champion_ppl - margin:
            promoted = True
            reason = (f"promoted: valid_ppl {valid_ppl:.4f} beats champion v{champion.version} "
                      f"({champion_ppl:.4f}) by more than {margin}")
        else:
            reason = (f"not promoted: valid_ppl {valid_ppl:.4f} does not beat champion "
                      f"v{champion.version} ({champion_ppl:.4f}) by more than {margin}")
    if promoted:
        mlflow_client.set_registered_model_alias(name, CHAMPION, version)
    mlflow_client.set_model_version_tag(name, version, "promotion", reason)
    mlflow_client.set_tag(run_id, "registered_version", f"{name}/{version}")
    return RegistrationResult(name=name, version=str(version), promoted=promoted, reason=reason,
                              champion_version=str(version) if promoted else
                              (str(champion.version) if champion is not None else None))


def version_by_alias(mlflow_client: MlflowClient, name: str, alias: str):
    """The ModelVersion that ``name@alias`` points at, or None when the alias (or model) is absent."""
    try:
        return mlflow_client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST" or "not found" in str(exc).lower():
            return None
        raise


def load_model(uri: str, *, tracking_uri: str | None = None):
    """Load a logged or registered dynlm model, e.g. ``models:/dynlm-dntm@champion``.

    Returns:
        ``(model, model_cfg, spec, preprocessor)``: the torch model in eval mode with the
        registered weights, its ModelConfig, VocabSpec and the saved Preprocessor.
    """
    from pipelines import pyfunc_model

    configure(tracking_uri)
    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp)
        return pyfunc_model.load_model_dir(local)
