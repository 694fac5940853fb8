"""``dynlm tune``: a Ray Tune search over data and model settings (see pipelines/tune.py)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys

EPILOG = """\
examples:
  dynlm tune --space tune_spaces/quickstart.yaml              # 4 small trials, minutes on a laptop
  dynlm tune --space tune_spaces/dntm.yaml --set run.use_gpu=true --set run.num_workers=4
  dynlm tune --space tune_spaces/quickstart.yaml --set tune.num_samples=8 --name my-search
  dynlm tune --resume my-search                                # after Ctrl-C: finished trials are kept

environment: MLFLOW_TRACKING_URI (tracking server), DYNLM_STORAGE_PATH (run.storage_path, e.g.
s3://bucket/dynlm on a cluster; a --set run.storage_path or --storage-path wins).

exit status: 0 when at least one trial finished (failed trials are listed with their error);
1 when none did; 2 for a bad space file; 3 when interrupted (continue with --resume).

The space file format is documented at the top of every file in tune_spaces/. A bad space
(unknown key, empty choice, gamma outside (0, 1], negative merges ...) is reported before Ray starts.
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "tune", help="Ray Tune search (ASHA, random/grid/Optuna), MLflow parent + child runs",
        description="Search over data settings (bpe_merges, gamma, vocab_size) and model/training "
                    "settings; one trial = prepare (shared, content-addressed) + Ray Train + evaluation.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--space", help="search space YAML (tune_spaces/<name>.yaml)")
    parser.add_argument("--resume", metavar="EXPERIMENT",
                        help="continue an interrupted search: its name under run.storage_path, or its path/URI")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a base setting (run.num_workers=1) or a tune setting (tune.num_samples=8)")
    parser.add_argument("--name", help="experiment name (default: tune-<space>-<time>)")
    parser.add_argument("--storage-path", help="with --resume: where experiments live (default runs/ray)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    parser.add_argument("--json", action="store_true",
                        help="stdout: one JSON object (experiment, parent run, every trial, the best, its "
                             "registration); everything else goes to stderr")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os

    from dynlm.config import ConfigError
    from dynlm.job import with_storage_env
    from dynlm.search.space_file import load_search_space
    from pipelines.defaults import default_job
    from pipelines.tune import resume_search, run_search

    if bool(args.space) == bool(args.resume):
        raise ConfigError("tune: give exactly one of --space FILE or --resume EXPERIMENT")
    # --json: stdout holds the JSON object alone; what a person reads goes to stderr
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        if args.resume:
            if args.overrides or args.name:
                raise ConfigError("tune --resume: --set and --name cannot change a search being resumed")
            if args.tracking_uri:
                os.environ["MLFLOW_TRACKING_URI"] = args.tracking_uri
            result = resume_search(args.resume, storage_path=args.storage_path)  # None: $DYNLM_STORAGE_PATH
        else:
            overrides = with_storage_env(args.overrides)
            if args.tracking_uri:
                overrides.append(f"run.tracking_uri={args.tracking_uri}")
            # a SearchSpaceError (a ConfigError: one line, exit 2) comes before Ray starts, or before any trial
            space = load_search_space(args.space, overrides, base_job=default_job())
            result = run_search(space, experiment=args.name)
    if args.json:
        print(json.dumps(search_json(result)))
    if result.interrupted:
        return 3  # interrupted: resume with --resume
    if result.num_finished == 0:
        count = len(result.trials)
        print(f"dynlm: error: tune: no trial finished ({count} trial{'s' if count != 1 else ''}; errors above)",
              file=sys.stderr)
        return 1
    return 0


def search_json(result) -> dict:
    """``dynlm tune --json``'s object: the search, every trial, the best and its registration."""
    from pipelines.tracking import json_safe

    trials = [dataclasses.asdict(t) for t in result.trials]
    registration = result.registration
    return json_safe({
        "experiment": result.experiment, "experiment_path": result.experiment_path,
        "parent_run_id": result.parent_run_id, "interrupted": result.interrupted,
        "num_prepared": result.num_prepared, "num_trials": len(trials), "num_finished": result.num_finished,
        "wall_s": result.wall_s, "trials": trials,
        "best": dataclasses.asdict(result.best) if result.best is not None else None,
        "registration": dataclasses.asdict(registration) if registration is not None else None,
    })
