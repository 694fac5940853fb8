"""The method-naming task (Allamanis et al., 2015) through the whole pipeline, as a user runs it
from an empty folder: ``dynlm data synth-code`` -> ``dynlm prepare`` (Ray Data; an unparseable
file quarantined and counted) -> ``dynlm train`` (2 DDP workers, Ray Train) -> ``dynlm-naming``
in the MLflow registry -> ``dynlm evaluate`` of the champion -> ``dynlm suggest-name`` -> the
pyfunc model answering a request (and refusing a bad one).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from train_process import prepared_folder

from dynlm.data.prepared import PreparedData
from pipelines.cli import main

JOB = {
    "task": "naming",
    "data": {"inputs": ["code"], "valid_fraction": 0.2, "test_fraction": 0.2, "min_feature_count": 1},
    "model": {"type": "subtoken", "embed_dim": 32, "noise_samples": 8},
    "train": {"lr": 0.02, "epochs": 3, "batch_size": 32, "grad_clip": 5.0, "lr_schedule": "constant",
              "early_stopping_patience": 0},
    "run": {"num_workers": 2, "cpus_per_worker": 0.4, "experiment": "naming"},
}
SNIPPET = '''\
class Wallet:
    def __init__(self, balance):
        self._balance = balance

    def get_balance(self):
        return self._balance
'''


def test_naming_prepares_trains_registers_evaluates_and_suggests(ray_session, mlflow_uri, tmp_path, monkeypatch,
                                                                  capsys):
    import mlflow
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)  # the default relative paths (runs/...), like a new user
    assert main(["data", "synth-code", "--out", "code", "--num-files", "30", "--seed", "3"]) == 0
    (tmp_path / "code" / "broken.py").write_text("def oops(:\n    pass\n")  # quarantined, counted
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(JOB))
    capsys.readouterr()

    assert main(["prepare", "--config", "job.yaml", "--no-progress"]) == 0
    out = capsys.readouterr().out
    root = prepared_folder(out)
    prepared = PreparedData.open(root)
    assert prepared.manifest["task"] == "naming" and prepared.root.parent == tmp_path / "runs" / "prepared"
    assert prepared.manifest["counts"]["quarantined"] == 1
    assert all(prepared.num_documents(split) > 0 for split in ("train", "valid", "test"))

    assert main(["train", "--config", "job.yaml"]) == 0
    out = capsys.readouterr().out
    assert "registered dynlm-naming v1" in out and "best valid f1_error" in out
    client = MlflowClient(mlflow_uri)
    version = client.get_model_version_by_alias("dynlm-naming", "champion")
    assert version.tags["objective_metric"] == "f1_error"
    run = client.get_run(version.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["model_type"] == "naming"
    f1_error = run.data.metrics["best_valid_objective"]
    assert 0.0 <= f1_error < 0.6, f1_error  # names follow from bodies: far better than chance
    assert "suggestion_frequency.png" in {a.path for a in client.list_artifacts(run.info.run_id)}

    assert main(["evaluate", "--model", "models:/dynlm-naming@champion", "--data", str(root)]) == 0
    table = capsys.readouterr().out
    assert "models:/dynlm-naming@champion (naming) on" in table and "F1" in table

    (tmp_path / "wallet.py").write_text(SNIPPET)
    assert main(["suggest-name", "--model", "models:/dynlm-naming@champion", "--json", "--top-k", "3",
                 "wallet.py"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["qualname"], r["lineno"], r["name"]) for r in rows] == [
        ("Wallet.__init__", 2, "__init__"), ("Wallet.get_balance", 5, "get_balance")]
    assert all(1 <= len(r["suggestions"]) <= 3 for r in rows)
    probabilities = [p for _, p in rows[1]["suggestions"]]
    assert probabilities == sorted(probabilities, reverse=True) and 0.0 < sum(probabilities) <= 1.0 + 1e-6
    assert main(["suggest-name", "--model", "models:/dynlm-naming@champion", "code/broken.py"]) == 1
    assert "code/broken.py" in capsys.readouterr().err

    served = mlflow.pyfunc.load_model("models:/dynlm-naming@champion")
    answer = served.predict(pd.DataFrame({"source": [SNIPPET], "path": ["wallet.py"]}))  # as `models serve` gives it
    assert list(answer["qualname"]) == ["Wallet.__init__", "Wallet.get_balance"]
    assert list(answer.columns) == ["row", "path", "qualname", "lineno", "name", "suggestions", "probabilities"]
    assert len(answer["suggestions"][1]) == JOB_TOP_K and len(answer["probabilities"][1]) == JOB_TOP_K
    with pytest.raises(Exception, match="row 0: .*broken.py"):
        served.predict(pd.DataFrame({"source": ["def oops(:\n"], "path": ["broken.py"]}))
    with pytest.raises(Exception, match="no 'source' column"):
        served.predict(pd.DataFrame({"path": ["x.py"]}))


JOB_TOP_K = 5  # NamingModelConfig.top_k's default: what a served model suggests per function
