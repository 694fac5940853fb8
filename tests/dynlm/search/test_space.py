"""SearchSpace: trial counts, the distinct data configs of the pre-pass, one trial's job, and
whether the concurrent trials fit on one node."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynlm.config import field_paths
from dynlm.search.space import (
    SearchSpaceError,
    apply_params,
    check_trials_fit,
    data_configs,
    describe,
)
from dynlm.search.space_file import load_search_space
from pipelines.defaults import default_job

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "tune_spaces" / "quickstart.yaml"


def test_quickstart_counts():
    space = load_search_space(QUICKSTART, base_job=default_job())
    assert space.expected_trials() == 4  # 2 samples x grid of 2 bpe_merges values
    configs = data_configs(space)
    assert sorted(c.bpe_merges for c in configs) == [0, 200]
    assert len(configs) == 2 and configs[0] != configs[1]
    assert space.max_epochs == 2


def test_dntm_space_prepares_one_config_per_merge_count():
    space = load_search_space(REPO / "tune_spaces" / "dntm.yaml", base_job=default_job())
    assert len(data_configs(space)) == 5  # one preprocessing run per merge count; gamma is derived


def test_a_continuous_gamma_prepares_each_encoding_once(make_space):
    space = make_space({"data.gamma": {"uniform": [0.5, 1.0]}, "data.bpe_merges": {"grid": [0, 50]}})
    configs = data_configs(space)
    assert sorted(c.bpe_merges for c in configs) == [0, 50]
    assert {c.gamma for c in configs} == {space.base.data.gamma}  # the trials derive theirs


def test_grid_axes_multiply_the_samples(make_space):
    space = make_space({"train.lr": {"loguniform": [1e-4, 1e-2]}, "data.bpe_merges": {"grid": [0, 10]},
                    "model.dntm.merge_fn": {"choice": ["max", "gru"]}})
    assert space.expected_trials() == 4 * 2  # default num_samples=4 x 2 grid values
    grid = make_space({"model.dntm.merge_fn": {"choice": ["max", "gru", "latest"]}},
                  tune={"searcher": "grid", "num_samples": 1})
    assert grid.is_grid_axis("model.dntm.merge_fn") and grid.expected_trials() == 3
    assert describe(grid).splitlines() == [
        "search space t.yaml: 3 trials, searcher=grid, scheduler=asha, max_concurrent_trials=2",
        "  model.dntm.merge_fn: choice ['max', 'gru', 'latest']"]


def test_max_epochs_is_the_largest_searched_epochs(make_space):
    assert make_space({"train.epochs": {"choice": [2, 6, 3]}}).max_epochs == 6
    assert make_space({"train.lr": {"choice": [1e-3]}}, base={"train.epochs": 5}).max_epochs == 5


def test_apply_params():
    space = load_search_space(QUICKSTART, base_job=default_job())
    job = apply_params(space.base, {"model.dntm.merge_fn": "latest", "data.bpe_merges": 0})
    assert job.model.dntm.merge_fn == "latest" and job.data.bpe_merges == 0
    assert job.train.epochs == space.base.train.epochs
    with pytest.raises(SearchSpaceError, match="model.dntm.merge_fun"):
        apply_params(space.base, {"model.dntm.merge_fun": "max"})


def test_field_paths_are_dotted_leaves():
    from dynlm.job import JobConfig

    paths = field_paths(JobConfig.from_dict({"data": {"inputs": ["corpus"]}}))
    assert {"data.gamma", "data.bpe_merges", "model.dntm.merge_fn", "train.lr", "run.num_workers"} <= set(paths)
    assert "model.dntm" not in paths  # sections are not leaves


def test_trials_that_leave_no_cpu_for_the_ingest_are_refused():
    """2 trials x (0.5 + 0.01) CPU on 2 cores left 0.98 CPU: Ray Data's 1-CPU listing task of
    every trial's ingest waited forever (the shipped quickstart did, before it asked 0.4)."""
    def quickstart(overrides):
        return load_search_space(QUICKSTART, overrides, base_job=default_job())

    check_trials_fit(quickstart([]), 2.0)  # 2 x 0.41 leaves 1.18
    greedy = quickstart(["run.cpus_per_worker=0.5"])
    with pytest.raises(SearchSpaceError, match=r"2 concurrent trials x 0.51 CPU .* leave 0.98 of this node's 2 CPUs"):
        check_trials_fit(greedy, 2.0)
    check_trials_fit(quickstart(["run.cpus_per_worker=0.5", "tune.max_concurrent_trials=1"]), 2.0)
    check_trials_fit(greedy, 4.0)
