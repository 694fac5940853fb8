"""dynlm against a real MLflow tracking server (``mlflow server`` on a free local port, SQLite
backend, artifacts served by the server): train with 2 Ray Train workers, register and promote,
then evaluate the champion by its alias, everything through http://127.0.0.1:PORT."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from pipelines.cli import main

TINY = ["train.epochs=1", "train.batch_size=4", "model.embed_dim=16", "model.hidden_dim=16",
        "data.vocab_size=300", "data.bpe_merges=30", "run.cpus_per_worker=0.4", "run.num_workers=2"]


@pytest.mark.slow
def test_train_register_evaluate_through_a_server(ray_session, mlflow_server, tmp_path, monkeypatch, capsys):
    uri, artifacts = mlflow_server
    monkeypatch.chdir(tmp_path)  # the embedded job's corpus, prepared data and Ray storage go here
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DYNLM_MLFLOW_ARTIFACTS", raising=False)  # the server keeps its own artifacts
    args = ["train", "--tracking-uri", uri]
    for item in TINY:
        args += ["--set", item]
    assert main(args) == 0
    assert "[train] best valid ppl" in capsys.readouterr().out

    client = MlflowClient(uri, registry_uri=uri)
    champion = client.get_model_version_by_alias("dynlm-dntm", "champion")  # the first model is promoted
    assert client.get_model_version_by_alias("dynlm-dntm", "challenger").version == champion.version
    run = client.get_run(champion.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["run.num_workers"] == "2" and run.data.params["train.epochs"] == "1"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "valid_ppl")] == [1]
    assert run.info.artifact_uri.startswith("mlflow-artifacts:/")  # stored by the server, not by us
    assert any(path.name == "weights.pt" for path in artifacts.rglob("*"))
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlartifacts").exists()

    prepared = [p for p in (tmp_path / "runs" / "prepared").iterdir() if (p / "manifest.json").is_file()]
    assert main(["evaluate", "--model", "models:/dynlm-dntm@champion", "--data", str(prepared[0]),
                 "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "models:/dynlm-dntm@champion" in out and "all tokens" in out
