"""``dynlm evaluate``: the paper's metric table for a registered model or a checkpoint.

The model is a registry/run URI (``models:/dynlm-dntm@champion``, ``runs:/<id>/model``) or a
checkpoint (a folder holding ``model.pt``, or the file). The data is a prepared folder (one of
its splits, which must have been encoded with the model's own preprocessor) or raw corpus files
and folders (read, anonymized and encoded here with the model's preprocessor; local paths).

A prepared split larger than a few million tokens is scored as a Ray Data job (``--ray-scoring
auto``, :mod:`pipelines.scoring`): actors that load the model once each, GPU actors with
``--use-gpu``, on the cluster ``dynlm`` joins or a local Ray; the command's process adds up the
metric sums only. A smaller split, and raw files, are read and scored in this process.
``--dynamic-eval`` is the task's dynamic evaluation (``task.dynamic_evaluate_documents``, the
LM's: Krause et al., 2018), which adapts the weights document after document; the documents it
reads (scored, training, validation) are loaded here, in this process.
"""

from __future__ import annotations

import argparse
import json
import sys

from dynlm.config import ConfigError

EPILOG = """\
examples:
  dynlm evaluate --model models:/dynlm-dntm@champion --data runs/prepared/<hash>
  dynlm evaluate --model runs/ray/dntm-2026/checkpoint_000003 --data corpus/test/ --format conll
  dynlm evaluate --model models:/dynlm-rnn@champion --data runs/prepared/<hash> --dynamic-eval
  dynlm evaluate --model models:/dynlm-rnn@champion --data runs/prepared/<hash> --dynamic-eval --eta 1e-3 --lam 2e-3
  dynlm evaluate --model models:/dynlm-dntm@champion --data s3://bucket/prepared/<hash> --ray-scoring always --use-gpu
"""

def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "evaluate", help="the paper's metric table for a registered model or checkpoint",
        description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True,
                        help="models:/NAME@ALIAS, models:/NAME/VERSION, runs:/ID/model, or a checkpoint folder/file")
    parser.add_argument("--data", required=True, nargs="+", metavar="PATH",
                        help="a prepared folder (with manifest.json), or raw corpus files/folders")
    parser.add_argument("--split", default=None, choices=("train", "valid", "test"),
                        help="split of a prepared folder (default: test); not allowed with raw files")
    parser.add_argument("--format", choices=("auto", "conll", "text"), help="raw files' format (LM task; default auto)")
    parser.add_argument("--lines-per-document", type=int,
                        help="raw plain text: cut documents every N non-empty lines (0: headings/files)")
    parser.add_argument("--too-many-chains", choices=("drop", "truncate"),
                        help="raw files: a document with more chains than the model knows is dropped "
                             "(and counted) or truncated (later chains keep their words); default truncate")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="data_overrides",
                        help="raw files: override a setting of the task's data config (repeatable)")
    parser.add_argument("--batch-size", type=int, default=16, help="documents per batch")
    parser.add_argument("--ray-scoring", choices=("auto", "always", "never"), default="auto",
                        help="score a prepared split as a Ray Data job: auto (default) when it is larger "
                             "than a few million tokens (pipelines/scoring.py), always, or never (in this process)")
    parser.add_argument("--score-actors", type=int, default=None,
                        help="Ray scoring: model actors (default: one per GPU with --use-gpu, else one per "
                             "CPU of the cluster, sharing all CPUs but one, left to the read tasks)")
    parser.add_argument("--use-gpu", action="store_true", help="Ray scoring: one GPU per actor")
    parser.add_argument("--dynamic-eval", action="store_true",
                        help="also evaluate with dynamic evaluation (Krause et al., 2018); needs a "
                             "prepared folder for the gradient statistics (its train split)")
    parser.add_argument("--eta", type=_eta, default="auto",
                        help="dynamic eval step size, or 'auto' (default): the best of a small grid of "
                             "eta x lambda on validation documents (see --tune-data)")
    parser.add_argument("--lam", type=float, default=None,
                        help="dynamic eval decay towards the trained weights (default: searched with "
                             "--eta auto, else 0.02)")
    parser.add_argument("--tune-data", metavar="PREPARED",
                        help="prepared folder whose valid split picks eta/lambda for --eta auto "
                             "(default: the --stats-data folder)")
    parser.add_argument("--tune-documents", type=int, default=50,
                        help="validation documents read per grid point with --eta auto")
    parser.add_argument("--eps", type=float, default=1e-3, help="dynamic eval epsilon added to the RMS statistics")
    parser.add_argument("--segment-len", type=int, default=20,
                        help="dynamic eval tokens per update (a DNTM: whole sentences, at least this many)")
    parser.add_argument("--stats-data", metavar="PREPARED",
                        help="prepared folder whose train split gives the gradient statistics "
                             "(default: --data when it is a prepared folder)")
    parser.add_argument("--stats-segments", type=int, default=200,
                        help="train segments read for the gradient statistics")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (model, data, metrics, dynamic evaluation) instead of the tables")
    parser.set_defaults(func=run)


