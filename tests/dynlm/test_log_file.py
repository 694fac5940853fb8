"""The per-process log file: created at the first record, one at a time."""

from __future__ import annotations

import logging

import pytest

from dynlm.log_file import LazyFileHandler, install_log_file, installed_log_files


@pytest.fixture
def root_logging():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield root
    for handler in root.handlers:
        if handler not in saved[0]:
            handler.close()
    root.handlers[:], root.level = saved
    logging.captureWarnings(False)


def test_one_lazy_log_file_per_process(root_logging, tmp_path):
    first = install_log_file(tmp_path / "a")
    second = install_log_file(tmp_path / "b")  # replaces the first
    assert installed_log_files() == [str(second)]
    assert sum(isinstance(h, LazyFileHandler) for h in root_logging.handlers) == 1
    assert second.name.startswith("dynlm-") and second.suffix == ".log"
    assert not second.parent.exists()  # nothing logged yet
    logging.getLogger("some.library").info("a note")
    assert "INFO some.library: a note" in second.read_text()
    assert not first.exists()
