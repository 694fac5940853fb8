"""dynlm against a real MLflow tracking server (``mlflow server`` on a free local port, SQLite
backend, artifacts served by the server): a search whose trials train with 2 Ray Train workers,
registers and promotes its best, the champion evaluated by its alias, then retrained, everything
through http://127.0.0.1:PORT; and `dynlm train` with the server stopped in the middle of the
training, then started again."""

from __future__ import annotations

import json

from mlflow import MlflowClient
from server_process import free_port, mlflow_server_argv, running_server, server_env
from train_process import (
    committed,
    output_of,
    own_lines,
    start_train,
    wait_until,
)

from dynlm.data.synth import SynthConfig, write_conll
from pipelines.cli import main


def test_server_stopped_mid_training_loses_nothing(ray_session, tmp_path, processes):
    """The server stops after epoch 1 is logged and checkpointed: the training goes on to the end
    (checkpoints are Ray's), then ends with one line naming the run and the command to finish
    it; with the server back, that command logs the missing epoch and registers the model.
    `dynlm train` runs as a process of its own (its tracking client must outlive the server), in
    the session's Ray (nothing here needs a Ray of its own)."""
    write_conll(SynthConfig(num_documents=24, docs_per_file=12), tmp_path / "synth")
    uri, server_dir = f"http://127.0.0.1:{free_port()}", tmp_path / "server"
    server_dir.mkdir()
    run_dir = tmp_path / "ray" / "gone"
    env = server_env()
    env.pop("MLFLOW_TRACKING_URI", None)
    address = ray_session.get_runtime_context().gcs_address
    with running_server(processes, mlflow_server_argv(server_dir, uri), f"{uri}/health", tmp_path / "server1.log",
                        env):
        # one worker: what is checked is the tracking, not DDP (the other tests train with two)
        process = start_train(processes, tmp_path, "gone", None, "--set", "run.num_workers=1", tracking_uri=uri,
                              ray_address=address)
        wait_until(process, lambda: committed(run_dir, "epoch_0001"), "epoch 1's checkpoint is committed")
    text = output_of(process, expected_returncode=2)  # the server stopped when the block ended
    assert committed(run_dir, "epoch_0002")  # epoch 2 trained and checkpointed without the server
    assert "Traceback" not in text
    error = own_lines(text)[-1]
    assert error.startswith("dynlm: error: run 'gone' trained 2 epochs") and uri in error, error
    assert "--set run.name=gone --resume" in error, error

    with running_server(processes, mlflow_server_argv(server_dir, uri), f"{uri}/health", tmp_path / "server2.log",
                        env):
        text = output_of(start_train(processes, tmp_path, "gone", None, "--resume", "--set", "run.num_workers=1",
                                     tracking_uri=uri, ray_address=address))
        assert "[train] registered dynlm-dntm v1" in text, text[-3000:]
        client = MlflowClient(uri, registry_uri=uri)
        run_id = json.loads((run_dir / "dynlm_run.json").read_text())["mlflow_run_id"]
        champion = client.get_model_version_by_alias("dynlm-dntm", "champion")  # the first model is promoted
        assert champion.run_id == run_id
        assert client.get_model_version_by_alias("dynlm-dntm", "challenger").version == champion.version
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"
        assert [m.step for m in client.get_metric_history(run_id, "valid_ppl")] == [1, 2]  # epoch 2: late
        assert run.data.metrics["epochs_completed"] == 2
        assert run.data.params["run.num_workers"] == "1"


