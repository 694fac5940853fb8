"""The cloze task (the SAW Reader) through the whole pipeline from an empty folder: CBT-format
files (one malformed block) -> ``dynlm prepare --task cloze`` (Ray Data) -> ``dynlm train`` (2 DDP
workers) -> ``dynlm-saw`` in the MLflow registry -> ``dynlm evaluate`` of the champion -> the pyfunc
model answering ``{document, query[, candidates]}`` rows (and refusing a bad one) -> ``mlflow
models serve`` of the champion over HTTP (a bad request is a 400 with its reason).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from server_process import BIN_DIR, free_port, post_json, running_server, server_env
from train_process import prepared_folder

from dynlm.data.prepared import PreparedData
from dynlm.data.synthetic_cloze import synthetic_cbt_text, write_synthetic_cbt
from pipelines.cli import main

JOB = {
    "task": "cloze",
    "data": {"inputs": ["cloze"], "bpe_merges": 30, "gamma": 0.5, "valid_fraction": 0.15, "test_fraction": 0.15},
    "model": {"embedding": "word+subword", "combine": "concat", "embed_dim": 24, "subword_dim": 12, "hidden_size": 24},
    "train": {"lr": 0.005, "epochs": 2, "batch_size": 32, "grad_clip": 5.0, "lr_schedule": "constant",
              "early_stopping_patience": 0},
    "run": {"num_workers": 2, "cpus_per_worker": 0.4, "experiment": "cloze"},
}


def test_cloze_prepares_trains_registers_evaluates_and_answers(ray_session, mlflow_uri, tmp_path, monkeypatch, capsys,
                                                               processes):
    import mlflow
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)
    write_synthetic_cbt(tmp_path / "cloze", 240, seed=2)
    block = synthetic_cbt_text(1, seed=99)
    (tmp_path / "cloze" / "cbtest_CN_broken.txt").write_text(block.replace("21 ", "22 ", 1) + block)  # 1 quarantined
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(JOB))

    assert main(["prepare", "--config", "job.yaml", "--no-progress"]) == 0
    out = capsys.readouterr().out
    root = prepared_folder(out)
    prepared = PreparedData.open(root)
    assert prepared.manifest["task"] == "cloze" and prepared.manifest["counts"]["quarantined"] == 1
    assert sum(prepared.num_documents(split) for split in ("train", "valid", "test")) == 241

    assert main(["train", "--config", "job.yaml"]) == 0
    out = capsys.readouterr().out
    assert "registered dynlm-saw v1" in out and "best valid error" in out
    client = MlflowClient(mlflow_uri)
    version = client.get_model_version_by_alias("dynlm-saw", "champion")
    assert version.tags["objective_metric"] == "error"
    run = client.get_run(version.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["best_valid_objective"] < 0.5  # chance is 0.9 (10 candidates)

    assert main(["evaluate", "--model", "models:/dynlm-saw@champion", "--data", str(root)]) == 0
    table = capsys.readouterr().out
    assert "answer out of vocabulary" in table and "answer class named_entity" in table
    # scored as a Ray Data job (an actor with the model, the cloze accumulator's sums added up
    # here): the same metrics as in this process
    scored = {}
    for how in ("never", "always"):
        assert main(["evaluate", "--model", "models:/dynlm-saw@champion", "--data", str(root), "--json",
                     "--ray-scoring", how, "--score-actors", "1"]) == 0
        scored[how] = json.loads(capsys.readouterr().out)
    assert scored["always"]["scored_on"].startswith("Ray Data") and scored["never"]["scored_on"] == "this process"
    assert scored["always"]["metrics"].keys() == scored["never"]["metrics"].keys()
    for key, value in scored["never"]["metrics"].items():  # None: a metric of an empty class
        assert scored["always"]["metrics"][key] == (value if value is None else pytest.approx(value, rel=1e-6)), key

    lines = block.splitlines()
    document = " ".join(line.split(" ", 1)[1] for line in lines[:20])
    query, answer, _, candidates = lines[20].split(" ", 1)[1].split("\t")
    served = mlflow.pyfunc.load_model("models:/dynlm-saw@champion")
    answers = served.predict(pd.DataFrame({"document": [document], "query": [query],
                                           "candidates": [candidates.split("|")]}))
    assert list(answers.columns) == ["row", "answer", "probability"]
    assert answers["answer"][0] in candidates.split("|") and 0.0 < answers["probability"][0] <= 1.0
    with pytest.raises(Exception, match="'query' must be non-empty"):
        served.predict(pd.DataFrame({"document": [document], "query": [""]}))

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [str(BIN_DIR / "mlflow"), "models", "serve", "-m", "models:/dynlm-saw@champion", "--env-manager", "local",
            "-h", "127.0.0.1", "-p", str(port)]
    with running_server(processes, argv, f"{base}/ping", tmp_path / "serve.log", server_env(MLFLOW_TRACKING_URI=mlflow_uri)):
        status, body = post_json(f"{base}/invocations", {"dataframe_records": [
            {"document": document, "query": query, "candidates": candidates.split("|")}]})
        assert status == 200, body
        (prediction,) = body["predictions"]
        assert prediction["answer"] == answers["answer"][0]
        assert abs(prediction["probability"] - answers["probability"][0]) < 1e-6
        status, body = post_json(f"{base}/invocations", {"dataframe_records": [{"document": document, "query": " "}]})
        assert status == 400 and "'query' must be non-empty" in body["message"]
