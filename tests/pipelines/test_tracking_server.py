"""dynlm against a real MLflow tracking server (``mlflow server`` on a free local port, SQLite
backend, artifacts served by the server): train with 2 Ray Train workers, register and promote,
then evaluate the champion by its alias, everything through http://127.0.0.1:PORT; and a
server stopped in the middle of a training, then started again."""

from __future__ import annotations

import json

from mlflow import MlflowClient
from server_process import free_port, mlflow_server_argv, running_server, server_env
from train_process import (
    committed,
    output_of,
    own_lines,
    ray_tmp,
    start_train,
    stop_and_remove,
    wait_until,
)

from dynlm.data.synth import SynthConfig, write_conll
from pipelines.cli import main

TINY = ["train.epochs=1", "train.batch_size=4", "model.embed_dim=16", "model.hidden_dim=16",
        "data.vocab_size=300", "data.bpe_merges=30", "run.cpus_per_worker=0.4", "run.num_workers=2"]


def test_train_register_evaluate_through_a_server(ray_session, mlflow_server, tmp_path, monkeypatch, capsys):
    """`dynlm train` of the embedded default job from an empty directory, as a new user runs it:
    the default relative paths (runs/synth, runs/prepared, runs/ray) resolve in the working
    directory; tracked, registered and evaluated through the server."""
    uri, artifacts = mlflow_server
    monkeypatch.chdir(tmp_path)  # the embedded job's corpus, prepared data and Ray storage go here
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DYNLM_MLFLOW_ARTIFACTS", raising=False)  # the server keeps its own artifacts
    args = ["train", "--tracking-uri", uri]
    for item in TINY:
        args += ["--set", item]
    assert main(args) == 0
    assert "[train] best valid ppl" in capsys.readouterr().out
    assert any((tmp_path / "runs" / "synth").glob("*.conll"))
    prepared = [p for p in (tmp_path / "runs" / "prepared").iterdir() if (p / "manifest.json").is_file()]
    assert len(prepared) == 1

    client = MlflowClient(uri, registry_uri=uri)
    champion = client.get_model_version_by_alias("dynlm-dntm", "champion")  # the first model is promoted
    assert client.get_model_version_by_alias("dynlm-dntm", "challenger").version == champion.version
    run = client.get_run(champion.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["dynlm.prepared_root"] == str(prepared[0])
    assert run.data.params["run.num_workers"] == "2" and run.data.params["train.epochs"] == "1"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "valid_ppl")] == [1]
    assert run.info.artifact_uri.startswith("mlflow-artifacts:/")  # stored by the server, not by us
    assert any(path.name == "weights.pt" for path in artifacts.rglob("*"))
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlartifacts").exists()

    assert main(["evaluate", "--model", "models:/dynlm-dntm@champion", "--data", str(prepared[0]),
                 "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "models:/dynlm-dntm@champion" in out and "all tokens" in out


def test_server_stopped_mid_training_loses_nothing(tmp_path, processes):
    """The server stops after epoch 1 is logged and checkpointed: the training goes on to the end
    (checkpoints are Ray's), then ends with one line naming the run and the command to finish
    it; with the server back, that command logs the missing epoch and registers the model."""
    write_conll(SynthConfig(num_documents=24, docs_per_file=12), tmp_path / "synth")
    uri, server_dir = f"http://127.0.0.1:{free_port()}", tmp_path / "server"
    server_dir.mkdir()
    run_dir = tmp_path / "ray" / "gone"
    env = server_env()
    env.pop("MLFLOW_TRACKING_URI", None)
    first, second = ray_tmp("gone"), ray_tmp("back")
    try:
        with running_server(processes, mlflow_server_argv(server_dir, uri), f"{uri}/health", tmp_path / "server1.log",
                            env):
            process = start_train(processes, tmp_path, "gone", first, tracking_uri=uri)
            wait_until(process, lambda: committed(run_dir, "epoch_0001"), "epoch 1's checkpoint is committed")
        text = output_of(process, expected_returncode=2)  # the server stopped when the block ended
        assert committed(run_dir, "epoch_0002")  # epoch 2 trained and checkpointed without the server
        assert "Traceback" not in text
        error = own_lines(text)[-1]
        assert error.startswith("dynlm: error: run 'gone' trained 2 epochs") and uri in error, error
        assert "--set run.name=gone --resume" in error, error

        with running_server(processes, mlflow_server_argv(server_dir, uri), f"{uri}/health", tmp_path / "server2.log",
                            env):
            text = output_of(start_train(processes, tmp_path, "gone", second, "--resume", tracking_uri=uri))
            assert "[train] registered dynlm-dntm v1" in text, text[-3000:]
            client = MlflowClient(uri, registry_uri=uri)
            run_id = json.loads((run_dir / "dynlm_run.json").read_text())["mlflow_run_id"]
            assert client.get_model_version_by_alias("dynlm-dntm", "champion").run_id == run_id
            run = client.get_run(run_id)
            assert run.info.status == "FINISHED"
            assert [m.step for m in client.get_metric_history(run_id, "valid_ppl")] == [1, 2]  # epoch 2: late
            assert run.data.metrics["epochs_completed"] == 2
    finally:
        stop_and_remove(first)
        stop_and_remove(second)


def test_tune_then_retrain_through_a_server(ray_session, mlflow_server, tmp_path, monkeypatch, capsys):
    """`dynlm tune --space tune_spaces/quickstart.yaml` as the README says, in an empty working
    directory with the default relative paths (runs/synth, runs/prepared, runs/ray), one epoch and
    one sample per grid value (2 trials) for time; then a scheduled retraining of its registered
    champion; both against http://127.0.0.1:PORT: the parent and child runs, the registered
    versions and the retrain's decision are all read back through the server.

    Regression (the quickstart): every trial missed the pre-pass's folders (the key held the input
    paths as spelled), re-ran prepare inside its placement group and died, and the command exited 0."""
    from pathlib import Path

    import yaml

    uri, _ = mlflow_server
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

    write_conll(SynthConfig(num_documents=24, docs_per_file=12, seed=7), tmp_path / "new")
    write_conll(SynthConfig(num_documents=8, docs_per_file=8, seed=8), tmp_path / "validation")
    (tmp_path / "retrain.yaml").write_text(yaml.safe_dump({
        "data": {"inputs": [str(tmp_path / "new")], "output_root": str(tmp_path / "retrain-prepared"),
                 "num_encode_actors": 1},
        "validation": str(tmp_path / "validation"), "tracking_uri": uri,
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
