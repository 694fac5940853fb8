"""A task from outside dynlm goes through the whole pipeline without pipelines/ knowing it.

The character-level LM of ``tests/dynlm/tasks/char_task.py`` is named by its import path in the
job file (``task: tests.dynlm.tasks.char_task:CharTask``; the session's Ray workers have the
repository on their PYTHONPATH), and the README's commands do the rest, as a user would run them
from an empty folder: ``dynlm prepare`` -> ``dynlm train`` (2 DDP workers, Ray Train) -> the MLflow
registry -> ``dynlm evaluate`` of the registered champion.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.compute as pc
import yaml
from train_process import prepared_folder

from dynlm.data.prepared import PreparedData
from dynlm.data.synth import SynthConfig, write_conll
from pipelines.cli import main

REPO = Path(__file__).resolve().parents[2]
CHAR_TASK = "tests.dynlm.tasks.char_task:CharTask"
JOB = {
    "task": CHAR_TASK,
    "data": {"inputs": ["corpus"], "max_chars": 30},
    "model": {"embed_dim": 16, "hidden_dim": 32},
    "train": {"lr": 0.02, "epochs": 2, "batch_size": 4, "lr_schedule": "constant", "early_stopping_patience": 0},
    "run": {"num_workers": 2, "cpus_per_worker": 0.4, "experiment": "char", "system_metrics_s": 0.5},
}


def test_a_task_outside_dynlm_prepares_trains_registers_and_evaluates(ray_session, mlflow_uri, tmp_path,
                                                                     monkeypatch, capsys):
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)  # the default relative paths (runs/...), like a new user
    monkeypatch.syspath_prepend(str(REPO))  # the driver imports the task like the workers do
    write_conll(SynthConfig(num_documents=24, seed=5, docs_per_file=6), tmp_path / "corpus")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(JOB))

    assert main(["prepare", "--config", "job.yaml", "--no-progress"]) == 0
    out = capsys.readouterr().out
    root = prepared_folder(out)
    prepared = PreparedData.open(root)
    assert prepared.manifest["task"] == CHAR_TASK and prepared.root.parent == tmp_path / "runs" / "prepared"
    assert prepared.spec.num_units == 33 and all(prepared.num_documents(s) for s in ("train", "valid", "test"))

    assert main(["train", "--config", "job.yaml", "--json"]) == 0
    captured = capsys.readouterr()
    assert "registered dynlm-char v1" in captured.err  # --json: what a person reads goes to stderr ...
    assert "[train] system metrics of the run (rank 0's node): mean CPU " in captured.err
    (line,) = captured.out.splitlines()  # ... and stdout holds one JSON object
    trained = json.loads(line)
    assert (trained["model_version"], trained["task"], trained["epochs"]) == ("1", CHAR_TASK, 2)
    assert [r["epoch"] for r in trained["history"]] == [1, 2] and trained["prepared"] == str(root)
    client = MlflowClient(mlflow_uri)
    version = client.get_model_version_by_alias("dynlm-char", "champion")
    assert version.run_id == trained["run_id"]
    assert trained["best_valid_objective"] == min(r["valid_objective"] for r in trained["history"])
    run = client.get_run(version.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["model_type"] == "char"
    history = [run.data.metrics["valid_ppl"]]  # the last epoch's, a real perplexity of 33 classes
    assert 1.0 < history[0] < 33.0 and math.isfinite(run.data.metrics["best_valid_objective"])

    assert main(["evaluate", "--model", "models:/dynlm-char@champion", "--data", str(root)]) == 0
    table = capsys.readouterr().out
    chars = int(pc.sum(pc.list_value_length(prepared.read_columns("test", ["char_ids"])["char_ids"])).as_py())
    assert f"  {'characters':<16}{chars:>10}" in table.splitlines()
    assert "models:/dynlm-char@champion (char) on" in table
