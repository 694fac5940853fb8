"""A search space as Ray Tune objects (param_space, searcher, scheduler); a bad space file fails
before Ray starts. Reading and validating space files: tests/dynlm/search/."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dynlm.search.space_file import from_mapping, load_search_space
from pipelines.defaults import default_job
from pipelines.search_space import scheduler, searcher, to_param_space

REPO = Path(__file__).resolve().parents[2]
SPACE_FILES = sorted(p for p in (REPO / "tune_spaces").rglob("*") if p.suffix in (".yaml", ".yml"))


def _space(search, tune=None, base=None):
    # subwords on, so that searching bpe_merges is meaningful
    raw = {"base": {"model.embedding": "word+subword", **(base or {})}, "search": search, "tune": tune or {}}
    return from_mapping(raw, base_job=default_job(), source="t.yaml")


@pytest.mark.parametrize("path", SPACE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_space_file_has_a_param_space(path):
    space = load_search_space(path, base_job=default_job())
    assert set(to_param_space(space)) == set(space.search)


def test_a_continuous_gamma_is_a_tune_domain():
    space = _space({"data.gamma": {"uniform": [0.5, 1.0]}, "data.bpe_merges": {"grid": [0, 50]}})
    assert to_param_space(space)["data.gamma"].lower == 0.5


def test_param_space_domains_sample_inside_bounds():
    from ray import tune

    space = _space({
        "train.lr": {"loguniform": [1e-4, 1e-2]},
        "model.dropout": {"uniform": [0.0, 0.5]},
        "model.hidden_dim": {"randint": [16, 33]},
        "model.dntm.merge_fn": {"choice": ["max", "gru"]},
        "data.bpe_merges": {"grid": [0, 10]},
    })
    params = to_param_space(space)
    assert params["data.bpe_merges"] == tune.grid_search([0, 10])
    for _ in range(50):
        assert 1e-4 <= params["train.lr"].sample() <= 1e-2
        assert 0.0 <= params["model.dropout"].sample() <= 0.5
        assert 16 <= params["model.hidden_dim"].sample() < 33
        assert params["model.dntm.merge_fn"].sample() in ("max", "gru")


def test_grid_searcher_turns_choices_into_grid_axes():
    from ray import tune

    space = _space({"model.dntm.merge_fn": {"choice": ["max", "gru", "latest"]}},
                   tune={"searcher": "grid", "num_samples": 1})
    assert to_param_space(space)["model.dntm.merge_fn"] == tune.grid_search(["max", "gru", "latest"])


def test_searcher_and_scheduler_follow_the_tune_settings():
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator
    from ray.tune.search.optuna import OptunaSearch

    space = _space({"train.lr": {"choice": [1e-3]}}, tune={"max_concurrent_trials": 3})
    assert isinstance(searcher(space), BasicVariantGenerator) and searcher(space).max_concurrent == 3
    assert isinstance(scheduler(space), ASHAScheduler)
    optuna = _space({"train.lr": {"choice": [1e-3]}}, tune={"searcher": "optuna", "scheduler": "fifo"})
    assert isinstance(searcher(optuna), OptunaSearch) and isinstance(scheduler(optuna), FIFOScheduler)


def test_cli_rejects_a_bad_space_before_ray_starts(tmp_path, capsys):
    from pipelines.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"search": {"data.gamma": {"choice": [0.5, 1.5]}}}))
    assert main(["tune", "--space", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "data.gamma must be in (0, 1], got 1.5" in err and str(bad) in err
    assert main(["tune"]) == 2  # neither --space nor --resume
    assert capsys.readouterr().err == "dynlm: error: tune: give exactly one of --space FILE or --resume EXPERIMENT\n"
