"""``dynlm config show``: the effective job of ``--config`` / ``--set``, every setting written out.

What ``dynlm train`` with the same ``--config`` and ``--set`` would run, as YAML: a complete job
file (every section, every key, the defaults included), which ``dynlm train --config`` reads back
to the same job. ``$DYNLM_STORAGE_PATH`` applies as it does for ``train``.

Examples::

    dynlm config show                                   # the embedded default job
    dynlm config show --config job.yaml --set train.lr=1e-3
    dynlm config show > my_job.yaml                     # a complete file to start from
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "config", help="the effective job of --config / --set, as a complete YAML job file",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="config_command", required=True, metavar="<command>")
    show = sub.add_parser("show", help="print the effective job as YAML", description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    show.add_argument("--config", help="job YAML (data/model/train/run sections); default: the embedded job")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config value, e.g. train.lr=1e-3 (repeatable)")
    show.set_defaults(func=run_show)


def run_show(args) -> int:
    import yaml

    from pipelines.defaults import load_job

    job = load_job(args.config, list(args.overrides))  # a ConfigError names the bad key: one line, exit 2
    source = args.config or "the embedded default job (pipelines/defaults.py)"
    changes = f", with --set {' '.join(args.overrides)}" if args.overrides else ""
    sys.stdout.write(f"# the effective job of {source}{changes}\n")
    sys.stdout.write(yaml.safe_dump(job.to_dict(), sort_keys=False))
    return 0
