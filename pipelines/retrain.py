"""Scheduled retraining: new data -> a challenger -> ``champion`` moves only if it wins.

``dynlm retrain --config retrain.yaml`` runs :func:`retrain` for a champion of any task (the LM,
cloze, naming, or a task outside dynlm)::

    1. champion      dynlm-<model_type>@champion (its version V is read once, here) and the job
                     config it was trained with; ``data`` (the new data) is checked against that
                     job's task data config: an unknown key is a ConfigError naming the task
    2. idempotency   key = hash(content of the new input files, retrain config, V); a FINISHED
                     retrain run with that key (or one that promoted today's champion from these
                     inputs) means there is nothing to do: no training, decision ``already_done``
    3. prepare       the new data through the champion's task (its readers, its data config with
                     ``data`` on top) with Ray Data (pipelines.prepare.prepare), encoded with the
                     champion's preprocessor.json (or a refit one: ``rebuild_vocabulary: true``);
                     the folder is addressed by the input CONTENT hash, so changed files are
                     never served stale
    4. train         pipelines.train.run_training, warm-started from the champion's weights
                     (``init_from: champion`` -> ``run.init_checkpoint``) or from scratch
    5. evaluate      champion and challenger on the SAME fixed validation data, by the task's
                     primary metric (perplexity, cloze error, naming f1_error: lower is better;
                     ``validation``: a prepared folder's valid split, or raw files of the task)
    6. register      ``tracking.register_and_promote`` (the one registration path): the
    7. promote       challenger becomes a new version, alias ``challenger``; under a file lock
                     next to the SQLite store ``champion`` is re-read: if it is no longer V
                     (another retrain promoted meanwhile) the decision is ``conflict`` (exit
                     code 3), else it moves iff challenger < champion * (1 - margin) in that metric.
                     The alias move is the very last registry write: a crash before it leaves
                     ``champion`` where it was.

Every decision is one MLflow run in experiment ``dynlm-retrain`` (tags ``decision``, ``reason``,
``objective_metric``, ``champion_ppl`` and ``challenger_ppl`` (the two models' values of that
metric, whatever the task: the names are kept for the runs recorded before), ``inputs_hash``,
``validation_hash``, versions ...); the challenger's training run is its child.
"""

from __future__ import annotations

import dataclasses
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from dynlm import promotion, storage
from dynlm.checkpoint_folder import find_checkpoint_file
from dynlm.config import Config, ConfigError, config_hash
from dynlm.data.fingerprint import input_listing
from dynlm.data.prepared import PreparedData, is_prepared
from dynlm.job import JobConfig, with_storage_env
from dynlm.tasks.local import files_table, prepare_in_memory

EXIT_CONFLICT = 3
DECISIONS = ("promoted", "rejected", "conflict", "already_done", "failed")


class RetrainError(RuntimeError):
    """Retraining cannot start (no champion, a champion without its config, bad inputs)."""


class InjectedFailure(RuntimeError):
    """``fail_before_promote``: the run dies after training and registration, before promotion."""


#: ``data`` keys that say where the new data's prepared folder goes and how fast it is written,
#: not what it holds: left out of the idempotency key (:meth:`RetrainConfig.key_dict`).
WHERE_DATA_GOES = ("output_root", "num_encode_actors")