# ---------------------------------------------------------------------------------------------


def load_any_model(model: str, tracking_uri: str | None = None):
    """``(task, model, model_cfg, spec, preprocessor or None)`` from a model URI or a checkpoint path."""
    from dynlm.checkpoint import load_checkpoint
    from dynlm.checkpoint_folder import find_checkpoint_file
    from dynlm.storage import is_uri
    from pipelines import tracking

    if is_uri(model) or model.startswith(("models:/", "runs:/")):
        if model.startswith(("models:/", "runs:/")):
            tracking.check_reachable(tracking_uri)  # seconds, not MLflow's minutes of retries
        return tracking.load_model(model, tracking_uri=tracking_uri)
    path = find_checkpoint_file(model)
    loaded = load_checkpoint(path)
    pre_path = path.parent / "preprocessor.json"
    preprocessor = loaded.task.load_preprocessor(pre_path.read_text(encoding="utf-8")) if pre_path.is_file() else None
    if preprocessor is not None and preprocessor.spec != loaded.spec:
        raise ValueError(f"{pre_path} does not match the checkpoint's vocabulary ({preprocessor.spec} != {loaded.spec})")
    return loaded.task, loaded.model, loaded.model_cfg, loaded.spec, preprocessor


def is_prepared_folder(paths: list[str]) -> bool:
    from dynlm.data.prepared import is_prepared

    return len(paths) == 1 and is_prepared(paths[0])  # a local folder or a URI


def open_prepared(root: str, spec, preprocessor):
    """Open a prepared folder and check it was encoded for this model."""
    from dynlm.data.prepared import PreparedData

    prepared = PreparedData.open(root)
    if preprocessor is not None:
        same = prepared.preprocessor.to_json() == preprocessor.to_json()
    else:
        same = prepared.spec == spec
    if not same:
        raise ValueError(f"{root} was encoded with another preprocessor than the model's (different "
                         "vocabulary/BPE): its word ids mean other words. Pass the raw corpus files "
                         "instead; they are encoded with the model's own preprocessor.")
    return prepared


