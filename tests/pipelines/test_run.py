"""End to end, the README's LM block as written from a fresh clone (real Ray, 2 DDP workers, real
MLflow; sizes cut for time): `dynlm run`, `dynlm evaluate` of the registered DNTM champion, the
LSTM baseline trained on the same prepared folder (`configs/lm_rnn.yaml`) and its dynamic
evaluation; and `dynlm evaluate` on raw files."""

from __future__ import annotations

import re

import pytest
from mlflow import MlflowClient
from readme_commands import argv, fresh_clone, readme_block, sets

from dynlm.tasks.lm_table import ROWS
from pipelines.cli import main

LM_BLOCK = "### The LM task: the DNTM, its LSTM baseline, the meta-learned dynamical LM"
TINY = ["train.epochs=1", "train.batch_size=4", "model.embed_dim=16", "model.hidden_dim=16",
        "data.vocab_size=300", "data.bpe_merges=30", "run.cpus_per_worker=0.4"]


def _cuts(args: list[str]) -> list[str]:
    """What the test appends to a README line: sizes only (the same data cuts for every verb, so
    the baseline finds the folder `dynlm run` prepared)."""
    if args[0] == "run":
        return ["--synth-documents", "24", *sets(*TINY)]
    if args[0] == "train":
        return sets(*TINY)
    if args[0] == "evaluate" and "--dynamic-eval" in args:
        return ["--stats-segments", "5", "--tune-documents", "2"]
    return []


def _table(text: str, title_part: str) -> dict[str, str]:
    """The rows of the metric table whose title contains ``title_part``: label -> perplexity."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if title_part in line)
    rows = {}
    for line in lines[start + 2:start + 2 + len(ROWS)]:
        match = re.match(r"\s+(.+?)\s+(\d+)\s+(\S+)$", line)
        assert match, line
        rows[match.group(1)] = match.group(3)
    return rows


def test_the_readme_lm_commands_from_a_fresh_clone(ray_session, mlflow_uri, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    fresh_clone(tmp_path)
    run_line, evaluate_line, baseline_line, dynamic_line = readme_block(LM_BLOCK)
    assert main(argv(run_line, _cuts)) == 0
    captured = capsys.readouterr()
    out = captured.out
    (key,) = set(re.findall(r"runs/prepared/([0-9a-f]{16})", out))  # what the user pastes for <key>
    # a newcomer's terminal: what runs, one line per epoch, the table, where to look; MLflow's and
    # Ray's own messages are in the log files
    lines = (captured.out + captured.err).splitlines()
    assert len(lines) <= 40, "\n".join(lines)
    assert not any(text in line for line in lines for text in ("Successfully registered", "INFO mlflow",
                                                                "streaming_executor", "Warning"))
    assert any(re.match(r"epoch 1/1  train loss \d", line) for line in lines)
    assert "mlflow ui --backend-store-uri" in out and mlflow_uri in out
    run_table = _table(out, "models:/dynlm-dntm@champion [champion v1]")
    assert set(run_table) == {"all tokens", "first mention", "re-appearing entity", "1 earlier mention",
                              "2 earlier mentions", "3-5 earlier mentions", "6+ earlier mentions",
                              "after an entity", "off the short list (OOV)"}
    assert 1.0 < float(run_table["all tokens"]) < 300 + 20  # at most ~ uniform over the vocabulary

    client = MlflowClient(mlflow_uri, registry_uri=mlflow_uri)  # the registry global may point elsewhere
    champion = client.get_model_version_by_alias("dynlm-dntm", "champion")
    assert str(champion.version) == "1"
    run = client.get_run(champion.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.epochs"] == "1"
    assert {"valid_ppl", "train_loss", "train_ppl", "best_valid_objective"} <= set(run.data.metrics)

    prepared_root = run.data.tags["dynlm.prepared_root"]
    assert prepared_root == str(tmp_path / "runs" / "prepared" / key)
    assert main(argv(evaluate_line, _cuts, key)) == 0
    evaluated = _table(capsys.readouterr().out, "models:/dynlm-dntm@champion")
    assert evaluated == run_table  # same weights, same test split, same numbers

    # raw files, encoded here with the registered preprocessor; plus dynamic evaluation
    assert main(["evaluate", "--model", "models:/dynlm-dntm@champion", "--data", "runs/synth",
                 "--dynamic-eval", "--stats-data", prepared_root, "--stats-segments", "5"]) == 0
    out = capsys.readouterr().out
    raw = _table(out, "24 documents")
    assert "dynamic evaluation: eta/lambda picked on validation" in out  # --eta auto, the default
    dynamic = _table(out, "dynamic evaluation (eta=")
    assert float(raw["all tokens"]) > 1.0 and float(dynamic["all tokens"]) > 1.0

    assert main(["evaluate", "--model", "models:/dynlm-dntm@champion", "--data", "runs/synth", "--split", "test"]) == 2
    assert capsys.readouterr().err == ("dynlm: error: evaluate: --split applies to a prepared folder, "
                                       "not to raw files\n")

    # every evaluation of the registered version is a run beside it: `dynlm run`'s and the two above
    from pipelines.tracking import EVALUATE_EXPERIMENT, TAG_EVALUATION_RUN

    evaluations = client.search_runs([client.get_experiment_by_name(EVALUATE_EXPERIMENT).experiment_id],
                                     order_by=["attributes.start_time ASC"])
    assert len(evaluations) == 3 and {r.data.tags["model_version"] for r in evaluations} == {"1"}
    assert {r.data.tags["model_run_id"] for r in evaluations} == {champion.run_id}
    assert [r.data.tags["data"] for r in evaluations][:2] == [f"{prepared_root} [test]", f"runs/prepared/{key} [test]"]
    assert evaluations[0].data.metrics["ppl"] == pytest.approx(float(run_table["all tokens"]), abs=0.01)
    assert client.get_model_version("dynlm-dntm", "1").tags[TAG_EVALUATION_RUN] == evaluations[-1].info.run_id

    # the baseline on the same prepared folder (reused, not prepared again), then its dynamic evaluation
    assert main(argv(baseline_line, _cuts)) == 0
    out = capsys.readouterr().out
    assert "registered dynlm-rnn v1" in out and f"reusing {prepared_root}" in out, out
    rnn = client.get_model_version_by_alias("dynlm-rnn", "champion")
    assert client.get_run(rnn.run_id).data.tags["dynlm.prepared_root"] == prepared_root
    assert main(argv(dynamic_line, _cuts, key)) == 0
    out = capsys.readouterr().out
    assert "models:/dynlm-rnn@champion" in out and "dynamic evaluation: eta/lambda picked on validation" in out
    static, dynamic = _table(out, "models:/dynlm-rnn@champion"), _table(out, "dynamic evaluation (eta=")
    assert float(dynamic["all tokens"]) < float(static["all tokens"])  # it adapts to each document
