"""Search-space files: every file in tune_spaces/ validates; bad spaces fail before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dynlm.config import field_paths
from pipelines.search_space import (
    SearchSpaceError,
    apply_params,
    data_configs,

    from_mapping,
    from_resolved,
    load_search_space,
    to_param_space,
)

REPO = Path(__file__).resolve().parents[2]
SPACE_FILES = sorted(p for p in (REPO / "tune_spaces").rglob("*") if p.suffix in (".yaml", ".yml"))


def _space(search, tune=None, base=None):
    # subwords on, so that searching bpe_merges is meaningful (a bad-space case checks the "word" refusal)
    return {"base": {"model.embedding": "word+subword", **(base or {})}, "search": search, "tune": tune or {}}


def test_space_files_exist():
    names = {p.name for p in SPACE_FILES}
    assert {"dntm.yaml", "quickstart.yaml"} <= names


@pytest.mark.parametrize("path", SPACE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_space_file_validates(path):
    text = path.read_text(encoding="utf-8")
    assert text.lstrip().startswith("#"), "document the format in a comment at the top"
    space = load_search_space(path)
    params = to_param_space(space)
    assert set(params) == set(space.search)
    assert space.expected_trials() >= 1
    for cfg in data_configs(space):  # every preprocessing setting the search can ask for
        assert 0.0 < cfg.gamma <= 1.0 and cfg.bpe_merges >= 0


def test_quickstart_counts():
    space = load_search_space(REPO / "tune_spaces" / "quickstart.yaml")
    assert space.expected_trials() == 4  # 2 samples x grid of 2 bpe_merges values
    configs = data_configs(space)
    assert sorted(c.bpe_merges for c in configs) == [0, 200]
    assert len(configs) == 2 and configs[0] != configs[1]
    assert space.max_epochs == 2


def test_a_continuous_gamma_prepares_each_encoding_once():
    space = from_mapping(_space({"data.gamma": {"uniform": [0.5, 1.0]}, "data.bpe_merges": {"grid": [0, 50]}}),
                         source="t.yaml")
    configs = data_configs(space)
    assert sorted(c.bpe_merges for c in configs) == [0, 50]
    assert {c.gamma for c in configs} == {space.base.data.gamma}  # the trials derive theirs
    assert to_param_space(space)["data.gamma"].lower == 0.5


def test_dntm_space_has_the_paper_axes():
    space = load_search_space(REPO / "tune_spaces" / "dntm.yaml")
    assert space.search["model.dntm.merge_fn"] == {"choice": ["max", "gru", "gru_relu", "latest", "attention"]}
    assert space.search["model.dntm.dynamic"] == {"choice": ["input", "output", "both"]}
    assert space.search["data.bpe_merges"] == {"choice": [0, 500, 1000, 5000, 20000]}
    assert space.search["data.gamma"] == {"uniform": [0.5, 1.0]}
    assert len(data_configs(space)) == 5  # one preprocessing run per merge count; gamma is derived
    assert space.tune.searcher == "optuna"


def test_param_space_domains_sample_inside_bounds():
    from ray import tune

    space = from_mapping(_space({
        "train.lr": {"loguniform": [1e-4, 1e-2]},
        "model.dropout": {"uniform": [0.0, 0.5]},
        "model.hidden_dim": {"randint": [16, 33]},
        "model.dntm.merge_fn": {"choice": ["max", "gru"]},
        "data.bpe_merges": {"grid": [0, 10]},
    }))
    params = to_param_space(space)
    assert params["data.bpe_merges"] == tune.grid_search([0, 10])
    for _ in range(50):
        assert 1e-4 <= params["train.lr"].sample() <= 1e-2
        assert 0.0 <= params["model.dropout"].sample() <= 0.5
        assert 16 <= params["model.hidden_dim"].sample() < 33
        assert params["model.dntm.merge_fn"].sample() in ("max", "gru")
    assert space.expected_trials() == 4 * 2  # default num_samples=4 x 2 grid values


def test_grid_searcher_turns_choices_into_grid_axes():
    from ray import tune

    space = from_mapping(_space({"model.dntm.merge_fn": {"choice": ["max", "gru", "latest"]}},
                                tune={"searcher": "grid", "num_samples": 1}))
    assert to_param_space(space)["model.dntm.merge_fn"] == tune.grid_search(["max", "gru", "latest"])
    assert space.expected_trials() == 3


def test_base_and_set_overrides():
    space = from_mapping(
        _space({"model.dntm.merge_fn": {"choice": ["max"]}}, base={"train.epochs": 3, "data.gamma": 0.5}),
        overrides=["run.num_workers=1", "tune.num_samples=7", "train.lr=1e-3"],
    )
    assert space.base.train.epochs == 3 and space.base.data.gamma == 0.5
    assert space.base.run.num_workers == 1 and space.base.train.lr == 1e-3
    assert space.tune.num_samples == 7


def test_apply_params_and_resolved_round_trip():
    space = load_search_space(REPO / "tune_spaces" / "quickstart.yaml")
    job = apply_params(space.base, {"model.dntm.merge_fn": "latest", "data.bpe_merges": 0})
    assert job.model.dntm.merge_fn == "latest" and job.data.bpe_merges == 0
    assert job.train.epochs == space.base.train.epochs
    again = from_resolved(yaml.safe_load(yaml.safe_dump(space.to_dict())))
    assert again.to_dict() == space.to_dict()


def test_field_paths_are_dotted_leaves():
    from dynlm.job import JobConfig

    paths = field_paths(JobConfig.from_dict({"data": {"inputs": ["corpus"]}}))
    assert {"data.gamma", "data.bpe_merges", "model.dntm.merge_fn", "train.lr", "run.num_workers"} <= set(paths)
    assert "model.dntm" not in paths  # sections are not leaves


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
        from_mapping(raw, source="bad.yaml")
    assert message in str(info.value)
    assert "bad.yaml" in str(info.value)


def test_bad_set_override_fails():
    with pytest.raises(SearchSpaceError, match="unknown key 'run.num_wrkers'"):
        from_mapping(_space({"train.lr": {"choice": [1e-3]}}), overrides=["run.num_wrkers=1"])
    with pytest.raises(SearchSpaceError, match="not of the form key=value"):
        from_mapping(_space({"train.lr": {"choice": [1e-3]}}), overrides=["run.num_workers"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SearchSpaceError, match="does not exist"):
        load_search_space(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("search: {train.lr: [unclosed\n")
    with pytest.raises(SearchSpaceError, match="not valid YAML"):
        load_search_space(bad)


def test_cli_rejects_a_bad_space_before_ray_starts(tmp_path, capsys):
    from pipelines.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"search": {"data.gamma": {"choice": [0.5, 1.5]}}}))
    assert main(["tune", "--space", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "data.gamma must be in (0, 1], got 1.5" in err and str(bad) in err
    with pytest.raises(SystemExit):
        main(["tune"])  # neither --space nor --resume
