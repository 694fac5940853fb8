"""The cloze task (the SAW Reader) through the whole pipeline: the README's cloze block as written,
from a fresh clone (sizes cut for time): ``dynlm data synth-cloze`` (one malformed file added) ->
``dynlm prepare`` (Ray Data) -> ``dynlm train`` (2 DDP workers) -> ``dynlm-saw`` in the MLflow
registry -> ``dynlm evaluate`` of the champion (in this process and as a Ray Data job) -> ``dynlm
tune`` (two trials: the prepare pre-pass, the results table and figure, the best registered);
then the pyfunc model answering ``{document, query[, candidates]}`` rows (and refusing a bad one)
and ``mlflow models serve`` of the champion over HTTP (a bad request is a 400 with its reason).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from readme_commands import argv, fresh_clone, readme_block, sets
from server_process import BIN_DIR, free_port, post_json, running_server, server_env
from train_process import prepared_folder

from dynlm.data.prepared import PreparedData
from dynlm.data.synthetic_cloze import synthetic_cbt_text
from pipelines.cli import main

CLOZE_BLOCK = "### The cloze task: the SAW Reader on CMRC-2017 and CBT"
DATA = ["data.bpe_merges=30", "data.num_encode_actors=1"]
SMALL = ["model.embed_dim=24", "model.subword_dim=12", "model.hidden_size=24", "run.cpus_per_worker=0.4"]


def _cuts(args: list[str]) -> list[str]:
    """What the test appends to a README line: sizes only (the same data cuts for prepare and train)."""
    if args[:2] == ["data", "synth-cloze"]:
        return ["--num-questions", "240", "--seed", "2"]
    if args[0] == "prepare":
        return sets(*DATA)
    if args[0] == "train":
        return sets(*DATA, *SMALL, "train.epochs=3")
    if args[0] == "tune":  # two trials of one epoch; the searched bpe_merges / gamma / combine as the space says
        return sets("data.num_encode_actors=1", "train.epochs=1", "tune.num_samples=2")
    return []


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """One fresh clone for the block (the search, the next test, reads the questions the first
    line wrote)."""
    folder = tmp_path_factory.mktemp("clone")
    fresh_clone(folder)
    return folder


def test_the_readme_cloze_commands_then_the_served_reader(ray_session, mlflow_uri, clone, tmp_path, monkeypatch,
                                                          capsys, processes):
    """The block's lines but its last (the search: the next test), in order; then the served reader."""
    import mlflow
    from mlflow import MlflowClient

    monkeypatch.chdir(clone)
    synth_line, prepare_line, train_line, evaluate_line, _ = readme_block(CLOZE_BLOCK)
    assert main(argv(synth_line, _cuts)) == 0
    block = synthetic_cbt_text(1, seed=99)
    (clone / "cloze" / "cbtest_CN_broken.txt").write_text(block.replace("21 ", "22 ", 1) + block)  # 1 quarantined
    capsys.readouterr()

    assert main(argv(prepare_line, _cuts)) == 0
    root = prepared_folder(capsys.readouterr().out)
    prepared = PreparedData.open(root)
    assert prepared.manifest["task"] == "cloze" and prepared.manifest["counts"]["quarantined"] == 1
    assert root.parent == clone / "runs" / "prepared"
    assert sum(prepared.num_documents(split) for split in ("train", "valid", "test")) == 241

    assert main(argv(train_line, _cuts)) == 0
    out = capsys.readouterr().out
    assert "registered dynlm-saw v1" in out and "best valid error" in out and f"reusing {root}" in out
    client = MlflowClient(mlflow_uri)
    version = client.get_model_version_by_alias("dynlm-saw", "champion")
    assert version.tags["objective_metric"] == "error"
    run = client.get_run(version.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["best_valid_objective"] < 0.5  # chance is 0.9 (10 candidates)

    assert main(argv(evaluate_line, _cuts, root.name)) == 0
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
    serve = [str(BIN_DIR / "mlflow"), "models", "serve", "-m", "models:/dynlm-saw@champion", "--env-manager", "local",
            "-h", "127.0.0.1", "-p", str(port)]
    with running_server(processes, serve, f"{base}/ping", tmp_path / "serve.log", server_env(MLFLOW_TRACKING_URI=mlflow_uri)):
        status, body = post_json(f"{base}/invocations", {"dataframe_records": [
            {"document": document, "query": query, "candidates": candidates.split("|")}]})
        assert status == 200, body
        (prediction,) = body["predictions"]
        assert prediction["answer"] == answers["answer"][0]
        assert abs(prediction["probability"] - answers["probability"][0]) < 1e-6
        status, body = post_json(f"{base}/invocations", {"dataframe_records": [{"document": document, "query": " "}]})
        assert status == 400 and "'query' must be non-empty" in body["message"]


def test_the_readme_cloze_search(ray_session, mlflow_uri, clone, monkeypatch, capsys):
    """The block's last line, `dynlm tune --space tune_spaces/saw_small.yaml`, on the questions
    its first line wrote (run alone, this test writes them with that line first)."""
    from mlflow import MlflowClient

    monkeypatch.chdir(clone)
    synth_line, *_, tune_line = readme_block(CLOZE_BLOCK)
    if not (clone / "cloze").is_dir():
        assert main(argv(synth_line, _cuts)) == 0
    capsys.readouterr()
    client = MlflowClient(mlflow_uri, registry_uri=mlflow_uri)  # the registry global may be the last test's
    # the search: each distinct bpe_merges prepared once before the trials, which prepare nothing
    assert main(argv(tune_line, _cuts) + ["--json"]) == 0
    searched = json.loads(capsys.readouterr().out)
    assert searched["num_trials"] == 2 and not searched["interrupted"] and searched["num_prepared"] == 3
    parent = client.get_run(searched["parent_run_id"])
    assert parent.data.metrics["num_failed_trials"] == 0
    assert {"tune_results.csv", "tune_results.png"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    best = searched["best"]
    assert 0.0 <= best["best_valid_objective"] <= 1.0  # error = 1 - accuracy
    registered = client.search_model_versions("name = 'dynlm-saw'")
    assert best["run_id"] in {v.tags["run_id"] for v in registered}  # the best went through the champion rule
