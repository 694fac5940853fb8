"""``dynlm evaluate --dynamic-eval``: ``--eta auto`` (the default) picks eta / lambda on the
valid split and prints the grid; a numeric ``--eta`` is used as given. No Ray: the prepared
folder comes from ``prepare_local`` and the model is a seeded checkpoint."""

from __future__ import annotations

import re

import pytest
import torch

from dynlm import checkpoint
from dynlm.data.config import DataConfig
from dynlm.data.synth import SynthConfig, write_conll
from dynlm.dynamic_eval import DEFAULT_ETAS, DEFAULT_LAMBDAS
from dynlm.models import build_model
from dynlm.models.rnn_lm import rnn_lm_small
from dynlm.tasks.local import prepare_local
from pipelines.cli import main


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory):
    """A prepared synthetic corpus and a seeded RNN LM checkpoint (with its preprocessor)."""
    tmp = tmp_path_factory.mktemp("evaluate")
    write_conll(SynthConfig(num_documents=24, docs_per_file=12), tmp / "raw")
    cfg = DataConfig(inputs=[str(tmp / "raw")], output_root=str(tmp / "out"), vocab_size=80,
                     bpe_merges=20, max_chains=4, valid_fraction=0.2, test_fraction=0.2)
    prepared = prepare_local(cfg)
    model_cfg = rnn_lm_small(embed_dim=16, hidden_dim=16, dropout=0.0)
    torch.manual_seed(0)
    model = build_model(model_cfg, prepared.spec)
    folder = tmp / "model"
    checkpoint.save(folder / "model.pt", model, model_cfg, prepared.spec)
    (folder / "preprocessor.json").write_bytes(prepared.read_bytes(prepared.manifest["preprocessor"]))
    return str(folder), str(prepared.root)


def _args(model, data, *extra):
    return ["evaluate", "--model", model, "--data", data, "--dynamic-eval", "--stats-segments", "5",
            "--tune-documents", "2", "--segment-len", "10", *extra]


def test_eta_auto_is_the_default_and_picks_the_best_validation_setting(model_and_data, capsys):
    model, data = model_and_data
    assert main(_args(model, data)) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\s+([0-9.e-]+)\s+([0-9.e-]+)\s+([0-9.]+)( \*)?$", out, flags=re.M)
    assert [(float(e), float(lam)) for e, lam, _, _ in rows] == [(e, lam) for e in DEFAULT_ETAS for lam in DEFAULT_LAMBDAS]
    picked = [row for row in rows if row[3]]
    assert len(picked) == 1 and float(picked[0][2]) == min(float(row[2]) for row in rows)
    assert "(2 valid documents of" in out
    assert re.search(rf"dynamic evaluation \(eta={float(picked[0][0]):g} auto, lambda={float(picked[0][1]):g},", out)


def test_a_numeric_eta_is_used_as_given(model_and_data, capsys):
    model, data = model_and_data
    assert main(_args(model, data, "--eta", "1e-3", "--lam", "0")) == 0
    out = capsys.readouterr().out
    assert "picked on validation" not in out
    assert "dynamic evaluation (eta=0.001, lambda=0, eps=0.001, segment=10)" in out
    with pytest.raises(SystemExit):
        main(_args(model, data, "--eta", "fast"))
    assert "--eta must be a number or 'auto'" in capsys.readouterr().err


def test_raw_files_report_what_was_quarantined(model_and_data, tmp_path, capsys):
    """The raw-file path counts and lists its quarantined records (file, line, document,
    reason) as ``prepare`` does, and scores the good documents."""
    import shutil
    from pathlib import Path

    model, _ = model_and_data
    raw = tmp_path / "raw"
    shutil.copytree(Path(model).parent / "raw", raw)
    (raw / "broken.conll").write_text("#begin document (broken); part 0\nbroken 0 0 The\n\n#end document\n")
    assert main(["evaluate", "--model", model, "--data", str(raw)]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "evaluate: 24 document(s) read, 1 record(s) quarantined, 0 document(s) dropped",
        f"  quarantine {raw / 'broken.conll'}:2 broken/part_0: wrong column count: 4 columns, at least 12 expected",
    ]
    assert "1 path(s), 24 documents" in captured.out


def test_json_is_one_object_with_the_tables_numbers(model_and_data, capsys):
    import json

    model, data = model_and_data
    assert main(["evaluate", "--model", model, "--data", data]) == 0
    table = capsys.readouterr().out
    assert main(_args(model, data, "--eta", "1e-3", "--lam", "0", "--json")) == 0
    (line,) = capsys.readouterr().out.splitlines()  # nothing but the object
    out = json.loads(line)
    assert out["model"] == model and out["task"] == "lm" and out["data"].endswith("[test]")
    all_tokens = next(row for row in table.splitlines() if row.strip().startswith("all tokens")).split()
    assert f"{out['metrics']['ppl']:.2f}" == all_tokens[-1]  # the table's number, unrounded
    assert int(all_tokens[-2].replace(",", "")) == out["metrics"]["tokens"]
    dynamic = out["dynamic_evaluation"]
    assert (dynamic["eta"], dynamic["lambda"], dynamic["eta_picked_on_valid"], dynamic["grid"]) == (1e-3, 0.0, False, None)
    assert dynamic["metrics"]["ppl"] > 1.0


def test_ray_scoring_choices_and_their_one_line_errors(model_and_data, tmp_path, capsys):
    """``--ray-scoring auto`` keeps a small split in this process (no Ray started: this test is
    in the unit tier); raw files cannot be scored on Ray, nor ``--use-gpu`` with ``never``."""
    from pathlib import Path

    from dynlm.data.prepared import PreparedData
    from pipelines.scoring import RAY_SCORING_MIN_BYTES, scores_on_ray

    model, data = model_and_data
    prepared = PreparedData.open(data)
    assert prepared.split_bytes("test") < RAY_SCORING_MIN_BYTES
    assert not scores_on_ray("auto", prepared, "test") and not scores_on_ray("never", prepared, "test")
    assert scores_on_ray("always", prepared, "test")
    assert main(["evaluate", "--model", model, "--data", data, "--json"]) == 0
    assert '"scored_on": "this process"' in capsys.readouterr().out
    raw = str(Path(model).parent / "raw")
    assert main(["evaluate", "--model", model, "--data", raw, "--ray-scoring", "always"]) == 2
    assert "raw files are scored in this process" in capsys.readouterr().err
    assert main(["evaluate", "--model", model, "--data", data, "--use-gpu", "--ray-scoring", "never"]) == 2
    assert "drop --ray-scoring never" in capsys.readouterr().err
