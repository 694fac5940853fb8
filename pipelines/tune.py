"""Ray Tune search: one trial = one whole pipeline run (data settings -> prepared data -> Ray Train).

Flow of :func:`run_search`::

    space file ──validate──▶ distinct data configs ──prepare() each, ONCE──▶ {data_hash: folder}
         │                                                                   │
         └─▶ MLflow parent run ──▶ Tuner(with_resources(train_driver_fn, CPU 0.01), ASHA, searcher)
                                          │ one trial
                                          ▼
                              train_driver_fn(config): JobConfig of the trial ─▶ run_training(...,
                              parent_run_id, tune_callback=True)  = a TorchTrainer per trial whose
                              reports reach Tune through TuneReportCallback (1 report = 1 epoch)
         results table (CSV) + plot (PNG) on the parent run ◀── best finished trial ──▶ registry
                                                                  (register_and_promote)

Train V2 does not accept ``Tuner(trainer)``; the driver function pattern above is Ray's own
(doc_code/train_tune_interop.py). The driver reserves 0.01 CPU; the trial's real resources
(run.num_workers x run.cpus_per_worker CPUs, or 1 GPU per worker) are taken by its TorchTrainer,
so the same code runs on a laptop and on a GPU cluster.

Interrupting the driver (Ctrl-C) saves Tune's state; ``dynlm tune --resume <experiment>``
(:func:`resume_search`) continues with ``Tuner.restore``; finished trials are not re-run. The
resolved space, the prepared folders and the MLflow parent run are kept next to Tune's state in
``<storage>/<experiment>/dynlm_search.json``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynlm import faults, storage
from dynlm.config import ConfigError
from dynlm.data.config import CORPUS_FIELDS
from dynlm.search.report import (
    TrialSummary,
    best_trial,
    error_line,
    finished_trials,
    format_table,
    results_csv,
    results_figure,
)
from dynlm.search.space import TRIAL_DRIVER_CPUS, SearchSpace, check_trials_fit, data_configs, describe
from dynlm.search.space_file import from_resolved
from dynlm.search.trials import trial_job, trials_base
from dynlm.tasks import get_task
from pipelines.search_space import scheduler, searcher, to_param_space

SIDECAR = "dynlm_search.json"
RESULTS_CSV = "tune_results.csv"
RESULTS_PNG = "tune_results.png"
DRIVER_RESOURCES = {"CPU": TRIAL_DRIVER_CPUS}  # {"CPU": 0} is rejected by Ray; the trainer takes the rest


@dataclass
class SearchResult:
    """What a search did (also printed and logged on the parent run)."""

    experiment: str
    experiment_path: str
    parent_run_id: str
    num_prepared: int  # distinct data configs prepared before the trials
    trials: list[TrialSummary]
    interrupted: bool  # True: stopped before every trial ended; resume with resume_search()
    num_finished: int = 0  # trials whose MLflow run FINISHED with a validation perplexity
    best: TrialSummary | None = None
    registration: Any = None  # dynlm.promotion.RegistrationResult of the best trial
    wall_s: float = 0.0
    table: str = ""
    artifacts: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Where a search lives (local folders and s3:// / gs:// through dynlm.storage)
# ---------------------------------------------------------------------------------------------


def experiment_uri(storage_uri: str, experiment: str) -> str:
    return f"{storage_uri.rstrip('/')}/{experiment}"


# ---------------------------------------------------------------------------------------------
# Preprocessing pre-pass
# ---------------------------------------------------------------------------------------------


def prepare_all(space: SearchSpace) -> tuple[dict[str, str], dict[str, str]]:
    """Prepare every distinct data config of the space before any trial starts.

    ``pipelines.prepare.prepare`` is content-addressed and locked, so a config prepared by an
    earlier search is reused, not rebuilt. A config that the data cannot support (a user error:
    more BPE merges than the corpus has pairs, say) is not fatal to the search: its trials fail
    with that line (:func:`train_driver_fn`) and the others run.

    Returns:
        ``({data_hash: absolute prepared folder}, {encoding_hash: error line})``, one entry per
        distinct data config.
    """
    from pipelines.cli import error_line, is_user_error
    from pipelines.defaults import ensure_synthetic_corpus
    from pipelines.prepare import prepare

    ensure_synthetic_corpus(space.base)
    roots, unprepared = {}, {}
    configs = data_configs(space)
    for i, cfg in enumerate(configs, 1):
        settings = ", ".join(f"{key}={value}" for key, value in cfg.to_dict().items() if key not in CORPUS_FIELDS)
        print(f"[tune] preparing data config {i}/{len(configs)} ({cfg.data_hash()}: {settings})", flush=True)
        try:
            prepared = prepare(cfg, task=space.base.task, progress=False)
        except Exception as exc:
            if not is_user_error(exc):
                raise
            reason = unprepared[cfg.encoding_hash()] = error_line(exc).removeprefix("dynlm: error: ")
            print(f"[tune] data config {i}/{len(configs)} cannot be prepared; its trials will fail: {reason}",
                  flush=True)
            continue
        roots[cfg.data_hash()] = storage.absolute(prepared.root)
    return roots, unprepared


# ---------------------------------------------------------------------------------------------
# The trial
# ---------------------------------------------------------------------------------------------


def _finished_run_of(trial_id: str, context: dict):
    """The FINISHED child run of ``trial_id`` (a trial restored after an interrupt may already
    have finished its training: Tune saved it as unfinished), or None."""
    from pipelines import tracking

    uri = context["base"]["run"]["tracking_uri"]  # set by trials_base
    runs = [run for run in _child_runs(context["parent_run_id"], uri, status="FINISHED",
                                       **{tracking.TAG_TRIAL_ID: trial_id})
            if "best_valid_objective" in run.data.metrics]
    return runs[-1] if runs else None


def train_driver_fn(config: dict, context: dict) -> None:
    """Tune function trainable: one trial = one TorchTrainer (Ray Train V2) on prepared data.

    Args:
        config: the sampled params, dotted keys (``{"model.dntm.merge_fn": "gru", ...}``).
        context: set by :func:`run_search` through ``tune.with_parameters``: ``base`` (JobConfig
            dict, absolute paths), ``search_keys``, ``prepared`` ({data_hash: folder}),
            ``parent_run_id``, ``experiment``.
    """
    from ray import tune

    from dynlm.data.prepared import PreparedData
    from pipelines.tracking import TAG_TRIAL_ID
    from pipelines.train import run_training

    trial_id = tune.get_context().get_trial_id()
    done = _finished_run_of(trial_id, context)
    if done is not None:  # finished while the driver was being interrupted: never train twice
        print(f"[tune] trial {trial_id} already finished (MLflow run {done.info.run_id}); not re-run", flush=True)
        metrics = done.data.metrics
        best = float(metrics["best_valid_objective"])  # the task's primary metric, else the run's last value
        value = best if context["metric"] == "valid_objective" else float(metrics.get(context["metric"], best))
        tune.report({"valid_objective": best, context["metric"]: value, "epoch": metrics.get("epochs_completed", 0)})
        return
    params = {key: config[key] for key in context["search_keys"]}
    job = trial_job(context["base"], params, f"{context['experiment']}-{trial_id}-{time.strftime('%H%M%S')}")
    unprepared = context.get("unprepared") or {}  # absent in searches saved before it
    if unprepared and (reason := unprepared.get(job.data.encoding_hash())) is not None:  # hashed only when needed
        raise ConfigError(f"data config {job.data.data_hash()} could not be prepared: {reason}")
    root = context["prepared"].get(job.data.data_hash())  # content-addressed: any path spelling
    prepared = PreparedData.open(root) if root is not None else _derive_in_trial(job.data, context)
    run_training(job, prepared, parent_run_id=context["parent_run_id"], tune_callback=True,
                 run_tags={TAG_TRIAL_ID: trial_id})
    faults.kill_point("tune:trial_finished")  # the kill -9 test of the search driver


def _derive_in_trial(cfg, context: dict):
    """The folder of a continuous gamma, derived from the pre-pass's folder of the same encoding
    (hard links, < 1 s). Never a preprocessing job: inside the trial's placement group (0.01
    CPU) its Ray Data tasks could never be scheduled, so a missing folder fails at once."""
    from pipelines.prepare import PreparedDataMissing, prepare

    try:
        return prepare(cfg, task=context["base"]["task"], progress=False, build=False)
    except PreparedDataMissing as exc:
        raise PreparedDataMissing(
            f"{exc}. The search's pre-pass prepared {sorted(context['prepared'])}; a trial never "
            "preprocesses (data.* settings other than gamma must be choice or grid in the space "
            "file, so that the pre-pass prepares each of their values)") from None


# ---------------------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------------------


def _trainable(context: dict):
    from ray import tune

    return tune.with_resources(tune.with_parameters(train_driver_fn, context=context), DRIVER_RESOURCES)


def _init_ray() -> None:
    from pipelines.ray_env import init_ray

    init_ray()


def _with_trial_cpus(space: SearchSpace) -> SearchSpace:
    """``space`` with ``run.cpus_per_worker=auto`` resolved for its concurrent trials (the
    cluster's CPUs shared by ``min(tune.max_concurrent_trials, trials)`` trainings)."""
    from dynlm.job import with_worker_cpus
    from pipelines.ray_env import cluster_cpus, started_here

    if space.base.run.cpus_per_worker != "auto":
        return space
    concurrent = min(space.tune.max_concurrent_trials, space.expected_trials())
    run = with_worker_cpus(space.base.run, *cluster_cpus(), concurrent_runs=concurrent, may_grow=not started_here())
    return dataclasses.replace(space, base=space.base.replace(run=run.to_dict()))


def _check_local_cluster(space: SearchSpace) -> None:
    """:func:`check_trials_fit` on a one-node Ray (a laptop, a test); a multi-node cluster may
    autoscale, so it is not checked."""
    import ray

    if len([n for n in ray.nodes() if n.get("Alive")]) == 1:
        check_trials_fit(space, float(ray.cluster_resources().get("CPU", 0.0)))


def run_search(space: SearchSpace, *, experiment: str | None = None) -> SearchResult:
    """Run a whole search: prepare, tune, summarise, register the best model.

    Args:
        space: a validated :class:`SearchSpace` (``dynlm.search.space_file.load_search_space``).
        experiment: Tune experiment name (folder under ``run.storage_path``); default
            ``tune-<space file stem>-<time>``.
    Returns:
        a :class:`SearchResult` (``interrupted`` when the driver was stopped midway).
    """
    from ray import tune

    from pipelines import tracking

    uri = tracking.check_reachable(space.base.run.tracking_uri)  # before Ray starts
    _init_ray()
    space = _with_trial_cpus(space)
    _check_local_cluster(space)
    print(describe(space), flush=True)
    base = trials_base(space, uri)
    experiment = experiment or f"tune-{Path(space.source).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    exp_uri = experiment_uri(base.run.storage_path, experiment)

    prepared, unprepared = prepare_all(space)
    parent_run_id = _start_parent_run(space, base, experiment, exp_uri, len(prepared))
    context = {"base": base.to_dict(), "search_keys": sorted(space.search), "prepared": prepared,
               "unprepared": unprepared,
               "parent_run_id": parent_run_id, "experiment": experiment, "metric": space.tune.metric,
               "mode": space.tune.mode}
    storage.write_text(f"{exp_uri}/{SIDECAR}", json.dumps(
        {"space": space.to_dict(), "context": context, "tracking_uri": uri}, indent=1))

    tuner = tune.Tuner(
        _trainable(context),
        param_space=to_param_space(space),
        tune_config=tune.TuneConfig(
            metric=space.tune.metric, mode=space.tune.mode, num_samples=space.tune.num_samples,
            search_alg=searcher(space), scheduler=scheduler(space),
            max_concurrent_trials=space.tune.max_concurrent_trials if space.tune.searcher == "optuna" else None,
        ),
        run_config=tune.RunConfig(name=experiment, storage_path=base.run.storage_path, verbose=1,
                                  failure_config=tune.FailureConfig(max_failures=0)),
    )
    return _finish(space, tuner, context, exp_uri, uri, time.time())


def resume_search(experiment: str, *, storage_path: str | None = None) -> SearchResult:
    """Continue an interrupted search with ``Tuner.restore`` (finished trials are not re-run).

    Args:
        experiment: the experiment name (under ``storage_path``) or its full path/URI.
        storage_path: where experiments live (default: ``$DYNLM_STORAGE_PATH``, else the embedded
            default ``run.storage_path``).
    """
    from ray import tune

    from dynlm.job import RunSettings
    from pipelines import tracking

    if storage.is_uri(experiment) or storage.is_dir(experiment):
        exp_uri = storage.absolute(experiment)
    else:
        root = RunSettings(storage_path=storage_path).storage_uri() if storage_path else \
            _default_storage_uri()
        exp_uri = experiment_uri(root, experiment)
    try:
        saved = json.loads(storage.read_text(f"{exp_uri}/{SIDECAR}"))
    except (FileNotFoundError, OSError) as exc:
        raise FileNotFoundError(f"no dynlm search at {exp_uri} ({SIDECAR} missing): {exc}") from exc
    tracking.check_reachable(saved["tracking_uri"])  # before Ray starts
    _init_ray()
    space = from_resolved(saved["space"])
    context = saved["context"]
    if not tune.Tuner.can_restore(exp_uri):
        raise FileNotFoundError(f"{exp_uri} has no Tune experiment state to restore")
    print(f"[tune] resuming {exp_uri}", flush=True)
    tuner = tune.Tuner.restore(exp_uri, trainable=_trainable(context), resume_unfinished=True,
                               restart_errored=True, param_space=to_param_space(space))
    return _finish(space, tuner, context, exp_uri, saved["tracking_uri"], time.time())


def _default_storage_uri() -> str:
    from pipelines.defaults import load_job

    return load_job(None).run.storage_uri()  # honours $DYNLM_STORAGE_PATH


def saved_unfinished_trials(exp_uri: str) -> list[str]:
    """Ids of the trials that Tune's saved experiment state holds as not ended: what
    ``Tuner.restore(resume_unfinished=True)`` runs again.

    The result grid that ``Tuner.fit()`` returns cannot tell: at an interrupt (Ctrl-C, SIGUSR1)
    Tune saves the running trials as unfinished, then stops them and calls them TERMINATED in
    memory, like trials that ended. Regression: a search interrupted in its last trial was
    reported as ended, and its cut-short trial's MLflow run was closed as stopped by the scheduler.
    """
    from ray.tune import ExperimentAnalysis

    return [t.trial_id for t in ExperimentAnalysis(exp_uri).trials if t.status not in ("TERMINATED", "ERROR")]


def _finish(space: SearchSpace, tuner, context: dict, exp_uri: str, uri: str, start: float) -> SearchResult:
    from pipelines import tracking

    grid = tuner.fit()
    wall = time.time() - start
    parent_run_id = context["parent_run_id"]
    unfinished = saved_unfinished_trials(exp_uri)
    ended = len(grid) - len(unfinished)
    interrupted = bool(unfinished) or len(grid) < space.expected_trials()
    trials = collect_trials(grid, context, uri)
    if not interrupted:
        close_ended_runs(trials, grid, context, uri)
    result = SearchResult(experiment=context["experiment"], experiment_path=exp_uri,
                          parent_run_id=parent_run_id, num_prepared=len(context["prepared"]),
                          trials=trials, interrupted=interrupted, wall_s=wall)
    result.table = format_table(trials, context["search_keys"])
    print(result.table, flush=True)
    if interrupted:
        print(f"[tune] interrupted: {ended}/{space.expected_trials()} trials ended. "
              f"Resume with: dynlm tune --resume {exp_uri}", flush=True)
        return result

    result.num_finished = len(finished_trials(trials))
    result.best = best_trial(trials, space.tune.mode)
    result.artifacts = log_results(parent_run_id, trials, context["search_keys"], space.base, uri)
    tracking.log_metrics(parent_run_id, {"search_wall_s": wall, "num_trials": len(trials)}, tracking_uri=uri)
    _report_failures(trials, parent_run_id, uri)
    if result.best is not None:
        best_objective = tracking.get_run(result.best.run_id, tracking_uri=uri).data.metrics.get(
            "best_valid_objective", result.best.best_valid_objective)
        tracking.log_metrics(parent_run_id, {"best_valid_objective": result.best.best_valid_objective}, tracking_uri=uri)
        tracking.set_tags(parent_run_id, {"best_trial": result.best.trial_id, "best_run_id": result.best.run_id},
                          tracking_uri=uri)
        result.registration = tracking.register_and_promote(
            result.best.run_id, best_objective, margin=space.base.run.promotion_margin,
            metric=get_task(space.base.task).primary_metric, tracking_uri=uri)
        print(f"[tune] best trial {result.best.trial_id}: {space.tune.metric} {result.best.best_valid_objective:.3f}; "
              f"registered {result.registration.name} v{result.registration.version} "
              f"({result.registration.reason})", flush=True)
    else:
        print("[tune] no trial finished training; nothing registered", flush=True)
    tracking.end_run(parent_run_id, "FINISHED" if result.num_finished else "FAILED", tracking_uri=uri)
    return result


def _report_failures(trials: list[TrialSummary], parent_run_id: str, uri: str) -> None:
    """Print the errored trials (first line of each error); count them on the parent run."""
    from pipelines import tracking

    failed = [t for t in trials if t.status == "ERROR"]
    tracking.log_metrics(parent_run_id, {"num_failed_trials": len(failed)}, tracking_uri=uri)
    if not failed:
        return
    print(f"[tune] {len(failed)} of {len(trials)} trials failed:", flush=True)
    for t in failed:
        print(f"[tune]   {t.trial_id}: {t.error}", flush=True)
    tracking.set_tags(parent_run_id, {"dynlm.failed_trials": "\n".join(f"{t.trial_id}: {t.error}"
                                                                         for t in failed)[:5000]},
                      tracking_uri=uri)


# ---------------------------------------------------------------------------------------------
# MLflow: parent run, child runs, results table and plot
# ---------------------------------------------------------------------------------------------


def _start_parent_run(space: SearchSpace, base, experiment: str, exp_uri: str, num_prepared: int) -> str:
    import yaml

    from pipelines import tracking

    params = {"space_file": space.source, "num_prepared_data_configs": num_prepared,
              **{f"tune.{k}": v for k, v in space.tune.to_dict().items()},
              **{f"search.{k}": json.dumps(v) for k, v in space.search.items()}}
    return tracking.start_run(base.run.experiment, run_name=experiment, params=params,
                              tags={tracking.TAG_KIND: "tune", "dynlm.tune_path": exp_uri},
                              texts={"search_space.yaml": yaml.safe_dump(space.to_dict(), sort_keys=False)},
                              tracking_uri=base.run.tracking_uri)


def _child_runs(parent_run_id: str, uri: str, status: str | None = None, **tags: str) -> list:
    """The training runs of a search (tag ``mlflow.parentRunId``), oldest first; ``tags``
    narrow them (``**{"dynlm.trial_id": trial_id}``)."""
    from pipelines import tracking

    parent = tracking.get_run(parent_run_id, tracking_uri=uri)
    return tracking.find_runs(parent.info.experiment_id, {"mlflow.parentRunId": parent_run_id, **tags},
                              status=status, tracking_uri=uri)


def close_ended_runs(trials: list[TrialSummary], grid, context: dict, uri: str) -> None:
    """Close the child runs left RUNNING (a trial cannot close its own run when Tune stops it).

    The run a trial errored in becomes FAILED (with Tune's error as ``dynlm.error``); a run the
    scheduler stopped, or an attempt interrupted and re-run after a restore, becomes KILLED.
    Updates ``run_status`` of ``trials`` in place.
    """
    from pipelines import tracking

    by_run = {t.run_id: (t, r) for t, r in zip(trials, grid) if t.run_id is not None}
    for run in _child_runs(context["parent_run_id"], uri, status="RUNNING"):
        trial, result = by_run.get(run.info.run_id, (None, None))
        if trial is not None and trial.status == "ERROR":
            status, tags = "FAILED", {"dynlm.error": str(result.error)[:5000]}
        else:
            status, tags = "KILLED", {"dynlm.stopped": "stopped early by the Tune scheduler or interrupted"}
        tracking.end_run(run.info.run_id, status, tags=tags, tracking_uri=uri)
        if trial is not None:
            trial.run_status = status


def collect_trials(grid, context: dict, uri: str) -> list[TrialSummary]:
    """One :class:`TrialSummary` per Tune trial, from Ray's public ``Result`` fields (metrics,
    config, error, metrics_dataframe), joined with its MLflow child run by the run tag
    ``dynlm.trial_id``. Status: ``ERROR`` when the trial raised, else ``TERMINATED`` (every
    trial of a search that ran to its end ended), or ``INTERRUPTED`` for a trial whose run did
    not finish in a search stopped midway (see ``resume_search``)."""
    from pipelines import tracking

    runs_by_trial: dict[str, list] = {}
    for run in _child_runs(context["parent_run_id"], uri):
        runs_by_trial.setdefault(run.data.tags.get(tracking.TAG_TRIAL_ID), []).append(run)
    ended = grid.num_terminated + grid.num_errors == len(grid)
    rows = []
    for result in grid:
        trial_id = result.metrics["trial_id"]  # Tune sets it on every trial's last result, even unreported
        df = result.metrics_dataframe
        metric = context.get("metric", "valid_ppl")  # searches saved before the objective was task-named
        best, epochs = float("nan"), 0
        if df is not None and metric in df and len(df):
            column = df[metric]
            best = float(column.max() if context.get("mode") == "max" else column.min())
            epochs = int(df["training_iteration"].max())
        runs = runs_by_trial.get(trial_id, [])
        finished = [r for r in runs if r.info.status == "FINISHED"]
        chosen = finished[-1] if finished else (runs[-1] if runs else None)
        status = "ERROR" if result.error is not None else (
            "TERMINATED" if ended or finished else "INTERRUPTED")
        rows.append(TrialSummary(
            trial_id=trial_id, params={k: (result.config or {}).get(k) for k in context["search_keys"]},
            status=status, best_valid_objective=best, epochs=epochs,
            time_s=float(result.metrics.get("time_total_s", 0.0)),
            run_id=chosen.info.run_id if chosen else None,
            run_status=chosen.info.status if chosen else None,
            error=error_line(result.error)))
    return rows


def log_results(parent_run_id: str, trials: list[TrialSummary], keys: list[str], base, uri: str) -> dict:
    """Log ``tune_results.csv`` and ``tune_results.png`` on the parent run; return their names."""
    from pipelines import tracking

    tracking.log_text(parent_run_id, results_csv(trials, keys), RESULTS_CSV, tracking_uri=uri)
    with tracking.FIGURE_LOCK:  # matplotlib is not thread-safe
        tracking.log_figure(parent_run_id, results_figure(trials, base, keys), RESULTS_PNG, tracking_uri=uri)
    return {"csv": RESULTS_CSV, "png": RESULTS_PNG}
