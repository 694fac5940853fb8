"""Search-space files: every file in tune_spaces/ validates; bad spaces fail before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dynlm.search.space import SearchSpaceError, data_configs
from dynlm.search.space_file import from_mapping, from_resolved, load_search_space
from pipelines.defaults import default_job

REPO = Path(__file__).resolve().parents[3]
SPACE_FILES = sorted(p for p in (REPO / "tune_spaces").rglob("*") if p.suffix in (".yaml", ".yml"))


def _space(search, tune=None, base=None):
    # subwords on, so that searching bpe_merges is meaningful (a bad-space case checks the "word" refusal)
    return {"base": {"model.embedding": "word+subword", **(base or {})}, "search": search, "tune": tune or {}}


def test_space_files_exist():
    names = {p.name for p in SPACE_FILES}
    assert {"dntm.yaml", "quickstart.yaml", "naming.yaml"} <= names


@pytest.mark.parametrize("path", SPACE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_space_file_validates(path):
    text = path.read_text(encoding="utf-8")
    assert text.lstrip().startswith("#"), "document the format in a comment at the top"
    space = load_search_space(path, base_job=default_job())
    assert space.expected_trials() >= 1
    assert space.source == str(path)
    for cfg in data_configs(space):  # every preprocessing setting the search can ask for
        assert type(cfg) is space.base.get_task().data_config
        if space.base.task == "lm":
            assert 0.0 < cfg.gamma <= 1.0 and cfg.bpe_merges >= 0


def test_naming_space_has_the_issue_axes():
    space = load_search_space(REPO / "tune_spaces" / "naming.yaml", base_job=default_job())
    assert space.base.task == "naming" and space.base.get_task().primary_metric == "f1_error"
    assert set(space.search) == {"model.type", "model.embed_dim", "model.context_size", "model.noise_samples"}
    assert space.search["model.type"] == {"grid": ["name", "subtoken"]} and space.expected_trials() == 8
    assert space.tune.metric == "valid_objective" and len(data_configs(space)) == 1  # one prepare for all trials


def test_dntm_space_has_the_paper_axes():
    space = load_search_space(REPO / "tune_spaces" / "dntm.yaml", base_job=default_job())
    assert space.search["model.dntm.merge_fn"] == {"choice": ["max", "gru", "gru_relu", "latest", "attention"]}
    assert space.search["model.dntm.dynamic"] == {"choice": ["input", "output", "both"]}
    assert space.search["model.dntm.adapt_entity_rows"] == {"choice": [True, False]}
    assert space.search["data.bpe_merges"] == {"choice": [0, 500, 1000, 5000, 20000]}
    assert space.search["data.gamma"] == {"uniform": [0.5, 1.0]}
    assert space.tune.searcher == "optuna"


def test_base_and_set_overrides():
    space = from_mapping(
        _space({"model.dntm.merge_fn": {"choice": ["max"]}}, base={"train.epochs": 3, "data.gamma": 0.5}),
        base_job=default_job(), overrides=["run.num_workers=1", "tune.num_samples=7", "train.lr=1e-3"],
    )
    assert space.base.train.epochs == 3 and space.base.data.gamma == 0.5
    assert space.base.run.num_workers == 1 and space.base.train.lr == 1e-3
    assert space.tune.num_samples == 7


def test_values_are_coerced_to_the_field_type():
    space = from_mapping(_space({"train.lr": {"choice": ["1e-3", 0.01]}, "model.hidden_dim": {"randint": [16.0, 33]}}),
                         base_job=default_job())
    assert space.search["train.lr"] == {"choice": [1e-3, 0.01]}
    assert space.search["model.hidden_dim"] == {"randint": [16, 33]}


def test_resolved_round_trip():
    space = load_search_space(REPO / "tune_spaces" / "quickstart.yaml", ["train.lr=0.01"], base_job=default_job())
    again = from_resolved(yaml.safe_load(yaml.safe_dump(space.to_dict())))
    assert again.to_dict() == space.to_dict()
    assert again.base.train.lr == 0.01


@pytest.mark.parametrize("raw, message", [
    (_space({"model.dntm.merge_fun": {"choice": ["max"]}}), "unknown key 'model.dntm.merge_fun'"),
    (_space({"hidden_dim": {"choice": [64]}}), "did you mean 'model.hidden_dim'"),
    (_space({"model.dntm.merge_fn": {"choice": []}}), "choice has no values"),
    (_space({"data.bpe_merges": {"grid": []}}), "grid has no values"),
    (_space({"data.gamma": {"choice": [0.5, 1.5]}}), "data.gamma must be in (0, 1], got 1.5"),
    (_space({"data.gamma": {"choice": [0.0]}}), "data.gamma must be in (0, 1], got 0.0"),
    (_space({"data.bpe_merges": {"choice": [100, -1]}}), "data.bpe_merges must be a non-negative integer, got -1"),
    (_space({"model.dntm.merge_fn": {"choice": ["max", "mean"]}}), "value 'mean' rejected"),
    (_space({"data.bpe_merges": {"randint": [0, 1000]}}), "data settings other than data.gamma must use choice or grid"),
    (_space({"data.gamma": {"uniform": [0.5, 1.2]}}), "data.gamma must be in (0, 1], got 1.2"),
    (_space({"data.gamma": {"uniform": [0.0, 1.0]}}), "data.gamma must be in (0, 1], got 0.0"),
    (_space({"data.bpe_merges": {"grid": [0, 50]}}, base={"model.embedding": "word"}),
     "every merge count would train the same model"),
    (_space({"data.gamma": {"uniform": [0.5, 1.0]}}, base={"model.embedding": "subword"}),
     "every gamma would train the same model"),
    (_space({"train.lr": {"loguniform": [0.0, 1e-2]}}), "loguniform needs lo > 0"),
    (_space({"train.lr": {"uniform": [1e-2, 1e-3]}}), "needs lo < hi"),
    (_space({"train.lr": {"normal": [0, 1]}}), "unknown distribution 'normal'"),
    (_space({"train.lr": {"uniform": [1e-3, 1e-2], "choice": [1]}}), "expected one of"),
    (_space({"model.dntm.merge_fn": {"uniform": [0, 1]}}), "needs a numeric field"),
    (_space({"train.lr": {"randint": [1, 5]}}), "randint needs an integer field"),
    (_space({"data.bpe_merges": {"grid": [0, 10]}}, tune={"searcher": "optuna"}), "grid is not supported by the optuna"),
    (_space({"train.lr": {"uniform": [1e-3, 1e-2]}}, tune={"searcher": "grid"}), "grid searcher needs choice or grid"),
    (_space({"run.num_workers": {"choice": [1, 2]}}), "run.* settings are not searchable"),
    (_space({"train.lr": {"choice": [1e-3]}}, tune={"num_sampels": 3}), "unknown key 'tune.num_sampels'"),
    (_space({"train.lr": {"choice": [1e-3]}}, tune={"searcher": "bayes"}), "'bayes' is not one of"),
    (_space({"train.lr": {"choice": [1e-3]}}, base={"data.vocab_sise": 10}), "base: unknown key 'data.vocab_sise'"),
    (_space({"train.lr": {"choice": [1e-3]}}, base={"data.gamma": 2.0}), "data.gamma must be in (0, 1]"),
    (_space({"train.lr": {"choice": [1e-3]}}, tune={"grace_period": 9}), "grace_period (9) exceeds the epochs"),
    (_space({}), "search is empty"),
    ({"base": {}, "search": {"train.lr": {"choice": [1e-3]}}, "tunes": {}}, "unknown section 'tunes'"),
    (["not", "a", "mapping"], "top level must be a mapping"),
])
def test_bad_spaces_fail_with_a_clear_error(raw, message):
    with pytest.raises(SearchSpaceError) as info:
        from_mapping(raw, base_job=default_job(), source="bad.yaml")
    assert message in str(info.value)
    assert "bad.yaml" in str(info.value)


def test_bad_set_override_fails():
    with pytest.raises(SearchSpaceError, match="unknown key 'run.num_wrkers'"):
        from_mapping(_space({"train.lr": {"choice": [1e-3]}}), base_job=default_job(), overrides=["run.num_wrkers=1"])
    with pytest.raises(SearchSpaceError, match="not of the form key=value"):
        from_mapping(_space({"train.lr": {"choice": [1e-3]}}), base_job=default_job(), overrides=["run.num_workers"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SearchSpaceError, match="does not exist"):
        load_search_space(tmp_path / "nope.yaml", base_job=default_job())
    bad = tmp_path / "bad.yaml"
    bad.write_text("search: {train.lr: [unclosed\n")
    with pytest.raises(SearchSpaceError, match="not valid YAML"):
        load_search_space(bad, base_job=default_job())


def test_base_task_switches_to_that_tasks_sections():
    """``base: {task: ...}`` searches another task: its own data/model keys, the default job's
    train/run settings; the LM's keys are unknown there, and the resolved space round-trips."""
    char = "tests.dynlm.tasks.char_task:CharTask"
    raw = {"base": {"task": char, "data.inputs": ["corpus"], "data.max_chars": 20, "train.epochs": 2},
           "search": {"model.hidden_dim": {"choice": [16, 32]}}, "tune": {"num_samples": 1}}
    space = from_mapping(raw, base_job=default_job(), overrides=["data.split_seed=3"])
    assert space.base.task == char and type(space.base.data).__name__ == "CharDataConfig"
    assert (space.base.data.max_chars, space.base.data.split_seed, space.base.train.epochs) == (20, 3, 2)
    assert space.base.run == default_job().run
    assert from_resolved(space.to_dict()).base == space.base
    with pytest.raises(SearchSpaceError, match="unknown key 'data.bpe_merges'"):
        from_mapping({**raw, "base": {**raw["base"], "data.bpe_merges": 10}}, base_job=default_job())
    with pytest.raises(SearchSpaceError, match="unknown key 'model.dntm.merge_fn'"):
        from_mapping({**raw, "search": {"model.dntm.merge_fn": {"choice": ["gru"]}}}, base_job=default_job())
    with pytest.raises(SearchSpaceError, match="task 'nope'"):
        from_mapping({**raw, "base": {"task": "nope"}}, base_job=default_job())


def test_saw_space_has_the_paper_axes():
    space = load_search_space(REPO / "tune_spaces" / "saw.yaml", base_job=default_job())
    assert space.base.task == "cloze" and space.base.get_task().primary_metric == "error"
    assert space.search["data.bpe_merges"] == {"choice": [0, 1000, 2000, 5000, 10000, 20000]}
    assert space.search["data.gamma"] == {"uniform": [0.1, 1.0]}
    assert space.search["model.combine"] == {"choice": ["concat", "sum", "mul"]}
    assert space.base.model.embedding == "word+subword" and space.expected_trials() == 24
