"""A trained model's files and its scoring: artifacts round trip, input parsing, per-token scores."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from dynlm import serving
from dynlm.data.config import DataConfig
from dynlm.data.preprocessor import Preprocessor
from dynlm.models import build_model, rnn_lm_small
from dynlm.requests import InputError
from dynlm.tasks import lm_serving

COUNTS = {"the": 9, "ship": 5, "sailed": 3, "home": 3, ".": 9}


@pytest.fixture
def artifacts(tmp_path):
    """A seeded tiny LSTM LM written as the three artifact files; ``(paths, model, model_cfg, preprocessor)``."""
    preprocessor = Preprocessor.fit(COUNTS, DataConfig(inputs=["memory"], vocab_size=20, bpe_merges=10, max_chains=3))
    preprocessor_path = preprocessor.save(tmp_path / "fitted.json")
    model_cfg = rnn_lm_small(embed_dim=8, hidden_dim=8, dropout=0.0)
    torch.manual_seed(1)
    model = build_model(model_cfg, preprocessor.spec).eval()
    paths = serving.write_artifacts(tmp_path / "model" / "artifacts", model, model_cfg, preprocessor.spec,
                                    preprocessor_path)
    return paths, model, model_cfg, preprocessor


def test_artifacts_round_trip(artifacts):
    paths, model, model_cfg, preprocessor = artifacts
    assert set(paths) == {"weights", "model_config", "preprocessor"}
    task, loaded, loaded_cfg, spec, loaded_pre = serving.load_artifacts(
        paths["weights"], paths["model_config"], paths["preprocessor"])
    assert task.name == "lm" and json.loads(Path(paths["model_config"]).read_text())["task"] == "lm"
    assert loaded_cfg == model_cfg and spec == preprocessor.spec and loaded_pre.spec == spec
    assert not loaded.training
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_load_rejects_foreign_or_incomplete_files(artifacts, tmp_path):
    paths = artifacts[0]
    foreign_cfg = DataConfig(inputs=["memory"], vocab_size=5, bpe_merges=5, max_chains=4)
    foreign = Preprocessor.fit({"one": 3, "two": 2, "three": 1}, foreign_cfg).save(tmp_path / "foreign.json")
    with pytest.raises(ValueError, match="does not match the model's vocabulary"):
        serving.load_artifacts(paths["weights"], paths["model_config"], foreign)
    config = tmp_path / "model.json"
    config.write_text(json.dumps({"format": "dynlm-pyfunc", "version": 1}))
    with pytest.raises(ValueError, match="not a dynlm-pyfunc v2 config"):
        serving.load_artifacts(paths["weights"], config, paths["preprocessor"])
    assert serving.load_model_dir(tmp_path / "model")[2] == artifacts[2]
    with pytest.raises(FileNotFoundError, match=r"is not a dynlm pyfunc model: missing artifacts/\['weights.pt'"):
        serving.load_model_dir(tmp_path)


def test_parse_input_forms():
    text = "the ship sailed .\n\n  home .  "
    expected = [[["the", "ship", "sailed", "."], ["home", "."]]]
    assert lm_serving.parse_input(text) == expected
    assert lm_serving.parse_input([text]) == expected
    assert lm_serving.parse_input({"tokens": [[["the", " ", "ship"], []]]}) == [[["the", "ship"]]]
    frame = pd.DataFrame({"text": [text, None], "tokens": [None, [["home"]]]})
    assert lm_serving.parse_input(frame) == [*expected, [["home"]]]


@pytest.mark.parametrize("model_input, message", [
    (42, "expected a DataFrame with a 'text' or 'tokens' column, got int"),
    (pd.DataFrame({"words": ["a"]}), r"unknown input column\(s\) \['words'\]"),
    (pd.DataFrame({"text": ["a", " \n"]}), "document 1 is empty: give at least one line"),
    (pd.DataFrame({"text": ["a"], "tokens": [[["a"]]]}), "document 0: give 'text' or 'tokens', not both"),
    (pd.DataFrame({"text": [None]}), "document 0 is empty: no 'text' and no 'tokens'"),
    (pd.DataFrame({"tokens": [[[1, 2]]]}), "each a list of strings"),
    (pd.DataFrame({"tokens": [5]}), "'tokens' must be a list of sentences .* got int"),
    (pd.DataFrame(index=[0]), "the input has no 'text' or 'tokens' column"),
    (pd.DataFrame({"tokens": [[["a", "\ud800"]]]}), r"document 0: token '\\ud800' is not valid Unicode text"),
])
def test_parse_input_errors_name_the_document(model_input, message):
    with pytest.raises(InputError, match=message):
        lm_serving.parse_input(model_input)
    assert issubclass(InputError, ValueError)


def test_score_documents(artifacts):
    _, model, model_cfg, preprocessor = artifacts
    documents = lm_serving.parse_input(["the ship sailed .\nhome .", "zeppelin ."])
    first, second = lm_serving.score_documents(model, model_cfg, preprocessor.spec, preprocessor, documents)
    assert first["tokens"] == ["the", "ship", "sailed", ".", "<eos>", "home", ".", "<eos>"]
    assert first["num_tokens"] == 8 and first["num_unknown"] == 0
    assert first["log_prob"] == pytest.approx(sum(first["token_log_probs"]))
    assert first["perplexity"] == pytest.approx(math.exp(-first["log_prob"] / 8))
    assert second["tokens"] == ["zeppelin", ".", "<eos>"] and second["num_unknown"] == 1
    alone = lm_serving.score_documents(model, model_cfg, preprocessor.spec, preprocessor, documents[1:])[0]
    assert alone["token_log_probs"] == pytest.approx(second["token_log_probs"], abs=1e-6)  # batch-independent


def test_score_documents_refuses_an_entity_beyond_the_chains(artifacts):
    _, model, model_cfg, preprocessor = artifacts
    known = f"<unk{preprocessor.spec.num_entities}>"
    lm_serving.score_documents(model, model_cfg, preprocessor.spec, preprocessor, lm_serving.parse_input(f"{known} ."))
    beyond = f"<unk{preprocessor.spec.num_entities + 1}>"
    with pytest.raises(InputError, match=(
            rf"^document 1: entity token '{beyond}' is beyond max_chains={preprocessor.spec.num_entities} "
            rf"\(this model reads the entities <unk1>..{known}\)$")):
        lm_serving.score_documents(model, model_cfg, preprocessor.spec, preprocessor,
                                lm_serving.parse_input(["the ship .", f"{beyond} laughed ."]))
