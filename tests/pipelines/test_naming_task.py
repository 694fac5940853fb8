"""The method-naming task (Allamanis et al., 2015) through the whole pipeline: the README's naming
block as written, from a fresh clone, on its default data (the running Python's standard
library; sizes cut for time, its top-level modules): ``dynlm prepare`` (Ray Data) -> ``dynlm
train`` (2 DDP workers, Ray Train) ->
``dynlm-naming`` in the MLflow registry -> ``dynlm evaluate`` of the champion -> ``dynlm
suggest-name`` -> ``dynlm tune`` (two trials); then the pyfunc model answering a request (and
refusing a bad one). An unparseable file's quarantine is ``tests/dynlm/tasks/test_naming.py``'s.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from readme_commands import argv, fresh_clone, readme_block, sets
from train_process import prepared_folder

from dynlm.data.prepared import PreparedData
from pipelines.cli import main

NAMING_BLOCK = "### The naming task: suggest a function's name from its body"
SMALL = ["train.epochs=1", "model.embed_dim=16", "model.noise_samples=4", "run.cpus_per_worker=0.4"]
#: The standard library's top-level modules only (~170 files, ~7 k functions; all of it: ~870 files,
#: ~19 k functions, 3x the parse and training time): every file below a folder is left out (in
#: fnmatch ``*`` matches ``/``). The default's excluded test suites are top-level folders too.
TOP_LEVEL_MODULES = 'data.exclude=["*/*"]'
SNIPPET = '''\
class Wallet:
    def __init__(self, balance):
        self._balance = balance

    def get_balance(self):
        return self._balance
'''


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """One fresh clone for the block: the search (the next test) finds the standard library
    prepared by the first line, as it would in a user's clone (the same data settings)."""
    folder = tmp_path_factory.mktemp("clone")
    fresh_clone(folder)
    return folder


def _cuts(args: list[str]) -> list[str]:
    """What the test appends to a README line: sizes only (the same data cut wherever data is
    named, so the train and the search find the folder the prepare line wrote)."""
    if args[0] == "prepare":
        return sets(TOP_LEVEL_MODULES)
    if args[0] == "train":
        return sets(TOP_LEVEL_MODULES, *SMALL)
    if args[0] == "tune":  # one sample per model type (the space's grid): 2 trials, one epoch each
        return sets(TOP_LEVEL_MODULES, "train.epochs=1", "tune.num_samples=1", "tune.grace_period=1")
    return []


def test_the_readme_naming_commands_on_the_standard_library(ray_session, mlflow_uri, clone, monkeypatch, capsys):
    """The block's lines but its last (the search: the next test), in order."""
    import mlflow
    from mlflow import MlflowClient

    monkeypatch.chdir(clone)
    prepare_line, train_line, evaluate_line, suggest_line, _ = readme_block(NAMING_BLOCK)
    capsys.readouterr()

    assert main(argv(prepare_line, _cuts)) == 0
    root = prepared_folder(capsys.readouterr().out)
    prepared = PreparedData.open(root)
    assert prepared.manifest["task"] == "naming" and root.parent == clone / "runs" / "prepared"
    assert prepared.manifest["counts"]["quarantined"] == 0
    sizes = {split: prepared.num_documents(split) for split in ("train", "valid", "test")}
    assert sizes["train"] > 3_000 and sizes["valid"] > 300 and sizes["test"] > 300, sizes  # every def of its modules

    assert main(argv(train_line, _cuts)) == 0
    out = capsys.readouterr().out
    assert "registered dynlm-naming v1" in out and "best valid f1_error" in out and f"reusing {root}" in out
    client = MlflowClient(mlflow_uri)
    version = client.get_model_version_by_alias("dynlm-naming", "champion")
    assert version.tags["objective_metric"] == "f1_error"
    run = client.get_run(version.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["model_type"] == "naming"
    f1_error = run.data.metrics["best_valid_objective"]
    assert 0.0 <= f1_error < 0.95, f1_error  # one small epoch: some subtokens right already
    assert "suggestion_frequency.png" in {a.path for a in client.list_artifacts(run.info.run_id)}

    assert main(argv(evaluate_line, _cuts, root.name)) == 0
    table = capsys.readouterr().out
    assert "models:/dynlm-naming@champion (naming) on" in table and "F1" in table

    (clone / "mymodule.py").write_text(SNIPPET)  # the user's own file
    assert main(argv(suggest_line, _cuts)) == 0
    out = capsys.readouterr().out
    assert "Wallet.__init__" in out and "Wallet.get_balance" in out, out
    assert main(["suggest-name", "--model", "models:/dynlm-naming@champion", "--json", "--top-k", "3",
                 "mymodule.py"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["qualname"], r["lineno"], r["name"]) for r in rows] == [
        ("Wallet.__init__", 2, "__init__"), ("Wallet.get_balance", 5, "get_balance")]
    assert all(1 <= len(r["suggestions"]) <= 3 for r in rows)
    probabilities = [p for _, p in rows[1]["suggestions"]]
    assert probabilities == sorted(probabilities, reverse=True) and 0.0 < sum(probabilities) <= 1.0 + 1e-6
    (clone / "broken.py").write_text("def oops(:\n    pass\n")
    assert main(["suggest-name", "--model", "models:/dynlm-naming@champion", "broken.py"]) == 1
    assert "broken.py" in capsys.readouterr().err

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


def test_the_readme_naming_search_on_the_standard_library(ray_session, mlflow_uri, clone, monkeypatch, capsys):
    """The block's last line, `dynlm tune --space tune_spaces/naming.yaml`, in the same clone:
    its pre-pass reuses the folder the block's first line prepared (run alone, it prepares it)."""
    from mlflow import MlflowClient

    monkeypatch.chdir(clone)
    *_, tune_line = readme_block(NAMING_BLOCK)
    assert tune_line[:2] == ["dynlm", "tune"]
    client = MlflowClient(mlflow_uri)
    assert main(argv(tune_line, _cuts)) == 0
    captured = capsys.readouterr()
    assert "failed:" not in captured.err
    experiment = client.get_experiment_by_name("dynlm").experiment_id
    (parent,) = client.search_runs([experiment], filter_string="tags.`dynlm.kind` = 'tune'")
    children = client.search_runs([experiment], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(c.data.params["model.type"] for c in children) == ["name", "subtoken"]
    assert parent.data.metrics["num_failed_trials"] == 0
