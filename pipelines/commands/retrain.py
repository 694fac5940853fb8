"""``dynlm retrain``: scheduled retraining with champion/challenger promotion (pipelines/retrain.py)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys

EPILOG = """\
the config (deploy/retrain.yaml is an LM example): model_type (required) names the registered
model dynlm-<model_type> (dntm, rnn, dynamical, saw, naming ...); data holds the new data, as
changes to the champion's own data: section: data.inputs (required) and any key of that task's
data config (an unknown key is an error naming the task); validation is the fixed set both
models are scored on, by the task's primary metric (perplexity, error, f1_error).

examples:
  dynlm retrain --config deploy/retrain.yaml
  dynlm retrain --config deploy/retrain.yaml --set data.output_root=/mnt/shared/prepared --set margin=0.02
  dynlm retrain --config deploy/retrain.yaml --set model_type=saw --set 'data={inputs: [questions/]}' --set validation=held_out/
  ray job submit --address http://HEAD:8265 --working-dir . -- dynlm retrain --config deploy/retrain.yaml

exit codes: 0 promoted, rejected or already done (nothing trained); 2 bad config;
3 conflict (the champion moved while this retrain ran: not promoted); 1 any other failure
(the registry is unchanged, the retrain run is FAILED in MLflow).
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "retrain", help="retrain on new documents; promote the challenger only if it beats the champion",
        description="Prepare new data through the champion's task (its readers and data settings) with "
                    "the champion's preprocessor, train a challenger (warm-started from the champion), "
                    "score both on a fixed validation set by the task's primary metric and move the "
                    "`champion` alias only if the challenger wins by the relative margin. Any task's "
                    "champion (lm, cloze, naming). Running it again on the same inputs trains nothing.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="retrain YAML (see deploy/retrain.yaml): model_type, data.inputs and validation are required")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a retrain setting, e.g. --set margin=0.02 (repeatable)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    parser.add_argument("--json", action="store_true",
                        help="stdout: one JSON object (decision, reason, versions, scores, run id); the rest goes "
                             "to stderr")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dynlm.config import ConfigError
    from pipelines.retrain import RetrainConfig, RetrainError, retrain

    try:  # a ConfigError or a missing file: one line, exit 2 (pipelines.cli.main)
        cfg = RetrainConfig.from_yaml(args.config, overrides=args.overrides)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ConfigError(f"retrain --config {args.config}: {exc}") from exc
    if args.tracking_uri:
        cfg = cfg.replace(tracking_uri=args.tracking_uri)
    try:  # --json: stdout holds the JSON object alone; what a person reads goes to stderr
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            result = retrain(cfg)
    except RetrainError as exc:
        print(f"dynlm: error: retrain: {exc}", file=sys.stderr)
        return 1
    if args.json:
        from pipelines.tracking import json_safe

        print(json.dumps(json_safe({**dataclasses.asdict(result), "exit_code": result.exit_code})))
    if result.exit_code:
        print(f"dynlm: error: retrain: {result.reason}", file=sys.stderr)
    return result.exit_code
