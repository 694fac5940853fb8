"""``dynlm evaluate`` and ``dynlm suggest-name`` of a naming model report the non-dunder functions
apart (issue 37: ``__init__``, ``__eq__``... are easy names a user never asks for). No Ray, no
MLflow: the prepared folder comes from ``prepare_local`` and the model is a seeded, untrained
checkpoint (the numbers are checked against the rows they summarise, the labels as written)."""

from __future__ import annotations

import json
import math
import textwrap

import pytest
import torch

from dynlm import checkpoint
from dynlm.data.prepared import PreparedData
from dynlm.data.python_functions import is_dunder
from dynlm.data.synthetic_code import SynthCodeConfig, write_code_corpus
from dynlm.models.naming import NamingModelConfig
from dynlm.tasks.local import prepare_local
from dynlm.tasks.naming import NamingTask
from dynlm.tasks.naming_data import NamingDataConfig
from pipelines.cli import main

SOURCE = textwrap.dedent('''\
    class Wallet:
        def __init__(self, balance):
            self._balance = balance

        def get_balance(self):
            return self._balance

        def __eq__(self, other):
            return self._balance == other._balance
    ''')


@pytest.fixture(scope="module")
def naming_model(tmp_path_factory):
    """``(checkpoint folder, prepared folder)``: a seeded naming model of a synthetic corpus."""
    tmp = tmp_path_factory.mktemp("naming_commands")
    write_code_corpus(SynthCodeConfig(num_files=8, seed=0), tmp / "code")
    prepared = prepare_local(NamingDataConfig(inputs=[str(tmp / "code")], output_root=str(tmp / "out")),
                             task="naming", log=lambda *_: None)
    model_cfg = NamingModelConfig(type="subtoken", embed_dim=8, context_size=2, noise_samples=4, top_k=3)
    torch.manual_seed(0)
    task = NamingTask()
    model = task.build_model(model_cfg, prepared.spec)
    folder = tmp / "model"
    checkpoint.save(folder / "model.pt", model, model_cfg, prepared.spec, task="naming")
    (folder / "preprocessor.json").write_bytes(prepared.read_bytes(prepared.manifest["preprocessor"]))
    return folder, prepared.root


def test_evaluate_prints_and_returns_the_non_dunder_metrics(naming_model, capsys):
    folder, root = naming_model
    assert main(["evaluate", "--model", str(folder), "--data", str(root), "--ray-scoring", "never", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)["metrics"]
    names = [row["name"] for row in PreparedData.open(root).iter_rows("test")]
    assert metrics["functions"] == len(names)
    assert metrics["non_dunder_functions"] == sum(not is_dunder(name) for name in names) < len(names)
    assert 0.0 <= metrics["non_dunder_f1_at_1"] <= 1.0
    assert all(f"curve{i}_non_dunder_f1_at_1" in metrics for i in range(20))
    assert main(["evaluate", "--model", str(folder), "--data", str(root), "--ray-scoring", "never"]) == 0
    table = capsys.readouterr().out
    assert f"  non-dunder functions{metrics['non_dunder_functions']:>18,d}" in table
    assert f"  non-dunder F1@1{metrics['non_dunder_f1_at_1']:>23.3f}" in table
    assert "the same curve, non-dunder functions only" in table


def test_suggest_name_scores_the_top_suggestions_all_and_non_dunder(naming_model, tmp_path, monkeypatch, capsys):
    folder, _ = naming_model
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wallet.py").write_text(SOURCE)
    assert main(["suggest-name", "--model", str(folder), "--json", "wallet.py"]) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]  # stdout: one object per function
    assert [(r["qualname"], r["dunder"]) for r in rows] == [
        ("Wallet.__init__", True), ("Wallet.get_balance", False), ("Wallet.__eq__", True)]
    for row in rows:  # the top suggestion's subtokens against the actual name's
        assert 0.0 <= row["f1_at_1"] <= 1.0 and row["exact_at_1"] in (0.0, 1.0)
        assert row["exact_at_1"] <= row["f1_at_1"]
    everything = sum(r["f1_at_1"] for r in rows) / 3
    summary = captured.err.splitlines()[-3:]  # --json: the summary goes to stderr
    assert summary[0] == "top suggestion vs the actual names   functions    F1@1  exact@1"
    assert summary[1] == f"  all functions                              3{everything:>8.3f}{sum(r['exact_at_1'] for r in rows) / 3:>9.3f}"
    assert summary[2] == (f"  non-dunder functions                       1{rows[1]['f1_at_1']:>8.3f}"
                          f"{rows[1]['exact_at_1']:>9.3f}")
    assert main(["suggest-name", "--model", str(folder), "wallet.py"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[-3:] == summary and text[-4] == ""  # the text mode prints it after the suggestions


def test_the_summary_of_hand_written_scores():
    from dynlm.tasks.naming_report import suggestion_summary

    functions = [{"dunder": True, "f1_at_1": 1.0, "exact_at_1": 1.0}, {"dunder": False, "f1_at_1": 0.8, "exact_at_1": 0.0},
                 {"dunder": False, "f1_at_1": 0.0, "exact_at_1": 0.0}]
    summary = suggestion_summary(functions)
    assert summary == pytest.approx({"functions": 3, "f1_at_1": 0.6, "exact_at_1": 1 / 3, "non_dunder_functions": 2,
                                     "non_dunder_f1_at_1": 0.4, "non_dunder_exact_at_1": 0.0})
    assert NamingTask().suggestion_summary(functions).splitlines()[2] == (
        "  non-dunder functions                       2   0.400    0.000")
    assert math.isnan(suggestion_summary([functions[0]])["non_dunder_f1_at_1"])
