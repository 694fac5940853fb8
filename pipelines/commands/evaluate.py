"""``dynlm evaluate``: the paper's metric table for a registered model or a checkpoint.

The model is a registry/run URI (``models:/dynlm-dntm@champion``, ``runs:/<id>/model``) or a
checkpoint (a folder holding ``model.pt``, or the file). The data is a prepared folder (one of
its splits, which must have been encoded with the model's own preprocessor) or raw corpus files
and folders (read, anonymized and encoded here with the model's preprocessor; local paths).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterator

EPILOG = """\
examples:
  dynlm evaluate --model models:/dynlm-dntm@champion --data runs/prepared/<hash>
  dynlm evaluate --model runs/ray/dntm-2026/checkpoint_000003 --data corpus/test/ --format conll
  dynlm evaluate --model models:/dynlm-rnn@champion --data runs/prepared/<hash> --dynamic-eval
  dynlm evaluate --model models:/dynlm-rnn@champion --data runs/prepared/<hash> --dynamic-eval --eta 1e-3 --lam 2e-3
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
    parser.add_argument("--format", default="auto", choices=("auto", "conll", "text"), help="raw files' format")
    parser.add_argument("--lines-per-document", type=int, default=0,
                        help="raw plain text: cut documents every N non-empty lines (0: headings/files)")
    parser.add_argument("--too-many-chains", default="truncate", choices=("drop", "truncate"),
                        help="raw files: a document with more chains than the model knows is dropped "
                             "(and counted) or truncated (later chains keep their words); default truncate")
    parser.add_argument("--batch-size", type=int, default=16, help="documents per batch")
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
    parser.add_argument("--segment-len", type=int, default=20, help="dynamic eval tokens per update")
    parser.add_argument("--stats-data", metavar="PREPARED",
                        help="prepared folder whose train split gives the gradient statistics "
                             "(default: --data when it is a prepared folder)")
    parser.add_argument("--stats-segments", type=int, default=200,
                        help="train segments read for the gradient statistics")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    parser.set_defaults(func=run)


# ---------------------------------------------------------------------------------------------


def load_any_model(model: str, tracking_uri: str | None = None):
    """``(model, model_cfg, spec, preprocessor or None)`` from a model URI or a checkpoint path."""
    from dynlm import checkpoint
    from dynlm.data.preprocessor import Preprocessor
    from dynlm.storage import is_uri
    from pipelines import tracking

    if is_uri(model) or model.startswith(("models:/", "runs:/")):
        return tracking.load_model(model, tracking_uri=tracking_uri)
    path = tracking.find_checkpoint_file(model)
    torch_model, model_cfg, spec, _extra = checkpoint.load(path)
    torch_model.eval()
    pre_path = path.parent / "preprocessor.json"
    preprocessor = Preprocessor.load(pre_path) if pre_path.is_file() else None
    if preprocessor is not None and preprocessor.spec != spec:
        raise ValueError(f"{pre_path} does not match the checkpoint's vocabulary ({preprocessor.spec} != {spec})")
    return torch_model, model_cfg, spec, preprocessor


def is_prepared_folder(paths: list[str]) -> bool:
    from dynlm.data.prepared import is_prepared

    return len(paths) == 1 and is_prepared(paths[0])  # a local folder or a URI


def open_prepared(root: str, spec, preprocessor):
    """Open a prepared folder and check it was encoded for this model."""
    from dynlm.data.prepared import PreparedData

    prepared = PreparedData.open(root)
    if preprocessor is not None:
        same = prepared.preprocessor.to_dict() == preprocessor.to_dict()
    else:
        same = prepared.spec == spec
    if not same:
        raise ValueError(f"{root} was encoded with another preprocessor than the model's (different "
                         "vocabulary/BPE): its word ids mean other words. Pass the raw corpus files "
                         "instead; they are encoded with the model's own preprocessor.")
    return prepared


