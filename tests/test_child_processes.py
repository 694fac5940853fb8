"""The suite's own guards (tests/conftest.py, tests/child_processes.py): a child started through
the ``processes`` fixture is found by the session-end check while it runs, carries the session
marker even with a hand-made environment, and is stopped with its own children."""

from __future__ import annotations

import subprocess
import sys
import time

from child_processes import processes_of_this_session

# a child that starts a grandchild in its process group, prints the grandchild's pid, then waits
PARENT = ("import subprocess, sys, time\n"
          "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
          "print(child.pid, flush=True)\n"
          "time.sleep(120)\n")


def _pids() -> set[int]:
    return {pid for pid, _ in processes_of_this_session()}


def test_the_session_check_sees_a_child_and_its_grandchild_until_they_are_stopped(processes):
    parent = processes.popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE,
                             env={"PATH": "/usr/bin:/bin"})  # a hand-made environment: still marked
    grandchild = int(parent.stdout.readline())
    deadline = time.monotonic() + 10  # a process in the middle of its exec has no readable environ yet
    while not {parent.pid, grandchild} <= _pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert {parent.pid, grandchild} <= _pids()
    processes.stop_all()  # what the fixture does at teardown
    parent.stdout.close()
    deadline = time.monotonic() + 10
    while {parent.pid, grandchild} & _pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not {parent.pid, grandchild} & _pids()  # the whole group, not just the child
    assert parent.returncode is not None
