"""The ``dynlm`` console script.

Verbs (``dynlm <verb> --help`` documents each)::

    dynlm data synth     generate the embedded synthetic discourse corpus (CoNLL format)
    dynlm prepare        Ray Data: read, anonymize, fit vocabulary + BPE, encode to Parquet shards
    dynlm train          Ray Train DDP training, tracked in MLflow, registered as a challenger
    dynlm evaluate       the paper's metric table for a registered model or checkpoint
    dynlm tune           Ray Tune search over data and model settings
    dynlm retrain        scheduled retraining with champion/challenger promotion
    dynlm run            the whole embedded pipeline (the README's main command)
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("data", "prepare", "train", "evaluate", "tune", "retrain", "run")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dynlm",
        description="Train and tune dynamic language models on Ray, tracked in MLflow.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="<verb>")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"pipelines.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"pipelines.commands.{name}":
                raise
            continue  # verb not built yet
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code = args.func(args)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