@dataclass
class RetrainConfig(Config):
    """One scheduled retraining (``deploy/retrain.yaml`` is an example).

    Args:
        data: the new data, as changes to the champion's own ``data:`` section: ``inputs``
            (required: files, folders or URIs that the champion's task reads: CoNLL/text
            documents for the LM, CBT/CMRC-2017 question files for cloze, Python files for
            naming) and any other key of that task's data config (the LM's ``format``, the naming
            task's ``exclude``, ``output_root`` ...). The champion's other data settings apply,
            but not its ``splits`` (they name its own inputs): give ``splits`` here if the new
            files need them. The keys are checked once the champion's task is known
            (:func:`challenger_data_config`).
        validation: the FIXED validation set both models are scored on: a prepared folder
            (its ``valid`` split; its preprocessor must be the models') or files/folders of
            the task's raw data (encoded with each model's own preprocessor).
        model_type: the registered model ``dynlm-<model_type>`` whose champion is retrained
            (the task's model name: ``dntm``, ``rnn``, ``dynamical``, ``saw``, ``naming`` ...).
        init_from: ``champion`` (warm start from its weights) or ``scratch``.
        rebuild_vocabulary: refit the preprocessor (vocabulary, BPE ...) on the new data instead
            of reusing the champion's preprocessor.json (needs ``init_from: scratch``: the
            weights would not fit).
        margin: relative margin: promote iff challenger < champion x (1 - margin) in the task's
            primary metric (``dynlm.promotion.promotion_decision``, the policy of every
            registration).
        job_overrides: ``section.key=value`` applied to the champion's job config
            (``train.epochs=2``, ``run.num_workers=4``, ``data.vocab_size=5000`` ...).
        experiment: MLflow experiment of the retrain runs.
        tracking_uri: None: ``$MLFLOW_TRACKING_URI``, else ./mlflow.db.
        validation_batch_size: records (documents, questions, functions) per evaluation batch.
        validation_scoring: ``auto`` scores a prepared validation split larger than
            :data:`pipelines.scoring.RAY_SCORING_MIN_BYTES` as a Ray Data job (the same metrics
            as in this process), ``always``/``never`` force it (raw files: always in this process).
        fail_before_promote: fault injection (tests): die right before the alias would move.
    """

    data: dict[str, Any]
    validation: str
    model_type: str
    init_from: Literal["champion", "scratch"] = "champion"
    rebuild_vocabulary: bool = False
    margin: float = 0.01
    job_overrides: list[str] = field(default_factory=list)
    experiment: str = "dynlm-retrain"
    tracking_uri: str | None = None
    validation_batch_size: int = 8
    validation_scoring: Literal["auto", "always", "never"] = "auto"
    fail_before_promote: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, _prefix: str = "") -> "RetrainConfig":
        if "model_type" not in (data or {}):  # it defaulted to dntm once: say what it is
            raise ConfigError("model_type: required: the registered model dynlm-<model_type> whose champion is "
                              "retrained (dntm, rnn, dynamical, saw, naming ...)")
        return super().from_dict(data, _prefix=_prefix)

    def validate(self) -> None:
        if "inputs" not in self.data:
            raise ConfigError("data.inputs: required (the new data's files, folders or URIs)")
        inputs = self.data["inputs"]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(p, str) for p in inputs):
            raise ConfigError(f"data.inputs: a non-empty list of paths or URIs, got {inputs!r}")
        if not self.model_type:
            raise ConfigError("model_type: the registered model dynlm-<model_type> to retrain, got ''")
        if not 0.0 <= self.margin < 1.0:
            raise ConfigError(f"margin: a relative margin in [0, 1), got {self.margin}")
        if self.rebuild_vocabulary and self.init_from == "champion":
            raise ConfigError("rebuild_vocabulary: true needs init_from: scratch (the champion's "
                              "weights do not fit a new vocabulary)")
        if self.validation_batch_size < 1:
            raise ConfigError(f"validation_batch_size must be >= 1, got {self.validation_batch_size}")

    @property
    def inputs(self) -> list[str]:
        """The new data's files, folders or URIs (``data.inputs``)."""
        return list(self.data["inputs"])

    def key_dict(self) -> dict:
        """The settings that change the outcome (not where files go, not fault injection)."""
        data = self.to_dict()
        for name in ("fail_before_promote", "tracking_uri", "validation_scoring"):
            data.pop(name)
        data["data"] = {key: value for key, value in data["data"].items() if key not in WHERE_DATA_GOES}
        return data


def challenger_data_config(data: dict[str, Any], champion_job: JobConfig):
    """The new data as the champion's task reads it: an instance of the task's data config
    (``champion_job.get_task().data_config``) holding the champion's ``data:`` section with
    ``data`` (:attr:`RetrainConfig.data`) on top; the champion's ``splits`` are dropped (they
    name its own inputs) unless ``data`` gives ``splits``.

    Raises:
        ConfigError: a key of ``data`` that the task's data config does not have (one line
            naming the task, the config class and the key), or a value it refuses.
    """
    task = champion_job.get_task()
    config_cls = task.data_config
    known = sorted(f.name for f in dataclasses.fields(config_cls) if f.init)
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"data.{unknown[0]}: the champion is a {task.name!r} task model, whose data config "
                          f"{config_cls.__name__} has no key {unknown[0]!r}; known keys: {known}")
    return config_cls.from_dict({**champion_job.data.to_dict(), "splits": {}, **data}, _prefix="data.")


