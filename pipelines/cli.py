"""The ``dynlm`` console script: ``dynlm <verb> ...``, one module per verb in
``pipelines/commands/`` (each registers its parser and the function that runs it).

What every verb shares: a user error (:func:`is_user_error`) is one line ``dynlm: error: ...`` and
exit status 2; Ctrl-C is one line and exit status 130 (``dynlm tune`` saves the search first and
exits 3: resume it with ``--resume``); ``--verbose`` shows the traceback and Ray's and MLflow's
own logs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

COMMANDS = ("data", "prepare", "train", "evaluate", "suggest", "tune", "retrain", "run", "config")
USAGE_ERROR_EXIT_CODE = 2  # what argparse exits with for a usage error
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a process Ctrl-C stopped
VERBOSE_HELP = "show Ray's and MLflow's own logs on the terminal, and the traceback of an error"


def user_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions that are the user's to fix, printed as ``dynlm: error: <message>`` (exit 2).

    A config typo or an unknown ``--set`` key (:class:`dynlm.config.ConfigError`, which
    includes Tune's SearchSpaceError), a missing input, config or checkpoint file
    (``FileNotFoundError``), a run name that is taken (``FileExistsError``), inputs that follow
    no single split rule or leave the train split empty, records quarantined under ``--strict``
    (``QuarantineError``); plus, in
    :func:`is_user_error`, a registered model or alias MLflow does not know and a tracking
    server that does not answer (``pipelines.tracking.TrackingServerUnreachable``).
    Anything else is a bug or an infrastructure failure and keeps its traceback.
    """
    from dynlm.config import ConfigError
    from dynlm.data.prepared_writer import EmptyTrainSplit
    from dynlm.data.publish import QuarantineError
    from dynlm.data.split import SplitRuleError

    return (ConfigError, FileNotFoundError, FileExistsError, EmptyTrainSplit, SplitRuleError, QuarantineError)


def is_user_error(exc: BaseException) -> bool:
    """True when ``exc`` is one of :func:`user_error_types`, MLflow's "does not exist" or a
    tracking server that does not answer."""
    if isinstance(exc, user_error_types()):
        return True
    tracking = sys.modules.get("pipelines.tracking")  # never imported: not its error
    if tracking is not None and isinstance(exc, tracking.TrackingServerUnreachable):
        return True
    mlflow_exceptions = sys.modules.get("mlflow.exceptions")  # never imported: not MLflow's error
    return (mlflow_exceptions is not None and isinstance(exc, mlflow_exceptions.MlflowException)
            and exc.error_code == "RESOURCE_DOES_NOT_EXIST")


def error_line(exc: BaseException) -> str:
    """``dynlm: error: <message>`` on one line (a multi-line message is joined)."""
    message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"dynlm: error: {message or type(exc).__name__}"


def _version() -> str:
    """The installed distribution's version (the source tree's when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dynlm")
    except PackageNotFoundError:
        from dynlm import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dynlm",
        description="Train and tune dynamic language models on Ray, tracked in MLflow.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="`dynlm <verb> --help` documents each verb. A user error is one line `dynlm: error: ...`, exit "
               "status 2; Ctrl-C exits 130.",
    )
    parser.add_argument("--version", action="version", version=f"dynlm {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="<verb>")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"pipelines.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"pipelines.commands.{name}":
                raise
            continue  # verb not built yet
        module.register(sub)
    for verb_parser in set(sub.choices.values()):  # also after the verb: `dynlm run --verbose`
        verb_parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                                 help=VERBOSE_HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one verb; a user error (:func:`is_user_error`) becomes one line and exit status 2."""
    from dynlm import faults
    from pipelines.console import configure_output

    faults.arm()  # DYNLM_KILL_AT (the kill -9 tests): before Ray starts, so its processes inherit it
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_output(args.verbose)
    try:
        code = args.func(args)
    except KeyboardInterrupt:
        if args.verbose:
            traceback.print_exc()
        print("dynlm: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except Exception as exc:
        if not is_user_error(exc):
            raise
        if args.verbose:
            traceback.print_exc()
        print(error_line(exc), file=sys.stderr)
        return USAGE_ERROR_EXIT_CODE
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