def _raw_files(paths: list[str]) -> list[Path]:
    from dynlm.storage import is_uri

    files: list[Path] = []
    for item in paths:
        if is_uri(item):
            raise ValueError(f"{item}: raw inputs must be local paths here (prepare remote data with "
                             "`dynlm prepare` and pass the prepared folder)")
        path = Path(item)
        if path.is_dir():
            files.extend(p for p in sorted(path.rglob("*"))
                         if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"--data {item} does not exist")
    if not files:
        raise ValueError(f"--data {paths}: no files found")
    return files


def raw_rows(paths: list[str], preprocessor, *, format: str = "auto", lines_per_document: int = 0,
             too_many_chains: str = "truncate", report: dict | None = None) -> Iterator[dict]:
    """Read, anonymize and encode raw corpus files with the model's preprocessor.

    Quarantined records and dropped documents are counted in ``report`` (``quarantined``,
    ``dropped``, ``documents``) and printed by the caller; nothing is skipped silently.
    """
    from dynlm.data.anonymize import anonymize
    from dynlm.data.schema import Quarantined

    report = {} if report is None else report
    report.update(documents=0, quarantined=0, dropped=0, reasons=[])
    for path in _raw_files(paths):
        for item in _parse(path, format, lines_per_document):
            if isinstance(item, Quarantined):
                report["quarantined"] += 1
                report["reasons"].append(f"{item.source_file}:{item.line} {item.doc_id}: {item.reason}")
                continue
            anonymized, _stats = anonymize(item, max_chains=preprocessor.max_chains,
                                           too_many_chains=too_many_chains)
            if anonymized is None:
                report["dropped"] += 1
                report["reasons"].append(f"{item['doc_id']}: more than {preprocessor.max_chains} chains (dropped)")
                continue
            row = preprocessor.encode_document(anonymized["sentences"])
            row.update(doc_id=anonymized["doc_id"], source_file=anonymized["source_file"])
            report["documents"] += 1
            yield row


def _parse(path: Path, format: str, lines_per_document: int):
    from dynlm.data.readers import parse_file

    return parse_file(path.read_bytes(), str(path), format, lines_per_document=lines_per_document)


def format_metrics_table(metrics: dict, title: str) -> str:
    """The LM task's table, with the accumulation analysis (:mod:`dynlm.tasks.lm_table`)."""
    from dynlm.tasks.lm_table import format_metrics_table as lm_table  # lazy: keeps `dynlm --help` fast

    return lm_table(metrics, title)


def evaluate_rows(model, spec, rows: list[dict], batch_size: int) -> dict:
    from dynlm.data.batching import batch_documents
    from dynlm.training import evaluate

    if not rows:
        raise ValueError("no documents to evaluate")
    return evaluate(model, batch_documents(rows, spec, batch_size, sort_by_length=True, seed=None))


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


def format_grid(grid: list[dict], best) -> str:
    """The eta x lambda grid of ``--eta auto`` (validation perplexity), the pick marked with ``*``."""
    lines = [f"dynamic evaluation: eta/lambda picked on validation ({len(grid)} settings)",
             f"  {'eta':>10}{'lambda':>10}{'valid ppl':>14}"]
    for point in grid:
        mark = " *" if (point["eta"], point["lambda"]) == (best.lr, best.decay) else ""
        lines.append(f"  {point['eta']:>10g}{point['lambda']:>10g}{point['ppl']:>14.2f}{mark}")
    return "\n".join(lines)


