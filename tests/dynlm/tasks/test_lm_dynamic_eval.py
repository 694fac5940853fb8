"""The LM task's dynamic evaluation (``LMTask.dynamic_evaluate_documents``, what ``dynlm evaluate
--dynamic-eval`` calls) on a tiny seeded model over the synthetic corpus: with eta = lambda = 0 it
is static evaluation, adapting helps a document read twice, and ``eta="auto"`` evaluates with the
grid's best setting."""

from __future__ import annotations

import re

import pytest
import torch

from dynlm.config import ConfigError
from dynlm.data.config import DataConfig
from dynlm.data.synth import SynthConfig, write_conll
from dynlm.dynamic_eval import DEFAULT_ETAS, DEFAULT_LAMBDAS
from dynlm.models import rnn_lm_small
from dynlm.tasks import get_task
from dynlm.tasks.local import files_table, prepare_in_memory

RESULT_KEYS = ["eta", "lambda", "eps", "segment_len", "eta_picked_on_valid", "grid", "metrics"]
SMALL = dict(segment_len=10, stats_segments=5, batch_size=4)  # each a DynamicEvalOptions field


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """``(spec, rows by split)`` of a prepared synthetic corpus."""
    root = tmp_path_factory.mktemp("lm_dynamic_eval")
    files = write_conll(SynthConfig(num_documents=20, seed=5, docs_per_file=10), root / "corpus")
    cfg = DataConfig(inputs=[str(root / "corpus")], vocab_size=60, bpe_merges=20, max_chains=6,
                     valid_fraction=0.2, test_fraction=0.2)
    done = prepare_in_memory(get_task("lm"), files_table(files), cfg)
    assert all(done.splits[split] for split in ("train", "valid", "test"))
    return done.preprocessor.spec, done.splits


def _model(model_type, spec):
    """``(task, model, model_cfg)``: a seeded untrained model of ``model_type``."""
    task = get_task("lm")
    model_cfg = rnn_lm_small(type=model_type, embed_dim=16, hidden_dim=16, dropout=0.0)
    torch.manual_seed(0)
    return task, task.build_model(model_cfg, spec), model_cfg


def _options(task, **settings):
    return task.dynamic_evaluation_options.from_dict({**SMALL, **settings})


def test_the_options_are_strict_and_validated():
    options_class = get_task("lm").dynamic_evaluation_options
    assert options_class.from_dict({}).eta == "auto"
    assert options_class.from_dict({"eta": 0, "lam": 0}).eta == 0.0
    for wrong, message in [({"eta": "fast"}, "eta"), ({"eta": -1e-3}, "eta"), ({"lam": -1}, "lam"),
                           ({"eps": 0}, "eps"), ({"segment_len": 0}, "segment_len"), ({"learning_rate": 1e-3}, "unknown key")]:
        with pytest.raises(ConfigError, match=message):
            options_class.from_dict(wrong)


@pytest.mark.parametrize("model_type", ["rnn", "dntm"])
def test_no_step_and_no_decay_is_static_evaluation(corpus, model_type):
    """eta = lambda = 0: the metrics of ``evaluate_documents`` (counts exactly, the float32 sums
    to 1e-5: static evaluation reads a padded batch, dynamic evaluation one document at a time),
    and the weights are those of before."""
    spec, splits = corpus
    task, model, model_cfg = _model(model_type, spec)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    static = task.evaluate_documents(model, model_cfg, splits["test"], spec, 4)
    result = task.dynamic_evaluate_documents(model, model_cfg, spec, splits["test"], stats_rows=splits["train"],
                                             valid_rows=[], options=_options(task, eta=0.0, lam=0.0))
    assert list(result) == RESULT_KEYS
    assert (result["eta"], result["lambda"], result["eta_picked_on_valid"], result["grid"]) == (0.0, 0.0, False, None)
    dynamic = result["metrics"]
    assert set(dynamic) == set(static) and dynamic["tokens"] == static["tokens"] > 0
    for key, value in static.items():
        if key.startswith("count_"):
            assert dynamic[key] == value, key
        else:
            assert dynamic[key] == pytest.approx(value, rel=1e-5, abs=1e-9, nan_ok=True), key
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