@dataclass
class RetrainResult:
    """What :func:`retrain` decided (also the tags of its MLflow run).

    ``champion_ppl`` / ``challenger_ppl`` are the two models' values of ``metric``, the task's
    primary metric on the fixed validation set (perplexity for the LM, ``error`` for cloze,
    ``f1_error`` for naming; lower is better): the names are the LM's, kept for the callers and
    runs that read them.
    """

    decision: str
    reason: str
    retrain_run_id: str | None
    champion_version_before: str
    champion_version_after: str
    challenger_version: str | None = None
    champion_ppl: float | None = None
    challenger_ppl: float | None = None
    trained: bool = False
    inputs_hash: str = ""
    metric: str = ""

    @property
    def exit_code(self) -> int:
        return EXIT_CONFLICT if self.decision == "conflict" else 0


# ---------------------------------------------------------------------------------------------
# Fixed validation set
# ---------------------------------------------------------------------------------------------


def _sha256_files(paths: list[str]) -> str:
    """Content hash of the files of ``paths`` (:func:`dynlm.data.fingerprint.input_listing`)."""
    return config_hash({"files": input_listing(paths)})


def validation_hash(validation: str, data_cfg) -> str:
    """Identity of the fixed validation set (content, plus the data settings for raw documents).

    For a prepared folder it is ``dynlm.promotion.valid_data_hash`` of its valid split, the value
    every training run records as ``valid_data_hash``."""
    if is_prepared(validation):  # a local folder or a URI: what training runs record, too
        return promotion.valid_data_hash(PreparedData.open(validation))
    settings = {k: v for k, v in data_cfg.to_dict().items() if k not in ("inputs", "splits", "output_root",
                                                                        "num_encode_actors")}
    return config_hash({"files": _sha256_files([validation]), "settings": settings})


def validation_rows(validation: str, task, preprocessor, data_cfg) -> list[dict]:
    """The fixed validation documents encoded for a model with ``preprocessor``: a prepared
    folder's valid split, or every document of raw files (the task's prepare stages, in this
    process, whatever split each document would fall in).

    Raises:
        ValueError: a prepared folder encoded with another preprocessor, an unreadable raw
        document, or no document.
    """
    if is_prepared(validation):  # a local folder or a URI
        prepared = PreparedData.open(validation)
        if prepared.preprocessor.to_json() != preprocessor.to_json():
            raise ValueError(f"validation folder {validation} was encoded with another preprocessor than "
                             "the model's; give raw validation documents (files/folders) instead")
        rows = list(prepared.iter_rows("valid"))
    else:
        cfg = data_cfg.replace(inputs=[validation], splits={})
        done = prepare_in_memory(task, files_table(cfg.input_files()), cfg, preprocessor=preprocessor,
                                 require_train=False)
        bad = [r for r in done.rejected() if r["kind"] == "quarantine"]
        if bad:
            raise ValueError(f"validation document {bad[0]['source_file']}:{bad[0]['line']} "
                             f"{bad[0]['doc_id']!r} is unreadable: {bad[0]['reason']}")
        rows = done.rows()
    if not rows:
        raise ValueError(f"validation {validation}: no document to evaluate on")
    return rows


def validation_score(task, model, model_cfg, spec, rows: list[dict], batch_size: int) -> float:
    """The task's primary metric of ``model`` on encoded rows, read as ``dynlm evaluate`` reads them."""
    model.eval()
    return float(task.evaluate_documents(model, model_cfg, rows, spec, batch_size)[task.primary_metric])


def validation_metric(validation: str, task, model, model_cfg, spec, preprocessor, data_cfg, batch_size: int,
                      scoring: str = "auto") -> tuple[float, str]:
    """The task's primary metric of ``model`` on the fixed validation documents, and where it was
    scored: a prepared valid split as a Ray Data job when ``scoring`` says so (``auto``: larger
    than :data:`pipelines.scoring.RAY_SCORING_MIN_BYTES`; as ``dynlm evaluate`` scores it, the
    same metrics), anything else in this process (:func:`validation_rows`, :func:`validation_score`)."""
    from pipelines.scoring import score_split, scores_on_ray

    if is_prepared(validation):
        prepared = PreparedData.open(validation)
        if prepared.preprocessor.to_json() == preprocessor.to_json() and scores_on_ray(scoring, prepared, "valid"):
            model.eval()
            metrics, _, where = score_split(task, model, model_cfg, spec, prepared, "valid", batch_size=batch_size)
            return float(metrics[task.primary_metric]), where
    rows = validation_rows(validation, task, preprocessor, data_cfg)
    return validation_score(task, model, model_cfg, spec, rows, batch_size), "this process"


# ---------------------------------------------------------------------------------------------
# Registry helpers
# ---------------------------------------------------------------------------------------------