def test_tune_then_retrain_through_a_server(ray_session, mlflow_server, tmp_path, monkeypatch, capsys):
    """`dynlm tune --space tune_spaces/quickstart.yaml` as the README says, in an empty working
    directory with the default relative paths (runs/synth, runs/prepared, runs/ray), one epoch and
    one sample per grid value (2 trials) for time; its registered champion evaluated by its alias;
    then a scheduled retraining of that champion; all against http://127.0.0.1:PORT: the parent
    and child runs, the model's artifacts (kept by the server, nothing written locally), the
    registered versions and the retrain's decision are all read back through the server.

    Regression (the quickstart): every trial missed the pre-pass's folders (the key held the input
    paths as spelled), re-ran prepare inside its placement group and died, and the command exited 0."""
    from pathlib import Path

    import yaml

    uri, artifacts = mlflow_server
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DYNLM_MLFLOW_ARTIFACTS", raising=False)
    quickstart = str(Path(__file__).resolve().parents[2] / "tune_spaces" / "quickstart.yaml")
    capsys.readouterr()
    assert main(["tune", "--space", quickstart, "--set", "train.epochs=1", "--set", "tune.num_samples=1",
                 "--name", "served", "--tracking-uri", uri, "--json"]) == 0
    captured = capsys.readouterr()
    assert "failed:" not in captured.err
    (line,) = captured.out.splitlines()  # --json: the search as one object on stdout
    searched = json.loads(line)
    built = [p for p in (tmp_path / "runs" / "prepared").iterdir() if (p / "manifest.json").is_file()]
    assert len(built) == 2  # the two bpe_merges values, prepared once each by the pre-pass
    client = MlflowClient(uri, registry_uri=uri)
    experiment = client.get_experiment_by_name("dynlm").experiment_id
    (parent,) = client.search_runs([experiment], filter_string="tags.`dynlm.kind` = 'tune' and tags.mlflow.runName = 'served'")
    children = client.search_runs([experiment], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert parent.info.status == "FINISHED" and len(children) == 2
    assert parent.data.metrics["num_failed_trials"] == 0
    assert (searched["parent_run_id"], searched["num_trials"], searched["interrupted"]) == (parent.info.run_id, 2, False)
    assert searched["best"]["run_id"] == parent.data.tags["best_run_id"]
    # ASHA may stop the worse trial at its one report (max_t = 1 epoch here): KILLED, not failed
    assert {c.info.status for c in children} <= {"FINISHED", "KILLED"}
    assert {c.data.tags["dynlm.prepared_root"] for c in children} == {str(p) for p in built}
    assert "FINISHED" in {c.info.status for c in children} and parent.data.tags["best_run_id"] in {
        c.info.run_id for c in children}
    before = client.get_model_version_by_alias("dynlm-dntm", "champion")
    assert before.tags["objective_metric"] == "ppl"
    best = client.get_run(before.run_id)
    assert best.info.run_id == parent.data.tags["best_run_id"]
    assert best.data.params["train.epochs"] == "1" and best.data.tags["dynlm.kind"] == "training"
    assert best.info.artifact_uri.startswith("mlflow-artifacts:/")  # stored by the server, not by us
    assert any(path.name == "weights.pt" for path in artifacts.rglob("*"))
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlartifacts").exists()

    capsys.readouterr()
    assert main(["evaluate", "--model", "models:/dynlm-dntm@champion", "--data", best.data.tags["dynlm.prepared_root"],
                 "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "models:/dynlm-dntm@champion" in out and "all tokens" in out

    write_conll(SynthConfig(num_documents=24, docs_per_file=12, seed=7), tmp_path / "new")
    write_conll(SynthConfig(num_documents=8, docs_per_file=8, seed=8), tmp_path / "validation")
    (tmp_path / "retrain.yaml").write_text(yaml.safe_dump({
        "data": {"inputs": [str(tmp_path / "new")], "output_root": str(tmp_path / "retrain-prepared"),
                 "num_encode_actors": 1},
        "validation": str(tmp_path / "validation"), "model_type": "dntm", "tracking_uri": uri,
        "job_overrides": ["train.epochs=1", f"run.storage_path={tmp_path / 'retrain-ray'}"]}))
    capsys.readouterr()
    assert main(["retrain", "--config", "retrain.yaml", "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()  # --json: the decision as one object on stdout
    decided = json.loads(line)
    retrain_runs = client.search_runs([client.get_experiment_by_name("dynlm-retrain").experiment_id])
    (run,) = retrain_runs
    assert run.info.status == "FINISHED" and run.data.tags["decision"] in {"promoted", "rejected"}
    assert (decided["decision"], decided["retrain_run_id"], decided["exit_code"]) == (
        run.data.tags["decision"], run.info.run_id, 0)
    assert decided["challenger_version"] == run.data.tags["challenger_version"] and decided["trained"]
    challenger = client.get_model_version("dynlm-dntm", run.data.tags["challenger_version"])
    assert challenger.tags["retrain_run_id"] == run.info.run_id and int(challenger.version) > int(before.version)
    after = client.get_model_version_by_alias("dynlm-dntm", "champion").version
    assert after == (challenger.version if run.data.tags["decision"] == "promoted" else before.version)
