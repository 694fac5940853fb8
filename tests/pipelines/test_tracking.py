"""MLflow tracking + registry on a real SQLite store: one run per training, champion/challenger."""

from __future__ import annotations

import json

import pytest
import torch
from mlflow import MlflowClient

from dynlm import checkpoint
from pipelines import tracking
from pipelines.defaults import default_job
from tiny_lm import make_prepared_folder, make_tiny_lm


def _job(tmp_path, *overrides):
    return default_job([f"data.inputs=[{tmp_path / 'corpus'}]", "model.embed_dim=16",
                        "model.hidden_dim=16", *overrides])


def _training(tmp_path, name, job, prepared, seed, valid_ppls):
    """One tracked 'training': a run, per-epoch metrics, a checkpoint, finish. Returns (run_id, model)."""
    model, model_cfg, spec, _ = make_tiny_lm(tmp_path / name, seed=seed)
    run_id = tracking.start_training_run(job, prepared, run_name=name)
    history = []
    for epoch, valid_ppl in enumerate(valid_ppls):
        metrics = {"epoch": epoch, "train_ppl": valid_ppl * 0.8, "valid_ppl": valid_ppl,
                   "valid_ppl_first_mention": valid_ppl * 3, "padding_waste": 0.25,
                   "checkpoint_path": "/not/a/metric"}
        tracking.log_epoch_metrics(run_id, epoch, metrics)
        history.append(metrics)
    ckpt = checkpoint.save(tmp_path / name / "ckpt" / "model.pt", model, model_cfg, spec)
    tracking.finish_training_run(run_id, ckpt.parent, prepared, history)
    return run_id, model


def test_tracking_uri_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///rel/x.db")
    assert tracking.tracking_uri() == f"sqlite:///{tmp_path / 'rel' / 'x.db'}"  # made absolute
    assert tracking.tracking_uri("http://mlflow:5000") == "http://mlflow:5000"
    with pytest.raises(ValueError, match="file store is deprecated"):
        tracking.tracking_uri("some/folder")
    monkeypatch.delenv("DYNLM_MLFLOW_ARTIFACTS", raising=False)
    assert tracking.artifact_root(f"sqlite:///{tmp_path}/db/m.db") == (tmp_path / "db" / "mlartifacts").as_uri()


def test_flatten_config():
    flat = tracking.flatten_config({"model": {"dntm": {"merge_fn": "gru"}, "dim": 8},
                                    "data": {"inputs": ["a", "b"], "x": None}})
    assert flat == {"model.dntm.merge_fn": "gru", "model.dim": "8",
                    "data.inputs": '["a", "b"]', "data.x": "null"}


def test_one_run_per_training(tmp_path, mlflow_uri):
    job = _job(tmp_path)
    _, _, _, pre = make_tiny_lm(tmp_path / "pre")
    prepared = make_prepared_folder(tmp_path / "prepared", pre)
    run_id, _ = _training(tmp_path, "a", job, prepared, seed=0, valid_ppls=[30.0, 20.0, 25.0])

    client = MlflowClient(mlflow_uri, registry_uri=mlflow_uri)  # the registry global may point elsewhere
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["model.dntm.merge_fn"] == "gru"
    assert run.data.params["train.lr"] == str(job.train.lr)
    assert run.data.params["data.inputs"] == json.dumps([str(tmp_path / "corpus")])
    assert run.data.tags["data_hash"] == job.data.data_hash()
    assert run.data.tags["model_type"] == "dntm"
    history = client.get_metric_history(run_id, "valid_ppl")
    assert [(m.step, m.value) for m in history] == [(0, 30.0), (1, 20.0), (2, 25.0)]
    assert [m.value for m in client.get_metric_history(run_id, "padding_waste")] == [0.25] * 3
    assert "checkpoint_path" not in run.data.metrics
    assert run.data.metrics["best_valid_ppl"] == 20.0
    artifacts = {a.path for a in client.list_artifacts(run_id)} | {
        a.path for a in client.list_artifacts(run_id, "data")}
    assert {"config.yaml", "learning_curve.png", "history.json", "data/preprocessor.json",
            "data/manifest.json"} <= artifacts
    png = client.download_artifacts(run_id, "learning_curve.png", str(tmp_path))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # the artifacts went next to the database (the fixture's DYNLM_MLFLOW_ARTIFACTS folder)
    assert run.info.artifact_uri.startswith((tmp_path / "mlartifacts").as_uri())
    assert run.data.tags[tracking.TAG_MODEL_URI].startswith("models:/")