def raw_rows(task, paths: list[str], preprocessor, args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """Raw corpus files read, parsed and encoded with the model's preprocessor: the task's own
    prepare stages in this process (:func:`dynlm.tasks.local.prepare_in_memory`), every document
    whatever its split. Returns ``(encoded rows, dropped and quarantined records)``."""
    from dynlm.tasks.local import files_table, prepare_in_memory

    cfg = task.evaluation_data_config(preprocessor, paths)
    flags = {key: getattr(args, key) for key in ("format", "lines_per_document", "too_many_chains")
             if getattr(args, key) is not None}
    cfg = cfg.replace(**flags).with_overrides(args.data_overrides)
    files = cfg.input_files()  # the files the task's data config keeps (naming: *.py)
    if not files:
        raise ValueError(f"--data {paths}: no files found")
    done = prepare_in_memory(task, files_table(files), cfg, preprocessor=preprocessor, require_train=False)
    return done.rows(), done.rejected()


MAX_REJECTED_SHOWN = 20


def rejected_report(rows: list[dict], rejected: list[dict]) -> str:
    """What the raw-file path read, quarantined and dropped, as ``prepare`` counts it: one line
    of counts, then each record's file, line, document and reason (the first
    :data:`MAX_REJECTED_SHOWN`, then how many more)."""
    kinds = [r["kind"] for r in rejected]
    lines = [f"evaluate: {len(rows)} document(s) read, {kinds.count('quarantine')} record(s) quarantined, "
             f"{kinds.count('dropped')} document(s) dropped"]
    for r in rejected[:MAX_REJECTED_SHOWN]:
        where = f"{r['source_file']}:{r['line']}" if r["line"] else r["source_file"]
        lines.append(f"  {r['kind']} {where} {r['doc_id'] or '(whole file)'}: {r['reason']}")
    if len(rejected) > MAX_REJECTED_SHOWN:
        lines.append(f"  ... and {len(rejected) - MAX_REJECTED_SHOWN} more")
    return "\n".join(lines)


def _eta(text: str) -> float | str:
    """``--eta``: a non-negative float or ``auto``."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--eta must be a number or 'auto', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"--eta must be >= 0, got {text}")
    return value


#: the flags that set dynamic evaluation: the keys of the task's ``dynamic_evaluation_options``
DYNAMIC_EVAL_FLAGS = ("eta", "lam", "eps", "segment_len", "stats_segments", "batch_size")


def dynamic_eval_rows(args: argparse.Namespace, spec, preprocessor) -> tuple[list[dict], list[dict], str]:
    """The documents ``--dynamic-eval`` reads besides the scored ones: ``(train rows of the
    --stats-data folder (the gradient statistics), the first --tune-documents valid rows of the
    --tune-data folder (eta/lambda picked on them; none with a numeric --eta), which ones those are)``."""
    stats_root = args.stats_data or args.data[0]
    stats_rows = list(open_prepared(stats_root, spec, preprocessor).iter_rows("train"))
    if not stats_rows:
        raise ConfigError(f"evaluate --dynamic-eval: {stats_root} has no train documents")
    if args.eta != "auto":
        return stats_rows, [], ""
    tune_root = args.tune_data or stats_root
    valid_rows = list(open_prepared(tune_root, spec, preprocessor).iter_rows("valid"))[: args.tune_documents]
    if not valid_rows:
        raise ConfigError(f"evaluate --eta auto: {tune_root} has no valid documents (give "
                          "--tune-data PREPARED or a number for --eta)")
    return stats_rows, valid_rows, f"{len(valid_rows)} valid documents of {tune_root}"


def score_on_ray(args: argparse.Namespace, task, torch_model, model_cfg, spec, prepared, split: str):
    """``(metrics, documents, where)`` of ``split`` scored as a Ray Data job (:mod:`pipelines.scoring`)
    on the Ray ``dynlm`` reaches (:func:`pipelines.ray_env.init_ray`)."""
    import contextlib

    from pipelines.ray_env import init_ray
    from pipelines.scoring import score_split

    if args.score_actors is not None and args.score_actors < 1:
        raise ConfigError(f"evaluate --score-actors must be at least 1, got {args.score_actors}")
    with contextlib.redirect_stdout(sys.stderr):  # --json: stdout holds the JSON object alone
        init_ray()
    try:
        return score_split(task, torch_model, model_cfg, spec, prepared, split, batch_size=args.batch_size,
                           actors=args.score_actors, use_gpu=args.use_gpu)
    except ValueError as exc:  # no GPU on the cluster, an empty split: one line
        raise ConfigError(f"evaluate: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    from pipelines.tracking import json_safe

    if args.dynamic_eval and not (args.stats_data or is_prepared_folder(args.data)):
        raise ConfigError("evaluate --dynamic-eval: give --stats-data PREPARED (its train "
                         "split gives the gradient statistics)")
    task, torch_model, model_cfg, spec, preprocessor = load_any_model(args.model, args.tracking_uri)
    if args.dynamic_eval:
        if not task.dynamic_evaluation:
            raise ConfigError(f"evaluate --dynamic-eval: the {task.name!r} task's models have no dynamic evaluation "
                              "(the LM task's have)")
        options = task.dynamic_evaluation_options.from_dict({key: getattr(args, key) for key in DYNAMIC_EVAL_FLAGS})
    prepared, metrics, scored_on = None, None, "this process"
    if is_prepared_folder(args.data):
        from pipelines.scoring import scores_on_ray

        prepared = open_prepared(args.data[0], spec, preprocessor)
        split = args.split or "test"
        source = f"{prepared.root} [{split}]"
        if args.use_gpu and args.ray_scoring == "never":
            raise ConfigError("evaluate: --use-gpu scores on Ray's GPU actors; drop --ray-scoring never")
        if scores_on_ray("always" if args.use_gpu else args.ray_scoring, prepared, split):
            metrics, num_documents, scored_on = score_on_ray(args, task, torch_model, model_cfg, spec, prepared, split)
        rows = list(prepared.iter_rows(split)) if metrics is None or args.dynamic_eval else None
    else:
        if args.split:
            raise ConfigError("evaluate: --split applies to a prepared folder, not to raw files")
        if args.ray_scoring == "always" or args.use_gpu:
            raise ConfigError("evaluate: --ray-scoring always / --use-gpu score a prepared folder (run "
                              "`dynlm prepare` on the files first); raw files are scored in this process")
        if preprocessor is None:
            raise ConfigError(f"evaluate: {args.model} has no preprocessor.json next to it; raw "
                             "files need one (use a registered model or a prepared folder)")
        rows, rejected = raw_rows(task, args.data, preprocessor, args)
        source = f"{len(args.data)} path(s), {len(rows)} documents"
        print(rejected_report(rows, rejected), file=sys.stderr)
    if metrics is None:
        metrics, num_documents = task.evaluate_documents(torch_model, model_cfg, rows, spec, args.batch_size), len(rows)
    elif not args.json:
        print(f"[evaluate] {num_documents} documents scored as a Ray Data job ({scored_on})", file=sys.stderr)
    table = task.metric_table(metrics, f"{args.model} ({task.model_name(model_cfg)}) on {source}")
    if not args.json:
        print(table, flush=True)
    out = {"model": args.model, "task": task.name, "model_name": task.model_name(model_cfg), "data": source,
           "documents": num_documents, "scored_on": scored_on, "metrics": metrics}
    if args.dynamic_eval:
        stats_rows, valid_rows, grid_source = dynamic_eval_rows(args, spec, preprocessor)
        out["dynamic_evaluation"] = task.dynamic_evaluate_documents(
            torch_model, model_cfg, spec, rows, stats_rows=stats_rows, valid_rows=valid_rows, options=options)
        dynamic_text = task.dynamic_evaluation_text(out["dynamic_evaluation"], grid_source)
        table += "\n\n" + dynamic_text
        if not args.json:
            print()
            print(dynamic_text)
    if args.model.startswith(("models:/", "runs:/")):  # a tracked model: the evaluation is tracked too
        from pipelines import tracking

        out["mlflow_run_id"] = tracking.log_evaluation(
            args.model, task=task.name, data=source, metrics=metrics, table=table,
            extra=json_safe({k: v for k, v in out.items() if k != "metrics"}), tracking_uri=args.tracking_uri)
        if not args.json:
            print(f"[evaluate] logged as MLflow run {out['mlflow_run_id']} (experiment "
                  f"{tracking.EVALUATE_EXPERIMENT!r})")
    if args.json:
        print(json.dumps(json_safe(out)))
    return 0
