"""``dynlm run``: the whole embedded pipeline, what ``make run`` calls.

synthetic corpus -> Ray Data prepare -> Ray Train (2 workers) -> MLflow run + registry
(challenger, champion if better) -> the champion's metric table on the test split -> how to
open the MLflow UI. A few minutes on 2 CPU cores with the embedded default job.
"""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path

EPILOG = """\
examples:
  dynlm run                                        # the embedded default job (pipelines/defaults.py)
  dynlm run --set train.epochs=2 --set model.dntm.merge_fn=max
  dynlm run --config job.yaml --tracking-uri http://mlflow:5000

environment: MLFLOW_TRACKING_URI (default sqlite:///<cwd>/mlflow.db), RAY_ADDRESS (join a cluster).
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "run", help="the whole embedded pipeline: synth -> prepare -> train -> register -> evaluate",
        description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="job YAML (default: the embedded job of pipelines/defaults.py)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a job setting, e.g. --set train.epochs=2 (repeatable)")
    parser.add_argument("--synth-documents", type=int, default=None,
                        help="size of the synthetic corpus when it is generated (default: SynthConfig's)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    parser.set_defaults(func=run)


def _seconds(start: float) -> str:
    return f"{time.monotonic() - start:.1f} s"


def ensure_corpus(job, num_documents: int | None) -> None:
    """Write the synthetic corpus when the job reads :data:`pipelines.defaults.SYNTH_DIR` and it is absent."""
    from dynlm.data.synth import SynthConfig, write_conll
    from pipelines.defaults import SYNTH_DIR

    for entry in job.data.inputs:
        if Path(entry) != Path(SYNTH_DIR):
            continue
        if any(Path(entry).glob("*")):
            print(f"[run] reusing the synthetic corpus in {entry}")
            continue
        cfg = SynthConfig() if num_documents is None else SynthConfig(num_documents=num_documents)
        files = write_conll(cfg, Path(entry))
        print(f"[run] wrote the synthetic corpus: {cfg.num_documents} documents in {len(files)} files under {entry}")


def model_to_evaluate(job, uri: str, training) -> tuple[str, str]:
    """The registry URI to evaluate and why: the champion when it was validated on this run's
    validation split (same encoded documents: same vocabulary), else this run's own version (a
    champion validated elsewhere may have another vocabulary)."""
    from dynlm.promotion import registered_name
    from pipelines import tracking

    name = registered_name(job.model_type)
    champion = tracking.version_by_alias(name, tracking.CHAMPION, tracking_uri=uri)
    run_tags = tracking.get_run(training.run_id, tracking_uri=uri).data.tags
    if champion is not None and \
            champion.tags.get(tracking.TAG_VALID_DATA_HASH) == run_tags[tracking.TAG_VALID_DATA_HASH]:
        return f"models:/{name}@{tracking.CHAMPION}", f"champion v{champion.version}"
    return f"models:/{name}/{training.model_version}", (
        f"v{training.model_version} (the champion was validated on other data)")


def run(args: argparse.Namespace) -> int:
    from dynlm.promotion import registered_name
    from pipelines import console, tracking
    from pipelines.commands.evaluate import load_any_model, open_prepared
    from pipelines.defaults import load_job
    from pipelines.prepare import prepare
    from pipelines.ray_env import init_ray
    from pipelines.train import check_workers_fit, run_training

    overrides = list(args.overrides)
    if args.tracking_uri:
        overrides.append(f"run.tracking_uri={args.tracking_uri}")
    job = load_job(args.config, overrides)
    uri = tracking.check_reachable(job.run.tracking_uri)  # before Ray starts
    job = job.replace(run={**job.run.to_dict(), "tracking_uri": uri})  # workers get the absolute URI
    start = t0 = time.monotonic()

    ensure_corpus(job, args.synth_documents)
    how = init_ray()
    check_workers_fit(job.run)  # before preparing: a one-line error, or a stated wait on a cluster
    print(f"[run] Ray: {how} ({_seconds(start)} with the corpus); preparing the data")
    prepared = prepare(job.data, task=job.task)  # prints where it wrote, its time and its table
    start = time.monotonic()
    print(f"[run] training {job.model_type} on {job.run.num_workers} Ray Train worker(s), "
          f"{job.train.epochs} epoch(s)")
    training = run_training(job, prepared)
    print(f"[run] MLflow run {training.run_id}: best valid objective {training.best_valid_objective:.4g} "
          f"after {training.epochs} epoch(s), {_seconds(start)}")

    if training.model_version is not None:
        model_uri, label = model_to_evaluate(job, uri, training)
    else:  # run.register=false: the best checkpoint
        model_uri, label = training.best_checkpoint_dir, "best checkpoint (not registered)"
    task, model, model_cfg, spec, preprocessor = load_any_model(model_uri, uri)
    open_prepared(str(prepared.root), spec, preprocessor)  # same encoding, else a clear error
    rows = list(prepared.iter_rows("test"))
    split = "test"
    if not rows:
        rows, split = list(prepared.iter_rows("valid")), "valid (the test split is empty)"
    metrics = task.evaluate_documents(model, model_cfg, rows, spec, job.train.batch_size)
    table = task.metric_table(metrics, f"{model_uri} [{label}] on the {split} split")
    print()
    print(table)
    if training.model_version is not None:  # the evaluation of a registered version is tracked with it
        tracking.log_evaluation(model_uri, task=task.name, data=f"{prepared.root} [{split}]", metrics=metrics,
                                table=table, tracking_uri=uri)

    print(f"[run] finished in {time.monotonic() - t0:.0f} s. Open the MLflow UI with:")
    if uri.startswith("sqlite:///"):
        print(f"  mlflow ui --backend-store-uri {shlex.quote(uri)} --port 5000   # then http://127.0.0.1:5000")
    else:
        print(f"  {uri}")
    print(f"  experiment {job.run.experiment!r}, run {training.run_id}; "
          f"registered model {registered_name(job.model_type)}")
    print(console.log_locations())
    return 0