def run_dynamic_eval(args: argparse.Namespace, torch_model, spec, preprocessor, rows: list[dict]) -> str:
    """Dynamic evaluation of ``rows`` (``--eta auto``: eta/lambda picked first); the printed text."""
    from dynlm.data.batching import batch_documents
    from dynlm.dynamic_eval import (DEFAULT_ETAS, DEFAULT_LAMBDAS, DynamicEvalConfig, choose_dynamic_eval,
                                    collect_grad_stats, dynamic_evaluate)

    stats_root = args.stats_data or args.data[0]
    stats_data = open_prepared(stats_root, spec, preprocessor)
    train_rows = list(stats_data.iter_rows("train"))
    if not train_rows:
        raise SystemExit(f"dynlm evaluate --dynamic-eval: {stats_root} has no train documents")
    stats = collect_grad_stats(torch_model, batch_documents(train_rows, spec, args.batch_size, seed=0),
                               segment_len=args.segment_len, max_segments=args.stats_segments)
    text = []
    if args.eta == "auto":
        tune_root = args.tune_data or stats_root
        valid_rows = list(open_prepared(tune_root, spec, preprocessor).iter_rows("valid"))[: args.tune_documents]
        if not valid_rows:
            raise SystemExit(f"dynlm evaluate --eta auto: {tune_root} has no valid documents (give "
                             "--tune-data PREPARED or a number for --eta)")
        lambdas = DEFAULT_LAMBDAS if args.lam is None else (args.lam,)
        valid = list(batch_documents(valid_rows, spec, args.batch_size, seed=None))  # read once per setting
        cfg, grid = choose_dynamic_eval(torch_model, valid, stats, etas=DEFAULT_ETAS, lambdas=lambdas, eps=args.eps,
                                        segment_len=args.segment_len)
        text += [format_grid(grid, cfg) + f"\n  ({len(valid_rows)} valid documents of {tune_root})", ""]
    else:
        lam = DynamicEvalConfig().decay if args.lam is None else args.lam
        cfg = DynamicEvalConfig(lr=args.eta, decay=lam, eps=args.eps, segment_len=args.segment_len)
    dynamic = dynamic_evaluate(torch_model, batch_documents(rows, spec, args.batch_size, seed=None), cfg, stats)
    text.append(format_metrics_table(
        dynamic, f"dynamic evaluation (eta={cfg.lr:g}{' auto' if args.eta == 'auto' else ''}, "
                 f"lambda={cfg.decay:g}, eps={cfg.eps:g}, segment={cfg.segment_len})"))
    return "\n".join(text)


def run(args: argparse.Namespace) -> int:
    if args.dynamic_eval and not (args.stats_data or is_prepared_folder(args.data)):
        raise SystemExit("dynlm evaluate --dynamic-eval: give --stats-data PREPARED (its train "
                         "split gives the gradient statistics)")
    torch_model, model_cfg, spec, preprocessor = load_any_model(args.model, args.tracking_uri)
    prepared = None
    if is_prepared_folder(args.data):
        prepared = open_prepared(args.data[0], spec, preprocessor)
        split = args.split or "test"
        rows = list(prepared.iter_rows(split))
        source = f"{prepared.root} [{split}]"
    else:
        if args.split:
            raise SystemExit("dynlm evaluate: --split applies to a prepared folder, not to raw files")
        if preprocessor is None:
            raise SystemExit(f"dynlm evaluate: {args.model} has no preprocessor.json next to it; raw "
                             "files need one (use a registered model or a prepared folder)")
        report: dict = {}
        rows = list(raw_rows(args.data, preprocessor, format=args.format,
                             lines_per_document=args.lines_per_document,
                             too_many_chains=args.too_many_chains, report=report))
        source = f"{len(args.data)} path(s), {report['documents']} documents"
        if report["quarantined"] or report["dropped"]:
            print(f"evaluate: {report['quarantined']} record(s) quarantined, {report['dropped']} "
                  "document(s) dropped:", file=sys.stderr)
            for reason in report["reasons"][:20]:
                print(f"  {reason}", file=sys.stderr)
    metrics = evaluate_rows(torch_model, spec, rows, args.batch_size)
    print(format_metrics_table(metrics, f"{args.model} ({model_cfg.type}) on {source}"))

    if args.dynamic_eval:
        print()
        print(run_dynamic_eval(args, torch_model, spec, preprocessor, rows))
    return 0
