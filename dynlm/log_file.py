"""One log file per process for the root logger, created at its first record, not before.

``pipelines/console.py: configure_output`` points the root logger at it (``dynlm`` verbs log
Ray's and MLflow's messages there instead of on the terminal).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path


class LazyFileHandler(logging.FileHandler):
    """A FileHandler that creates its file (and folder) at the first record, not before."""

    def _open(self):
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def install_log_file(folder: str | Path) -> Path:
    """Log the root logger's INFO records and Python warnings to ``<folder>/dynlm-<time>-<pid>.log``.

    A log file installed before in this process is replaced (one file per process).

    Returns:
        The file (created only when something is logged).
    """
    path = Path(folder).resolve() / f"dynlm-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, LazyFileHandler)]:
        root.removeHandler(handler)  # installed again in one process (tests)
    handler = LazyFileHandler(path, delay=True, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)  # DeprecationWarnings of the libraries go to the file too
    return path


def installed_log_files() -> list[str]:
    """The files :func:`install_log_file` pointed the root logger at (none or one)."""
    return [h.baseFilename for h in logging.getLogger().handlers if isinstance(h, LazyFileHandler)]