def test_champion_challenger(tmp_path, mlflow_uri):
    job = _job(tmp_path)
    _, _, _, pre = make_tiny_lm(tmp_path / "pre")
    prepared = make_prepared_folder(tmp_path / "prepared", pre)
    data_hash = job.data.data_hash()
    client = MlflowClient(mlflow_uri, registry_uri=mlflow_uri)  # the registry global may point elsewhere

    first, first_model = _training(tmp_path, "first", job, prepared, seed=1, valid_ppls=[40.0])
    result = tracking.register_and_promote(first, "dntm", 40.0, data_hash)
    assert (result.name, result.version, result.promoted) == ("dynlm-dntm", "1", True)
    assert "no champion" in result.reason

    worse, _ = _training(tmp_path, "worse", job, prepared, seed=2, valid_ppls=[45.0])
    result = tracking.register_and_promote(worse, "dntm", 45.0, data_hash)
    assert (result.version, result.promoted, result.champion_version) == ("2", False, "1")
    assert str(client.get_model_version_by_alias("dynlm-dntm", "champion").version) == "1"
    assert str(client.get_model_version_by_alias("dynlm-dntm", "challenger").version) == "2"

    better, better_model = _training(tmp_path, "better", job, prepared, seed=3, valid_ppls=[50.0, 35.0])
    result = tracking.register_and_promote(better, "dntm", 35.0, data_hash, margin=1.0)
    assert (result.version, result.promoted) == ("3", True)
    champion = client.get_model_version_by_alias("dynlm-dntm", "champion")
    assert str(champion.version) == "3"
    assert champion.tags["valid_ppl"] == "35.0" and champion.tags["data_hash"] == data_hash
    assert champion.tags["promotion"] == result.reason

    # other data: never promoted automatically, whatever the number
    other_job = _job(tmp_path, "data.vocab_size=999")
    other, _ = _training(tmp_path, "other", other_job, prepared, seed=4, valid_ppls=[5.0])
    result = tracking.register_and_promote(other, "dntm", 5.0, other_job.data.data_hash())
    assert result.promoted is False and "not comparable" in result.reason
    assert str(client.get_model_version_by_alias("dynlm-dntm", "champion").version) == "3"
    assert client.get_model_version("dynlm-dntm", "4").tags["promotion"] == result.reason

    # loading by alias gives the registered weights
    model, model_cfg, spec, preprocessor = tracking.load_model("models:/dynlm-dntm@champion")
    assert model_cfg.type == "dntm" and spec == preprocessor.spec
    loaded, expected, old = model.state_dict(), better_model.state_dict(), first_model.state_dict()
    assert loaded.keys() == expected.keys()
    for key in expected:
        assert torch.equal(loaded[key], expected[key]), key
    assert any(not torch.equal(loaded[k], old[k]) for k in old)


def test_register_needs_a_finished_run(tmp_path, mlflow_uri):
    job = _job(tmp_path)
    _, _, _, pre = make_tiny_lm(tmp_path / "pre")
    run_id = tracking.start_training_run(job, make_prepared_folder(tmp_path / "prepared", pre))
    with pytest.raises(ValueError, match="no logged model"):
        tracking.register_and_promote(run_id, "dntm", 10.0, job.data.data_hash())