def find_finished_retrain(experiment_id: str, inputs_key: str, champion_version: str, uri: str):
    """A FINISHED retrain run of these inputs + config that already settled today's champion."""
    from pipelines import tracking

    for run in tracking.find_runs(experiment_id, {"inputs_key": inputs_key}, status="FINISHED", tracking_uri=uri):
        tags = run.data.tags
        if tags.get("champion_version_before") == champion_version or (
                tags.get("decision") == "promoted" and tags.get("champion_version_after") == champion_version):
            return run
    return None


def _champion_job(version, uri: str) -> JobConfig:
    """The job config the champion was trained with (``config.yaml`` of its training run)."""
    from pipelines import tracking

    run_id = version.tags.get("run_id") or version.run_id
    if not run_id:
        raise RetrainError(f"champion v{version.version} has no training run: cannot reuse its job config")
    return JobConfig.from_dict(yaml.safe_load(tracking.read_run_text(run_id, "config.yaml", tracking_uri=uri)))


def challenger_job(cfg: RetrainConfig, champion_job: JobConfig, run_name: str, uri: str) -> JobConfig:
    """The champion's job with the new data (:func:`challenger_data_config`), the overrides and
    retrain run settings."""
    data = champion_job.to_dict()
    data["data"] = challenger_data_config(cfg.data, champion_job).to_dict()
    job = JobConfig.from_dict(data).with_overrides(with_storage_env(cfg.job_overrides))
    return job.replace(run=job.run.replace(name=run_name, register=False, resume=False, fail_at_epoch=-1,
                                           tracking_uri=uri, init_checkpoint=None))


def _write_init_checkpoint(job: JobConfig, model, model_cfg, spec) -> str:
    """Save the champion's weights where every Ray worker can read them (the run storage)."""
    from dynlm import checkpoint as dynlm_checkpoint

    target = storage.join(job.run.storage_uri(), f"{job.run.name}-init", "model.pt")
    with tempfile.TemporaryDirectory() as tmp:
        local = dynlm_checkpoint.save(Path(tmp) / "model.pt", model, model_cfg, spec, extra={"source": "champion"},
                                      task=job.task)
        storage.copy(local, target)
    return target


# ---------------------------------------------------------------------------------------------
# The retrain job
# ---------------------------------------------------------------------------------------------


def retrain(cfg: RetrainConfig, *, log=print) -> RetrainResult:
    """Run one scheduled retraining (module docstring). Returns the decision; raises on failure
    (the retrain run is then FAILED with tags ``decision=failed`` and ``reason``; ``champion``
    is untouched).

    Raises:
        RetrainError: no champion, or a champion without its training run's job config.
        ConfigError: ``cfg.data`` does not fit the champion's task (before any run is recorded).
    """
    from pipelines import tracking

    uri = tracking.configure(tracking.check_reachable(cfg.tracking_uri))  # before Ray starts
    name = promotion.registered_name(cfg.model_type)
    champion = tracking.version_by_alias(name, tracking.CHAMPION, tracking_uri=uri)
    if champion is None:
        raise RetrainError(f"no {name}@champion in {uri}: train and register a model first (dynlm train)")
    before = str(champion.version)
    champion_job = _champion_job(champion, uri)
    challenger_data_config(cfg.data, champion_job)  # the new data fits the champion's task, or one line now
    metric = champion_job.get_task().primary_metric
    inputs_hash = _sha256_files(cfg.inputs)
    inputs_key = config_hash({"inputs": inputs_hash, "config": cfg.key_dict()})
    key = config_hash({"inputs_key": inputs_key, "champion_version": before})
    experiment_id = tracking.ensure_experiment(cfg.experiment, uri)

    done = find_finished_retrain(experiment_id, inputs_key, before, uri)
    if done is not None:
        tags = done.data.tags
        reason = (f"already done: retrain run {done.info.run_id} processed these inputs with this config "
                  f"(decision {tags.get('decision')}); nothing trained")
        log(f"[retrain] {reason}")
        return RetrainResult("already_done", reason, done.info.run_id, before, before,
                             challenger_version=tags.get("challenger_version"), inputs_hash=inputs_hash, metric=metric)

    run_name = f"retrain-{key[:10]}-{uuid.uuid4().hex[:6]}"
    run_id = tracking.start_run(cfg.experiment, run_name=run_name, tracking_uri=uri, tags={
        tracking.TAG_KIND: "retrain", "retrain_key": key, "inputs_key": inputs_key, "inputs_hash": inputs_hash,
        "champion_version_before": before, "model_name": name, "init_from": cfg.init_from,
        "rebuild_vocabulary": str(cfg.rebuild_vocabulary), "objective_metric": metric, "decision": "running"},
        texts={"retrain.yaml": yaml.safe_dump(cfg.to_dict(), sort_keys=False)})
    try:
        result = _train_and_decide(cfg, champion, champion_job, run_id, run_name, inputs_hash, uri, log)
    except BaseException as exc:
        tracking.end_run(run_id, "FAILED", tracking_uri=uri, tags={
            "decision": "failed", "reason": f"{type(exc).__name__}: {exc}"[:5000]})
        raise
    log(f"[retrain] {result.decision}: {result.reason}")
    return result


