"""``dynlm tune`` killed with SIGKILL right after a trial finished: ``dynlm tune --resume`` re-runs
no finished trial, finishes the search, and leaves no RUNNING MLflow run and no process of the
killed run behind.

The kill is the ``tune:trial_finished`` point of :mod:`dynlm.faults`: the trial function, once
its training has ended and its MLflow run is FINISHED, SIGKILLs the search's driver before it
returns to Tune, so Tune's saved state still calls that trial unfinished. That is the hardest
moment for a resume (the trial is done in MLflow, not in Tune), and it is hit exactly, however
loaded the machine is. The other trial, which runs beside it, dies with the driver mid-training
(or, if it was quick, just after); its child run is left RUNNING by the dead driver either way
until the resume closes it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from train_process import ORPHANED_AGENTS_EXIT_S, RUN_TIMEOUT_S, left_after, ray_tmp, stop_and_remove

from dynlm.data.synth import SynthConfig, write_conll
from dynlm.faults import KILL_AT_ENV, KILL_PID_ENV
from pipelines.tracking import TAG_TRIAL_ID

MERGE_FNS = ["max", "latest"]


def _tune(processes, tmp: Path, ray_dir: Path, *args: str, kill_at: str | None = None) -> tuple[int, str]:
    env = {**os.environ, "RAY_TMPDIR": str(ray_dir), "DYNLM_MLFLOW_ARTIFACTS": str(tmp / "artifacts")}
    for variable in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", KILL_AT_ENV, KILL_PID_ENV):
        env.pop(variable, None)
    if kill_at:
        env[KILL_AT_ENV] = kill_at
    process = processes.run(
        [sys.executable, "-m", "pipelines.cli", "tune", *args, "--tracking-uri", f"sqlite:///{tmp / 'mlflow.db'}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=2 * RUN_TIMEOUT_S)
    return process.returncode, process.stdout.decode()


@pytest.fixture
def ray_tmps():
    folders = [ray_tmp(name) for name in ("tune-killed", "tune-resumed")]
    yield folders
    for folder in folders:
        stop_and_remove(folder)


def test_tune_killed_after_a_trial_finished_resumes_without_rerunning_it(tmp_path, ray_tmps, processes,
                                                                         empty_mlflow_db):
    killed_tmp, resumed_tmp = ray_tmps
    shutil.copy(empty_mlflow_db, tmp_path / "mlflow.db")
    write_conll(SynthConfig(num_documents=24, docs_per_file=12), tmp_path / "synth")
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({
        "base": {"data.inputs": [str(tmp_path / "synth")], "data.output_root": str(tmp_path / "prepared"),
                 "data.vocab_size": 300, "data.bpe_merges": 30, "data.num_encode_actors": 1,
                 "model.embed_dim": 16, "model.hidden_dim": 16, "train.epochs": 1, "train.batch_size": 4,
                 "run.num_workers": 1, "run.cpus_per_worker": 0.4, "run.max_failures": 0,
                 "run.storage_path": str(tmp_path / "ray")},
        "search": {"model.dntm.merge_fn": {"grid": MERGE_FNS}},
        "tune": {"num_samples": 1, "searcher": "random", "scheduler": "fifo", "max_concurrent_trials": 2, "seed": 0},
    }))

    returncode, text = _tune(processes, tmp_path, killed_tmp, "--space", str(space), "--name", "killed",
                             kill_at="tune:trial_finished")
    assert returncode == -signal.SIGKILL, (returncode, text[-3000:])
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    (experiment,) = [e for e in client.search_experiments() if e.name != "Default"]

    def runs(status: str | None = None) -> list:
        found = client.search_runs([experiment.experiment_id])
        return [r for r in found if status is None or r.info.status == status]

    finished_before = {r.data.tags[TAG_TRIAL_ID]: r.info.run_id for r in runs("FINISHED")}
    assert len(finished_before) >= 1, [(r.info.status, r.data.tags) for r in runs()]  # the trial that fired
    assert runs("RUNNING")  # the dead driver's parent run (and maybe a sibling trial's run)

    returncode, text = _tune(processes, tmp_path, resumed_tmp, "--resume", "killed", "--storage-path", str(tmp_path / "ray"))
    assert returncode == 0, text[-4000:]
    assert left_after(killed_tmp, ORPHANED_AGENTS_EXIT_S) == []  # nothing of the killed run's Ray is left
    assert left_after(resumed_tmp, 30) == []

    assert runs("RUNNING") == []  # nothing is left RUNNING: not the parent, not an attempt the kill cut off
    children = [r for r in runs("FINISHED") if "mlflow.parentRunId" in r.data.tags]
    by_trial = {}
    for run in children:
        by_trial.setdefault(run.data.tags[TAG_TRIAL_ID], []).append(run.info.run_id)
    assert len(by_trial) == len(MERGE_FNS) and all(len(ids) == 1 for ids in by_trial.values()), by_trial
    for trial_id, run_id in finished_before.items():  # a trial that finished before the kill was not re-run
        assert by_trial[trial_id] == [run_id]
    (parent,) = [r for r in runs() if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status == "FINISHED"
