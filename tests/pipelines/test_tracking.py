"""MLflow tracking + registry on a real SQLite store: one run per training, champion/challenger."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from tiny_lm import make_prepared_folder, make_tiny_lm

from dynlm import checkpoint, promotion
from pipelines import tracking
from pipelines.defaults import default_job

REPO = Path(__file__).resolve().parents[2]


def _job(tmp_path, *overrides):
    corpus = tmp_path / "corpus"  # data_hash() reads what the inputs contain: they must exist
    corpus.mkdir(exist_ok=True)
    (corpus / "doc.txt").write_text("The cat sat .\n", encoding="utf-8")
    return default_job([f"data.inputs=[{tmp_path / 'corpus'}]", "model.embed_dim=16",
                        "model.hidden_dim=16", *overrides])


def _training(tmp_path, name, job, prepared, seed, valid_ppls, tags=None):
    """One tracked 'training': a run, per-epoch metrics, a checkpoint, finish. Returns (run_id, model)."""
    model, model_cfg, spec, _ = make_tiny_lm(tmp_path / name, seed=seed)
    run_id = tracking.start_training_run(job, prepared, run_name=name, tags=tags)
    history = []
    for epoch, valid_ppl in enumerate(valid_ppls):
        metrics = {"epoch": epoch, "train_ppl": valid_ppl * 0.8, "valid_ppl": valid_ppl, "valid_objective": valid_ppl,
                   "objective_metric": "ppl",
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
    assert run.data.tags["valid_data_hash"] == promotion.valid_data_hash(prepared)
    assert run.data.tags["dynlm.kind"] == "training"
    assert run.data.tags["model_type"] == "dntm"
    history = client.get_metric_history(run_id, "valid_ppl")
    assert [(m.step, m.value) for m in history] == [(0, 30.0), (1, 20.0), (2, 25.0)]
    assert [m.value for m in client.get_metric_history(run_id, "padding_waste")] == [0.25] * 3
    assert "checkpoint_path" not in run.data.metrics
    assert run.data.metrics["best_valid_objective"] == 20.0
    artifacts = {a.path for a in client.list_artifacts(run_id)} | {
        a.path for a in client.list_artifacts(run_id, "data")}
    assert {"config.yaml", "learning_curve.png", "history.json", "data/preprocessor.json",
            "data/manifest.json"} <= artifacts
    png = client.download_artifacts(run_id, "learning_curve.png", str(tmp_path))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # the artifacts went next to the database (the fixture's DYNLM_MLFLOW_ARTIFACTS folder)
    assert run.info.artifact_uri.startswith((tmp_path / "mlartifacts").as_uri())
    assert run.data.tags[tracking.TAG_MODEL_URI].startswith("models:/")


def _prepared_with_valid_shard(folder, pre, content: bytes):
    """A tiny prepared folder whose valid split is one file with these bytes (its identity)."""
    prepared = make_prepared_folder(folder, pre)
    (folder / "valid").mkdir()
    (folder / "valid" / "part-00000.parquet").write_bytes(content)
    return prepared


def test_runs_are_found_by_tags_not_names(tmp_path, mlflow_uri):
    job = _job(tmp_path)
    _, _, _, pre = make_tiny_lm(tmp_path / "pre")
    prepared = make_prepared_folder(tmp_path / "prepared", pre)
    # the same run name twice: only the tag tells the trials apart
    first = tracking.start_training_run(job, prepared, run_name="same", tags={tracking.TAG_TRIAL_ID: "t1"})
    second = tracking.start_training_run(job, prepared, run_name="same", tags={tracking.TAG_TRIAL_ID: "t2"})
    tracking.end_run(second, "FINISHED", tags={"note": "done"})
    experiment_id = tracking.get_run(first).info.experiment_id
    assert [r.info.run_id for r in tracking.find_runs(experiment_id, {tracking.TAG_TRIAL_ID: "t1"})] == [first]
    assert [r.info.run_id for r in tracking.find_runs(experiment_id, {"dynlm.kind": "training"})] == [first, second]
    assert tracking.find_runs(experiment_id, {tracking.TAG_TRIAL_ID: "t1"}, status="FINISHED") == []
    (done,) = tracking.find_runs(experiment_id, {tracking.TAG_TRIAL_ID: "t2"}, status="FINISHED")
    assert done.data.tags["note"] == "done"
    with pytest.raises(ValueError, match="cannot be searched"):
        tracking.find_runs(experiment_id, {tracking.TAG_TRIAL_ID: "it's"})


def test_champion_challenger(tmp_path, mlflow_uri):
    job = _job(tmp_path)
    _, _, _, pre = make_tiny_lm(tmp_path / "pre")
    prepared = make_prepared_folder(tmp_path / "prepared", pre)
    data_hash, valid_hash = job.data.data_hash(), promotion.valid_data_hash(prepared)
    client = MlflowClient(mlflow_uri, registry_uri=mlflow_uri)  # the registry global may point elsewhere
    assert tracking.version_by_alias("dynlm-dntm", "champion") is None  # no registered model yet

    first, first_model = _training(tmp_path, "first", job, prepared, seed=1, valid_ppls=[40.0])
    result = tracking.register_and_promote(first, 40.0)
    assert (result.name, result.version, result.decision, result.promoted) == ("dynlm-dntm", "1", "promoted", True)
    assert "no champion" in result.reason
    assert tracking.version_by_alias("dynlm-dntm", "no-such-alias") is None  # model there, alias not

    worse, _ = _training(tmp_path, "worse", job, prepared, seed=2, valid_ppls=[45.0])
    result = tracking.register_and_promote(worse, 45.0)
    assert (result.version, result.decision, result.champion_version) == ("2", "rejected", "1")
    assert str(client.get_model_version_by_alias("dynlm-dntm", "champion").version) == "1"
    assert str(client.get_model_version_by_alias("dynlm-dntm", "challenger").version) == "2"

    # 39 beats 40 but not by 10%: relative margin
    close, _ = _training(tmp_path, "close", job, prepared, seed=3, valid_ppls=[39.0])
    result = tracking.register_and_promote(close, 39.0, margin=0.1)
    assert (result.version, result.promoted) == ("3", False) and "x (1 - margin 0.1) = 36.0000" in result.reason

    better, better_model = _training(tmp_path, "better", job, prepared, seed=4, valid_ppls=[50.0, 35.0])
    result = tracking.register_and_promote(better, 35.0, margin=0.1)
    assert (result.version, result.promoted, result.champion_version) == ("4", True, "4")
    champion = tracking.version_by_alias("dynlm-dntm", "champion")
    assert str(champion.version) == "4" and champion.tags["run_id"] == better
    assert champion.tags["valid_objective"] == "35.0" and champion.tags["objective_metric"] == "ppl"
    assert champion.tags["data_hash"] == data_hash
    assert champion.tags["valid_data_hash"] == valid_hash
    assert champion.tags["promotion"] == result.reason
    assert client.get_run(better).data.tags["registered_version"] == "dynlm-dntm/4"

    # loading by alias gives the registered weights
    task, model, model_cfg, spec, preprocessor = tracking.load_model("models:/dynlm-dntm@champion")
    assert task.name == "lm"
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
        tracking.register_and_promote(run_id, 10.0)


def test_another_validation_set_is_never_promoted(tmp_path, mlflow_uri):
    """The comparison key is the validation set, not the training data: same training data
    (``data_hash``), other valid shards -> not comparable, whatever the perplexities."""
    job = _job(tmp_path)
    _, _, _, pre = make_tiny_lm(tmp_path / "pre")
    valid_a = _prepared_with_valid_shard(tmp_path / "a", pre, b"valid documents A")
    valid_b = _prepared_with_valid_shard(tmp_path / "b", pre, b"valid documents B")
    same_bytes = _prepared_with_valid_shard(tmp_path / "a-copy", pre, b"valid documents A")
    assert promotion.valid_data_hash(valid_a) != promotion.valid_data_hash(valid_b)
    assert promotion.valid_data_hash(valid_a) == promotion.valid_data_hash(same_bytes)  # content, not path

    champion, _ = _training(tmp_path, "champion", job, valid_a, seed=1, valid_ppls=[40.0])
    assert tracking.register_and_promote(champion, 40.0).promoted
    # the run's MLflow dataset: the prepared folder's valid split, digest of its files
    (dataset_input,) = MlflowClient(mlflow_uri).get_run(champion).inputs.dataset_inputs
    assert dataset_input.dataset.name == "a:valid" and dataset_input.dataset.source_type == "local"
    assert json.loads(dataset_input.dataset.source) == {"uri": str(valid_a.root)}
    assert [(t.key, t.value) for t in dataset_input.tags] == [("mlflow.data.context", "validation")]
    (same_files,) = MlflowClient(mlflow_uri).get_run(
        tracking.start_training_run(job, same_bytes)).inputs.dataset_inputs
    assert same_files.dataset.digest == dataset_input.dataset.digest  # same content key, split and files
    other, _ = _training(tmp_path, "other", job, valid_b, seed=2, valid_ppls=[5.0])
    result = tracking.register_and_promote(other, 5.0)
    assert (result.decision, result.champion_version) == ("rejected", "1")
    assert "not comparable" in result.reason and promotion.valid_data_hash(valid_b) in result.reason
    version = MlflowClient(mlflow_uri, mlflow_uri).get_model_version("dynlm-dntm", result.version)
    assert version.tags["data_hash"] == job.data.data_hash()  # the training data: the same
    assert version.tags["valid_data_hash"] == promotion.valid_data_hash(valid_b)
    # a caller that scored the champion on the challenger's validation set may promote
    measured = tracking.register_and_promote(other, 5.0, champion=promotion.MeasuredChampion("1", 40.0),
                                             valid_data_hash="fixed-set")
    assert measured.promoted and "on validation fixed-set" in measured.reason
    new = tracking.version_by_alias("dynlm-dntm", "champion")
    assert str(new.version) == measured.version and new.tags["valid_data_hash"] == "fixed-set"


def test_another_objective_metric_is_not_compared(tmp_path, mlflow_uri):
    """Registration compares the task's primary metric: a champion scored by another metric (or
    an old version with only the ``valid_ppl`` tag, read as metric ``ppl``) is not comparable."""
    job = _job(tmp_path)
    _, _, _, pre = make_tiny_lm(tmp_path / "pre")
    prepared = make_prepared_folder(tmp_path / "prepared", pre)
    client = MlflowClient(mlflow_uri, mlflow_uri)
    legacy, _ = _training(tmp_path, "legacy", job, prepared, seed=1, valid_ppls=[40.0])
    assert tracking.register_and_promote(legacy, 40.0).promoted
    client.delete_model_version_tag("dynlm-dntm", "1", "valid_objective")  # as registered before
    client.delete_model_version_tag("dynlm-dntm", "1", "objective_metric")
    client.set_model_version_tag("dynlm-dntm", "1", "valid_ppl", "40.0")
    other, _ = _training(tmp_path, "other", job, prepared, seed=2, valid_ppls=[0.5])
    result = tracking.register_and_promote(other, 0.5, metric="f1_error")
    assert (result.decision, result.champion_version) == ("rejected", "1")
    assert "(scored by ppl)" in result.reason and "f1_error values on different validation sets" in result.reason
    worse, _ = _training(tmp_path, "worse", job, prepared, seed=3, valid_ppls=[41.0])
    result = tracking.register_and_promote(worse, 41.0)  # the legacy tag is still compared, metric ppl
    assert result.reason.startswith("not promoted: valid_ppl 41.0000 does not beat champion ppl 40.0000")


def _concurrently(calls):
    """Run the calls in threads started together; return their results in call order."""
    results, errors = [None] * len(calls), []
    barrier = threading.Barrier(len(calls))

    def worker(i):
        try:
            barrier.wait()
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results


def _first_champion(tmp_path) -> tuple:
    """``(job, prepared, run id)`` of dynlm-dntm v1 @champion, a tracked tiny 'training'."""
    job = _job(tmp_path)
    _, _, _, pre = make_tiny_lm(tmp_path / "pre")
    prepared = make_prepared_folder(tmp_path / "prepared", pre)
    first, _ = _training(tmp_path, "first", job, prepared, seed=1, valid_ppls=[40.0])
    assert tracking.register_and_promote(first, 40.0).promoted
    return job, prepared, first


def test_concurrent_promotions_move_the_champion_at_most_once(tmp_path, mlflow_uri):
    job, prepared, _ = _first_champion(tmp_path)
    a, _ = _training(tmp_path, "a", job, prepared, seed=2, valid_ppls=[30.0])
    b, _ = _training(tmp_path, "b", job, prepared, seed=3, valid_ppls=[30.0])

    def slow_promotion():  # widen the window between reading champion and moving it
        time.sleep(0.5)

    # champion read from the registry under the lock: the second caller sees the new champion
    # (30), which 30 does not beat
    results = _concurrently([lambda run=run: tracking.register_and_promote(run, 30.0, before_promote=slow_promotion)
                             for run in (a, b)])
    assert sorted(r.decision for r in results) == ["promoted", "rejected"]
    winner = next(r for r in results if r.promoted)
    assert str(tracking.version_by_alias("dynlm-dntm", "champion").version) == winner.version

    # champion measured by the callers (retrain): the one that finds it moved refuses
    c, _ = _training(tmp_path, "c", job, prepared, seed=4, valid_ppls=[20.0])
    d, _ = _training(tmp_path, "d", job, prepared, seed=5, valid_ppls=[20.0])
    measured = promotion.MeasuredChampion(winner.version, 30.0)
    results = _concurrently([lambda run=run: tracking.register_and_promote(
        run, 20.0, champion=measured, valid_data_hash="fixed", before_promote=slow_promotion) for run in (c, d)])
    assert sorted(r.decision for r in results) == ["conflict", "promoted"]
    promoted = next(r for r in results if r.promoted)
    refused = next(r for r in results if r.decision == "conflict")
    assert f"champion moved from v{winner.version} to v{promoted.version}" in refused.reason
    assert refused.champion_version == promoted.version
    assert str(tracking.version_by_alias("dynlm-dntm", "champion").version) == promoted.version


def test_concurrent_runs_log_one_new_prepared_folder_once(tmp_path, mlflow_uri):
    """Concurrent retrains of one folder log its splits as datasets at the same moment: MLflow's
    look-up-then-insert races on the (experiment, name, digest) key; every run must still get its
    inputs and the experiment one dataset per split (CI once lost a retrain to this race)."""
    job = _job(tmp_path)
    _, _, _, pre = make_tiny_lm(tmp_path / "pre")
    folder = tmp_path / "prepared"
    prepared = make_prepared_folder(folder, pre)
    for split in ("train", "valid", "test"):
        (folder / split).mkdir()
        (folder / split / "part-00000.parquet").write_bytes(split.encode())
    client = MlflowClient(mlflow_uri)
    experiment_id = tracking.ensure_experiment(job.run.experiment)
    runs = [client.create_run(experiment_id).info.run_id for _ in range(8)]
    _concurrently([lambda run=run: tracking.log_prepared_datasets(run, prepared) for run in runs])

    for run in runs:
        inputs = client.get_run(run).inputs.dataset_inputs
        contexts = sorted(tag.value for i in inputs for tag in i.tags if tag.key == "mlflow.data.context")
        assert contexts == ["test", "training", "validation"]
    datasets = {(i.dataset.name, i.dataset.digest) for run in runs for i in client.get_run(run).inputs.dataset_inputs}
    assert sorted(name for name, _ in datasets) == ["prepared:test", "prepared:train", "prepared:valid"]


def _port_nobody_listens_on() -> int:
    import socket

    with socket.socket() as sock:  # bound, never listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_reachability_budget_and_which_uris_are_checked(tmp_path, monkeypatch):
    from dynlm.config import ConfigError

    monkeypatch.delenv(tracking.TRACKING_TIMEOUT_ENV, raising=False)
    assert tracking.tracking_timeout_s() == 5.0
    monkeypatch.setenv(tracking.TRACKING_TIMEOUT_ENV, "0.3")
    uri = f"sqlite:///{tmp_path / 'no-server.db'}"
    assert tracking.check_reachable(uri) == uri  # a file store: nothing to reach
    start = time.monotonic()
    with pytest.raises(tracking.TrackingServerUnreachable, match=r"^MLflow tracking server http://127\.0\.0\.1:\d+ "
                       r"is not reachable \(.*refused; tried for 0\.3 s"):
        tracking.check_reachable(f"http://127.0.0.1:{_port_nobody_listens_on()}")
    assert time.monotonic() - start < 2
    monkeypatch.setenv(tracking.TRACKING_TIMEOUT_ENV, "soon")
    with pytest.raises(ConfigError, match="DYNLM_TRACKING_TIMEOUT_S='soon': give a number of seconds above 0"):
        tracking.tracking_timeout_s()


def test_a_server_that_does_not_answer_is_told_from_a_missing_file():
    """A connection error means the server is down (the run is closed later); a missing local
    file (a checkpoint a remote storage_path did not download) is a bug and must surface."""
    import requests

    refused = requests.exceptions.ConnectionError("Connection refused")
    assert tracking.server_down_reason(refused) == "ConnectionError: Connection refused"
    assert tracking.server_down_reason(TimeoutError("timed out")) == "TimeoutError: timed out"
    assert tracking.server_down_reason(FileNotFoundError("checkpoint bucket/run/epoch_0003 does not exist")) is None
    assert tracking.server_down_reason(PermissionError("mlflow.db")) is None
    assert tracking.server_down_reason(ValueError("bad request")) is None


def test_unreachable_server_is_one_line_before_ray(tmp_path, processes):
    """Every verb that talks to MLflow fails in seconds, naming the URI, before Ray starts."""
    import os
    import sys

    uri = f"http://127.0.0.1:{_port_nobody_listens_on()}"
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "doc.txt").write_text("The cat sat .\n", encoding="utf-8")
    (tmp_path / "retrain.yaml").write_text(json.dumps(
        {"data": {"inputs": [str(tmp_path / "corpus")]}, "validation": str(tmp_path / "corpus"), "model_type": "dntm"}),
        encoding="utf-8")
    verbs = {
        "train": ["train", "--tracking-uri", uri],
        "run": ["run", "--tracking-uri", uri],
        "evaluate": ["evaluate", "--model", "models:/dynlm-dntm@champion", "--data", str(tmp_path),
                     "--tracking-uri", uri],
        "tune": ["tune", "--space", str(REPO / "tune_spaces" / "quickstart.yaml"),
                 "--tracking-uri", uri],
        "retrain": ["retrain", "--config", str(tmp_path / "retrain.yaml"), "--tracking-uri", uri],
    }
    for verb, argv in verbs.items():
        ray_tmp = tmp_path / f"ray-{verb}"
        ray_tmp.mkdir()
        env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "DYNLM_TRACKING_TIMEOUT_S": "2"}
        env.pop("RAY_ADDRESS", None)
        start = time.monotonic()
        done = processes.run([sys.executable, "-m", "pipelines.cli", *argv], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
        seconds = time.monotonic() - start
        assert done.returncode == 2, (verb, done.stderr[-3000:])
        assert done.stderr.splitlines()[-1].startswith(
            f"dynlm: error: MLflow tracking server {uri} is not reachable ("), (verb, done.stderr)
        assert "Traceback" not in done.stderr, verb
        # seconds, not MLflow's minutes of retries; the bound leaves room for the CLI's imports on a
        # loaded machine (16.8 s once for `run` in a full suite run on 2 cores, nice 10)
        assert seconds < 40, (verb, seconds)
        assert list(ray_tmp.iterdir()) == [], (verb, "Ray was started")  # no Ray session folder


def test_an_evaluation_is_a_run_linked_to_the_registered_version(tmp_path, mlflow_uri):
    _, _, trained = _first_champion(tmp_path)
    metrics = {"ppl": 31.5, "tokens": 120, "ppl_oov": float("inf")}
    run_id = tracking.log_evaluation("models:/dynlm-dntm@champion", task="lm", data="corpus/ [test]", metrics=metrics,
                                     table="the table", extra={"documents": 3})
    client = MlflowClient(mlflow_uri, registry_uri=mlflow_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == tracking.EVALUATE_EXPERIMENT
    assert {k: run.data.tags[k] for k in ("dynlm.kind", "model_uri", "registered_model", "model_version", "model_run_id",
                                          "data", "task")} == {
        "dynlm.kind": "evaluate", "model_uri": "models:/dynlm-dntm@champion", "registered_model": "dynlm-dntm",
        "model_version": "1", "model_run_id": trained, "data": "corpus/ [test]", "task": "lm"}
    assert run.data.metrics["ppl"] == 31.5 and run.data.metrics["tokens"] == 120
    assert tracking.read_run_text(run_id, "evaluation.txt") == "the table"
    assert json.loads(tracking.read_run_text(run_id, "evaluation.json"))["documents"] == 3
    assert client.get_model_version("dynlm-dntm", "1").tags[tracking.TAG_EVALUATION_RUN] == run_id
    # by version number too; a run URI names its training run
    again = tracking.log_evaluation("models:/dynlm-dntm/1", task="lm", data="x", metrics=metrics, table="t")
    assert client.get_run(again).data.tags["model_version"] == "1"
    by_run = tracking.log_evaluation(f"runs:/{trained}/model", task="lm", data="x", metrics=metrics, table="t")
    assert client.get_run(by_run).data.tags["model_run_id"] == trained


def test_system_metrics_never_wait_for_a_server_that_is_gone():
    """MLflow's monitor asks the server for the run's last step when it is built and for the run
    after every sample; with the server gone each call retries for minutes, and MLflow's finish()
    joins the thread. Starting and stopping it take bounded time instead (regression: a
    tracking-server test's training hung 4 minutes at its end)."""
    uri = f"http://127.0.0.1:{_port_nobody_listens_on()}"
    started = time.monotonic()
    metrics = tracking.start_system_metrics("0" * 32, 0.1, tracking_uri=uri)
    time.sleep(0.3)
    metrics.stop(timeout_s=1.0)
    assert time.monotonic() - started < 3.0
