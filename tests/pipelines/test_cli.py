"""User errors of the `dynlm` command: one line `dynlm: error: <message>`, exit status 2; the
traceback only with --verbose."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from pipelines import console
from pipelines.cli import USAGE_ERROR_EXIT_CODE, main


@pytest.fixture(autouse=True)
def _restore_output(monkeypatch, tmp_path):
    """main() configures the process's logging and environment; undo it after each test."""
    monkeypatch.chdir(tmp_path)
    for name in (console.VERBOSE_ENV, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "MLFLOW_CONFIGURE_LOGGING"):
        monkeypatch.delenv(name, raising=False)
    root = logging.getLogger()
    saved = list(root.handlers), root.level
    yield
    root.handlers[:], root.level = saved
    logging.captureWarnings(False)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_unknown_set_key_is_one_line(capsys):
    assert main(["run", "--set", "model.hidden_dimm=32"]) == USAGE_ERROR_EXIT_CODE
    assert _one_error_line(capsys) == "dynlm: error: override: unknown key 'model.hidden_dimm'"


@pytest.mark.parametrize("flag_first", [True, False])
def test_verbose_shows_the_traceback(capsys, flag_first):
    args = ["run", "--set", "model.hidden_dimm=32"]
    args = ["--verbose", *args] if flag_first else [*args, "--verbose"]
    assert main(args) == USAGE_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "dynlm.config.ConfigError: override: unknown key 'model.hidden_dimm'" in err
    assert err.splitlines()[-1] == "dynlm: error: override: unknown key 'model.hidden_dimm'"


def test_missing_input_folder_is_one_line(ray_session, tmp_path, capsys):
    missing = tmp_path / "no-such-corpus"
    assert main(["prepare", "--input", str(missing), "--output-root", str(tmp_path / "prepared")]) == 2
    assert _one_error_line(capsys) == (f"dynlm: error: DataConfig.inputs: {str(missing)!r} does not exist "
                                       f"(resolved to {missing})")


def test_unknown_registered_model_is_one_line(mlflow_uri, tmp_path, capsys):
    assert main(["evaluate", "--model", "models:/dynlm-nosuchmodel@champion", "--data", str(tmp_path)]) == 2
    assert _one_error_line(capsys) == "dynlm: error: Registered Model with name=dynlm-nosuchmodel not found"


def test_which_exceptions_are_user_errors():
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import (
        INVALID_PARAMETER_VALUE,
        RESOURCE_DOES_NOT_EXIST,
    )

    from dynlm.config import ConfigError
    from dynlm.data.prepared_writer import EmptyTrainSplit
    from dynlm.data.split import SplitRuleError
    from pipelines.cli import error_line, is_user_error

    assert is_user_error(ConfigError("x")) and is_user_error(FileNotFoundError("x"))
    assert is_user_error(FileExistsError("run 'a' already exists"))
    assert is_user_error(EmptyTrainSplit("no train document")) and is_user_error(SplitRuleError("mixed inputs"))
    assert is_user_error(MlflowException("no such model", error_code=RESOURCE_DOES_NOT_EXIST))
    assert not is_user_error(MlflowException("bad value", error_code=INVALID_PARAMETER_VALUE))
    from pipelines.tracking import TrackingServerUnreachable

    assert is_user_error(TrackingServerUnreachable("MLflow tracking server http://x is not reachable"))
    assert not is_user_error(ConnectionError("a Ray cluster is gone"))
    assert not is_user_error(ValueError("a bug")) and not is_user_error(KeyError("a bug"))
    assert error_line(ConfigError("first\n  second")) == "dynlm: error: first second"


def test_installed_command_prints_one_line(tmp_path, processes):
    dynlm = Path(sys.executable).parent / "dynlm"
    if not dynlm.exists():
        pytest.skip(f"{dynlm} is not installed (pip install -e .)")
    done = processes.run([str(dynlm), "run", "--set", "model.hidden_dimm=32"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", "dynlm: error: override: unknown key 'model.hidden_dimm'\n")


def test_a_bare_path_as_tracking_uri_is_one_line(capsys):
    assert main(["evaluate", "--model", "models:/dynlm-dntm@champion", "--data", "x", "--tracking-uri", "mydir"]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("dynlm: error: tracking URI 'mydir' is a bare path: MLflow's file store is deprecated; "
                           "use sqlite:///"), line


def test_retrain_config_that_is_a_folder_is_one_line(tmp_path, capsys):
    assert main(["retrain", "--config", str(tmp_path)]) == 2
    assert _one_error_line(capsys).startswith(f"dynlm: error: retrain --config {tmp_path}: [Errno 21] Is a directory")


def test_version_and_help_list_every_verb(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"dynlm {version('dynlm')}\n"
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    for verb in ("data", "prepare", "train", "evaluate", "suggest-name", "tune", "retrain", "run", "config"):
        assert f"\n    {verb}" in listed, verb


def test_ctrl_c_is_one_line_and_exit_130(tmp_path, capsys):
    """A real SIGINT (what Ctrl-C sends) while a verb runs: Python raises KeyboardInterrupt in the
    main thread, and the command ends with one line instead of a traceback."""
    import os
    import signal
    import threading
    import time

    from pipelines.cli import INTERRUPTED_EXIT_CODE

    def interrupt_once_the_verb_runs():  # it makes its output folder, then generates documents
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (tmp_path / "synth").is_dir():
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.01)

    # A new `dynlm` process has Python's default SIGINT handler; this one may not (Ray Tune leaves
    # its own installed after an in-process search), so the test installs the default for its run.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    sender = threading.Thread(target=interrupt_once_the_verb_runs)
    sender.start()
    try:  # 50,000 documents take far longer than the signal takes to arrive (and a bounded memory if not)
        code = main(["data", "synth", "--out", "synth", "--num-documents", "50000", "--docs-per-file", "1"])
    finally:
        sender.join()
        signal.signal(signal.SIGINT, previous)
    assert code == INTERRUPTED_EXIT_CODE
    assert _one_error_line(capsys) == "dynlm: interrupted"


@pytest.mark.parametrize("flags, message", [
    (["--test-fraction", "1"], "dynlm: error: test_fraction: must be in [0, 1), got 1.0"),
    (["--valid-fraction", "0.5", "--test-fraction", "0.5"],
     "dynlm: error: valid_fraction + test_fraction must be < 1 (no train data left), got 0.5 + 0.5"),
])
def test_cloze_builder_fractions_are_checked_before_ray(capsys, flags, message):
    """Checked at the command line: no Ray starts (a unit-tier test fails if one does)."""
    assert main(["data", "cloze", "--input", "corpus", "--out", "cloze", *flags]) == USAGE_ERROR_EXIT_CODE
    assert _one_error_line(capsys) == message
