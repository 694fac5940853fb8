"""The terminal output of `dynlm`: rank 0 -> driver progress relay, log routing."""

from __future__ import annotations

import io
import logging
import os
import sys
import warnings

import pytest

from dynlm.progress import format_epoch_line
from pipelines import console

RECORD = {"epoch": 2, "train_loss": 1.2, "train_ppl": 3.3, "valid_ppl": 2.9, "train_tokens_per_s": 1587.6,
          "train_seconds": 22.71, "valid_ppl_oov": float("inf")}
NAMING_RECORD = {"epoch": 3, "train_loss": 2.1, "train_ppl": 8.2, "valid_ppl": 7.9, "valid_f1_at_1": 0.392,
                 "valid_objective": 0.608, "objective_metric": "f1_error", "train_tokens_per_s": 1530.0,
                 "train_seconds": 4.1}


def test_training_console_prints_what_rank0_sends(ray_session):
    def rank0_reports(relay_name: str, record: dict) -> None:  # a closure: pickled by value
        """What train_fn_per_worker's rank 0 does with an EpochProgress, in a Ray task."""
        progress = console.EpochProgress(relay_name, world_size=2)
        progress.start_epoch(record["epoch"])
        progress.note("[train] note: something the user should know")
        progress.step({"steps": 3, "tokens": 100, "nll_sum": 250.0})
        progress.end_epoch({**record, "worker_node_ids": "a,b"})  # strings are not sent but the objective's name

    stream = io.StringIO()  # not a terminal: no bar, only the lines
    with console.TrainingConsole(epochs=4, steps_per_epoch=10, stream=stream) as training_console:
        task = ray_session.remote(num_cpus=0)(rank0_reports)
        for record in (RECORD, NAMING_RECORD):
            ray_session.get(task.remote(training_console.relay_name, record))
    note = "[train] note: something the user should know"
    assert stream.getvalue().splitlines() == [note, format_epoch_line(RECORD, 4), note, format_epoch_line(NAMING_RECORD, 4)]
    assert "F1@1 39.2 %" in format_epoch_line(NAMING_RECORD, 4) and "ppl" not in format_epoch_line(NAMING_RECORD, 4)
    with pytest.raises(ValueError, match="Failed to look up actor"):  # the relay is gone
        ray_session.get_actor(training_console.relay_name, namespace=console.RELAY_NAMESPACE)


def test_epoch_progress_without_relay_prints_notes_only(capsys):
    progress = console.EpochProgress(None)
    progress.start_epoch(1)
    progress.step({"steps": 1, "tokens": 10, "nll_sum": 5.0})
    progress.end_epoch(RECORD)
    progress.note("left out 1 document")
    assert capsys.readouterr().out == "left out 1 document\n"


@pytest.fixture
def restored_logging(monkeypatch):
    """Undo configure_output: environment, root handlers and level, library loggers."""
    for name in (console.VERBOSE_ENV, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "MLFLOW_CONFIGURE_LOGGING"):
        monkeypatch.delenv(name, raising=False)
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    libraries = {name: (list(logging.getLogger(name).handlers), logging.getLogger(name).propagate)
                 for name in console.LIBRARY_LOGGERS}
    # An earlier test's configure_output (through the CLI) left logging "capturing" while pytest
    # has since restored warnings.showwarning: captureWarnings(True) would then install nothing.
    logging.captureWarnings(False)
    yield
    for handler in root.handlers:
        if handler not in saved[0]:
            handler.close()
    root.handlers[:], root.level = saved
    for name, (handlers, propagate) in libraries.items():
        logging.getLogger(name).handlers[:], logging.getLogger(name).propagate = handlers, propagate
    logging.captureWarnings(False)


def test_configure_output_sends_library_logs_to_the_log_file(restored_logging, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(console.LOG_DIR_ENV, str(tmp_path / "logs"))
    ray_logger = logging.getLogger("ray")
    ray_logger.addHandler(logging.StreamHandler())  # as Ray's own terminal handler does
    path = console.configure_output(False)
    assert path.parent == tmp_path / "logs" and not path.exists()  # created at the first record
    assert console.ray_init_options() == {"log_to_driver": False}
    ray_logger.warning("a Ray warning")
    logging.getLogger("mlflow").info("an MLflow note")
    warnings.warn("a library's deprecation", DeprecationWarning, stacklevel=1)
    assert capsys.readouterr().err == ""
    text = path.read_text()
    for message in ("WARNING ray: a Ray warning", "INFO mlflow: an MLflow note", "a library's deprecation"):
        assert message in text
    assert console.log_locations().startswith(f"logs: {path}, Ray's in ")


def test_verbose_leaves_logging_alone(restored_logging):
    handlers = list(logging.getLogger().handlers)
    assert console.configure_output(True) is None
    assert console.verbose() and console.ray_init_options() == {"log_to_driver": True}
    assert logging.getLogger().handlers == handlers


def test_native_stderr_goes_to_the_log_file_and_python_stderr_stays(tmp_path, processes):
    """What native code writes to descriptor 2 (Ray's core worker logs its C++ notes there) goes to
    the .native.log beside the log file; dynlm's own lines (sys.stderr) stay on the terminal; an
    empty native log is removed at exit."""
    import subprocess

    script = ("import os, sys\n"
              "from pipelines.console import configure_output\n"
              "path = configure_output(False)\n"
              "if sys.argv[1] == 'write':\n"
              "    os.write(2, b'core_worker.cc: a native note\\n')\n"
              "print('dynlm: error: a line of our own', file=sys.stderr)\n")
    env = {**os.environ, console.LOG_DIR_ENV: str(tmp_path / "logs")}
    env.pop(console.VERBOSE_ENV, None)
    done = processes.run([sys.executable, "-c", script, "write"], env=env, stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "dynlm: error: a line of our own\n", done.stderr
    (native,) = (tmp_path / "logs").glob("*.native.log")
    assert native.read_text() == "core_worker.cc: a native note\n"
    native.unlink()
    done = processes.run([sys.executable, "-c", script, "quiet"], env=env, stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 0 and not list((tmp_path / "logs").glob("*.native.log"))