def _fail_before_promote() -> None:
    raise InjectedFailure("fail_before_promote: stopping right before the champion alias moves")


def _train_and_decide(cfg: RetrainConfig, champion, champion_job: JobConfig, run_id: str, run_name: str,
                      inputs_hash: str, uri: str, log) -> RetrainResult:
    """Steps 3-7 of the module docstring inside the retrain run ``run_id``; closes it FINISHED."""
    from dynlm import checkpoint as dynlm_checkpoint
    from pipelines import tracking
    from pipelines.prepare import prepare
    from pipelines.train import run_training

    name, before = promotion.registered_name(cfg.model_type), str(champion.version)
    _task, champion_model, champion_cfg, champion_spec, champion_pre = tracking.load_model(
        f"models:/{name}/{before}", tracking_uri=uri)
    job = challenger_job(cfg, champion_job, run_name, uri)
    task = job.get_task()
    metric = task.primary_metric
    prepared = prepare(job.data, task=task, preprocessor=None if cfg.rebuild_vocabulary else champion_pre,
                       progress=False)
    if cfg.init_from == "champion":
        job = job.replace(run=job.run.replace(
            init_checkpoint=_write_init_checkpoint(job, champion_model, champion_cfg, champion_spec)))
    tracking.set_tags(run_id, {"challenger_data_dir": str(prepared.root)}, tracking_uri=uri)
    log(f"[retrain] champion {name} v{before} ({task.name} task); training a challenger on {prepared.root} "
        f"({prepared.num_documents('train')} train records, init_from={cfg.init_from})")
    trained = run_training(job, prepared, parent_run_id=run_id)

    challenger, challenger_cfg, challenger_spec, _ = dynlm_checkpoint.load(
        find_checkpoint_file(trained.best_checkpoint_dir))
    val_hash = validation_hash(cfg.validation, job.data)
    champion_score, scored_on = validation_metric(cfg.validation, task, champion_model, champion_cfg, champion_spec,
                                                  champion_pre, job.data, cfg.validation_batch_size,
                                                  cfg.validation_scoring)
    challenger_score, _ = validation_metric(cfg.validation, task, challenger, challenger_cfg, challenger_spec,
                                            prepared.preprocessor, job.data, cfg.validation_batch_size,
                                            cfg.validation_scoring)
    log(f"[retrain] validation {metric} (lower is better), scored in {scored_on}: champion v{before} "
        f"{champion_score:.4f}, challenger {challenger_score:.4f}")
    # the tags keep the LM's names champion_ppl / challenger_ppl for every task (objective_metric says which)
    tracking.set_tags(run_id, {"champion_ppl": repr(champion_score), "challenger_ppl": repr(challenger_score),
                               "validation_scored_on": scored_on,
                               "validation_hash": val_hash, "challenger_run_id": trained.run_id,
                               "challenger_data_hash": job.data.data_hash()}, tracking_uri=uri)
    registration = tracking.register_and_promote(
        trained.run_id, challenger_score, margin=cfg.margin, metric=metric, valid_data_hash=val_hash,
        champion=promotion.MeasuredChampion(before, champion_score), tags={"retrain_run_id": run_id},
        before_promote=_fail_before_promote if cfg.fail_before_promote else None, tracking_uri=uri)
    after = registration.champion_version or ""
    tracking.end_run(run_id, "FINISHED", tracking_uri=uri, tags={
        "challenger_version": registration.version, "decision": registration.decision,
        "reason": registration.reason, "champion_version_after": after})
    return RetrainResult(registration.decision, registration.reason, run_id, before, after,
                         challenger_version=registration.version, champion_ppl=champion_score,
                         challenger_ppl=challenger_score, trained=True, inputs_hash=inputs_hash, metric=metric)
