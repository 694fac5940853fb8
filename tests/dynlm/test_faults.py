"""dynlm.faults: a kill point is a no-op unless armed, SIGKILLs the armed process when named,
and an unknown point's name is refused."""

from __future__ import annotations

import signal
import sys

import pytest

from dynlm import faults


def test_unarmed_kill_points_return(monkeypatch):
    monkeypatch.delenv(faults.KILL_AT_ENV, raising=False)
    for point in faults.KILL_POINTS:
        faults.kill_point(point)  # returns
    monkeypatch.setenv(faults.KILL_AT_ENV, "prepare:parsed")
    faults.kill_point("prepare:writing")  # armed elsewhere: returns


def test_an_unknown_kill_point_is_refused(monkeypatch):
    monkeypatch.setenv(faults.KILL_AT_ENV, "prepare:parsd")
    with pytest.raises(ValueError, match="not a kill point"):
        faults.arm()
    monkeypatch.delenv(faults.KILL_AT_ENV)
    with pytest.raises(ValueError, match="not one of KILL_POINTS"):
        faults.kill_point("prepare:parsd")  # a call site with a typo fails in every test run


def test_the_armed_point_sigkills_the_armed_process(processes):
    """A child process arms itself, passes one point, and dies with SIGKILL at the named one."""
    code = ("import os\nfrom dynlm import faults\nfaults.arm()\n"
            "faults.kill_point('prepare:parsed')\nprint('after parsed', flush=True)\n"
            "faults.kill_point('prepare:writing')\nprint('after writing', flush=True)\n")
    env = {faults.KILL_AT_ENV: "prepare:writing", "PATH": "/usr/bin:/bin"}
    done = processes.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": ":".join(sys.path)},
                         capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout == "after parsed\n"
    assert "SIGKILL of pid" in done.stderr and "at prepare:writing" in done.stderr