def _read_twice(row: dict) -> dict:
    """The document followed by itself (every encoded column doubled)."""
    doubled = {key: row[key] * 2 for key in ("sentence_lengths", "word_ids", "entity_ids", "subword_ids", "subword_lengths")}
    return {**row, **doubled, "num_tokens": 2 * row["num_tokens"]}


def test_adapting_lowers_the_perplexity_of_documents_read_twice(corpus):
    spec, splits = corpus
    task, model, model_cfg = _model("rnn", spec)
    rows = [_read_twice(row) for row in splits["test"]]
    static = task.evaluate_documents(model, model_cfg, rows, spec, 4)
    result = task.dynamic_evaluate_documents(model, model_cfg, spec, rows, stats_rows=splits["train"], valid_rows=[],
                                             options=_options(task, eta=1e-2, lam=0.0))
    assert result["metrics"]["tokens"] == static["tokens"]
    assert result["metrics"]["ppl"] < 0.6 * static["ppl"]  # 30 vs 71 for this seed


def test_eta_auto_evaluates_with_the_grids_best_setting_and_prints_the_grid(corpus):
    spec, splits = corpus
    task, model, model_cfg = _model("rnn", spec)
    rows, valid = splits["test"][:2], splits["valid"][:1]

    def dynamic(**settings):
        return task.dynamic_evaluate_documents(model, model_cfg, spec, rows, stats_rows=splits["train"],
                                               valid_rows=valid, options=_options(task, **settings))

    auto = dynamic(eta="auto")
    grid = auto["grid"]
    assert [(point["eta"], point["lambda"]) for point in grid] == [(e, lam) for e in DEFAULT_ETAS for lam in DEFAULT_LAMBDAS]
    best = min(grid, key=lambda point: point["loss"])
    assert (auto["eta"], auto["lambda"], auto["eta_picked_on_valid"]) == (best["eta"], best["lambda"], True)
    assert auto["metrics"] == dynamic(eta=best["eta"], lam=best["lambda"])["metrics"]  # the same statistics, the same run
    assert [(point["eta"], point["lambda"]) for point in dynamic(eta="auto", lam=0.0)["grid"]] == [(e, 0.0) for e in DEFAULT_ETAS]

    text = task.dynamic_evaluation_text(auto, "the first valid document of here")
    marked = re.findall(r"^\s+([0-9.e-]+)\s+([0-9.e-]+)\s+[0-9.]+ \*$", text, flags=re.M)
    assert [(float(eta), float(lam)) for eta, lam in marked] == [(best["eta"], best["lambda"])]
    assert "\n  (the first valid document of here)\n" in text
    assert f"dynamic evaluation (eta={best['eta']:g} auto, lambda={best['lambda']:g}, eps=0.001, segment=10)" in text


def test_a_numeric_eta_prints_no_grid_and_the_setting_it_used(corpus):
    spec, splits = corpus
    task, model, model_cfg = _model("rnn", spec)
    result = task.dynamic_evaluate_documents(model, model_cfg, spec, splits["test"], stats_rows=splits["train"],
                                             valid_rows=[], options=_options(task, eta=1e-3))
    assert result["lambda"] == 0.02  # DynamicEvalConfig's default decay when --lam is not given
    text = task.dynamic_evaluation_text(result, "")
    assert "picked on validation" not in text
    assert "dynamic evaluation (eta=0.001, lambda=0.02, eps=0.001, segment=10)" in text


def test_missing_documents_are_errors(corpus):
    spec, splits = corpus
    task, model, model_cfg = _model("rnn", spec)
    with pytest.raises(ValueError, match="no training documents"):
        task.dynamic_evaluate_documents(model, model_cfg, spec, splits["test"], stats_rows=[], valid_rows=[],
                                        options=_options(task, eta=1e-3))
    with pytest.raises(ValueError, match="needs validation documents"):
        task.dynamic_evaluate_documents(model, model_cfg, spec, splits["test"], stats_rows=splits["train"],
                                        valid_rows=[], options=_options(task, eta="auto"))
