"""Child processes of a test, stopped when it ends (the ``processes`` fixture of ``tests/conftest.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

#: Every process the test suite starts carries this variable (tests/conftest.py sets it once per
#: session; children inherit it): the session-end check finds what outlived the suite by it.
SESSION_ENV = "DYNLM_TEST_SESSION"


class Processes:
    """Starts child processes for one test and stops each one's whole process group at the end.

    ``popen`` and ``run`` take :class:`subprocess.Popen`'s arguments; every child gets a process
    group of its own (``start_new_session``), so a child's own children are stopped too.
    """

    def __init__(self) -> None:
        self._started: list[subprocess.Popen] = []

    def popen(self, argv, **kwargs) -> subprocess.Popen:
        kwargs.setdefault("start_new_session", True)
        if kwargs.get("env") is not None:  # a hand-made environment still marks the child as ours
            kwargs["env"] = {**kwargs["env"], SESSION_ENV: os.environ[SESSION_ENV]}
        process = subprocess.Popen(argv, **kwargs)
        self._started.append(process)
        return process

    def run(self, argv, *, timeout: float, input=None, capture_output=False, text=None,
            **kwargs) -> subprocess.CompletedProcess:
        if capture_output:
            kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
        if input is not None:
            kwargs["stdin"] = subprocess.PIPE
        process = self.popen(argv, text=text, **kwargs)
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop(process)
            raise
        return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)

    @staticmethod
    def stop(process: subprocess.Popen, grace_s: float = 10.0) -> None:
        """SIGTERM the process's group, then SIGKILL it after ``grace_s``."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(process.pid, sig)
            except OSError:
                pass  # the group is gone
            try:
                process.wait(timeout=wait_s)
                if sig == signal.SIGTERM:
                    os.killpg(process.pid, signal.SIGKILL)  # the group's other members
                return
            except subprocess.TimeoutExpired:
                continue
            except OSError:
                return

    def stop_all(self) -> None:
        for process in self._started:
            if process.poll() is None:
                self.stop(process)
            else:
                try:
                    os.killpg(process.pid, signal.SIGKILL)  # what its own children left running
                except OSError:
                    pass


#: Helpers that multiprocessing starts for the pytest process itself (a spawn start method, torch's
#: shared memory): they exit when the pytest process does (their pipe closes), so they are not leaks.
TIED_TO_PYTEST = ("from multiprocessing.resource_tracker import main", "from multiprocessing.forkserver import main")


def processes_of_this_session() -> list[tuple[int, str]]:
    """(pid, command line) of the running processes, other than this one, whose environment
    carries this session's :data:`SESSION_ENV` value."""
    token = f"{SESSION_ENV}={os.environ[SESSION_ENV]}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if token not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state, parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if state == "Z":  # a zombie has ended; its parent only has not reaped it yet
            continue
        if int(parent) == os.getpid() and any(helper in command for helper in TIED_TO_PYTEST):
            continue
        found.append((int(entry.name), command))
    return found


def processes_using(folder: str) -> list[tuple[int, str]]:
    """(pid, command line) of the processes, other than this one, whose command line names
    ``folder`` or that hold a file open under it (a Ray's processes hold its session's logs, so
    this finds what is left of a Ray started with ``RAY_TMPDIR=folder``)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        if int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            paths = []
            for fd in (entry / "fd").iterdir():
                try:
                    paths.append(os.readlink(fd))
                except OSError:
                    pass
        except OSError:  # gone meanwhile, or another user's process
            continue
        if folder in command or any(path.startswith(folder) for path in paths):
            found.append((int(entry.name), command))
    return sorted(found)
