"""``dynlm suggest-name``: a method-naming model's top-k names for every function of Python files.

The model is a registry/run URI (default ``models:/dynlm-naming@champion``) or a checkpoint of
the naming task (Allamanis et al., 2015; ``dynlm/tasks/naming.py``). Each function of each file
is printed with its actual name and the model's suggestions, most probable first; ``--json``
prints one JSON object per function instead (for scripts: with ``f1_at_1``, ``exact_at_1`` of
its top suggestion against the actual name and ``dunder``). As the functions have their names
already, the last lines score the top suggestions: F1@1 and exact@1 over all the functions and
over the non-dunder ones (``__init__``, ``__eq__``... left out: names Python dictates); with
``--json`` these go to stderr. A file that does not parse is reported and skipped; the exit
status is then 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EPILOG = """\
examples:
  dynlm suggest-name mymodule.py
  dynlm suggest-name --model models:/dynlm-naming/3 --top-k 3 pkg/a.py pkg/b.py
  dynlm suggest-name --model runs/ray/naming-2026/checkpoint_000004 --json mymodule.py
"""

DEFAULT_MODEL = "models:/dynlm-naming@champion"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "suggest-name", help="suggest method names for the functions of Python files (naming task)",
        description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", metavar="FILE.py", help="Python source files")
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"models:/NAME@ALIAS, models:/NAME/VERSION, runs:/ID/model or a checkpoint (default {DEFAULT_MODEL})")
    parser.add_argument("--top-k", type=int, default=5, help="suggestions per function (default 5)")
    parser.add_argument("--json", action="store_true", help="one JSON object per function")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    parser.set_defaults(func=run)


def format_suggestions(path: str, functions: list[dict]) -> str:
    """The terminal text for one file: a header line per function, then its ranked names."""
    lines = []
    for function in functions:
        lines.append(f"{path}:{function['lineno']}  {function['qualname']}  (actual: {function['name']})")
        for rank, (name, probability) in enumerate(function["suggestions"], 1):
            mark = "  <- actual" if name == function["name"] else ""
            lines.append(f"  {rank}. {name:<32} {probability:7.3f}{mark}")
    return "\n".join(lines) if lines else f"{path}: no functions"


def run(args: argparse.Namespace) -> int:
    from dynlm.tasks.base import NameSuggester
    from pipelines.commands.evaluate import load_any_model

    if args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    task, model, model_cfg, _, preprocessor = load_any_model(args.model, args.tracking_uri)
    if not isinstance(task, NameSuggester):
        raise ValueError(f"{args.model} is a model of the {task.name!r} task, which suggests no names "
                         "(train one with `task: naming`)")
    if preprocessor is None:
        raise ValueError(f"{args.model}: no preprocessor.json beside the checkpoint (its vocabularies)")
    failed, scored = 0, []
    for path in args.files:
        try:
            functions = task.suggest_source(model, model_cfg, preprocessor, Path(path).read_bytes(), path=path,
                                            top_k=args.top_k)  # bytes: decoded as Python does (coding cookie)
        except (OSError, ValueError) as exc:  # unreadable, or does not parse (UnparseableSource)
            print(f"dynlm suggest-name: {path}: {exc}", file=sys.stderr)
            failed += 1
            continue
        scored += functions
        if args.json:
            for function in functions:
                print(json.dumps({"file": path, **function}))
        else:
            print(format_suggestions(path, functions))
    if scored:  # stdout of --json keeps one object per line, each a function
        print(("" if args.json else "\n") + task.suggestion_summary(scored), file=sys.stderr if args.json else sys.stdout)
    return 1 if failed else 0
