"""The JobConfig of each trial: portable base (absolute paths) + sampled settings, never registering."""

from __future__ import annotations

import os

from dynlm.search.space_file import from_mapping
from dynlm.search.trials import trial_job, trials_base
from pipelines.defaults import default_job


def test_trial_job_is_base_plus_params_with_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DYNLM_STORAGE_PATH", raising=False)
    space = from_mapping({"base": {"data.inputs": ["corpus"], "run.storage_path": "ray"},
                          "search": {"model.dntm.merge_fn": {"choice": ["max", "latest"]}}},
                         base_job=default_job())
    base = trials_base(space, "sqlite:///x.db")
    assert base.data.inputs == [str((tmp_path / "corpus").resolve())]
    assert os.path.isabs(base.data.output_root) and os.path.isabs(base.run.storage_path)
    assert base.run.tracking_uri == "sqlite:///x.db"
    job = trial_job(base.to_dict(), {"model.dntm.merge_fn": "latest"}, "search-t0-120000")
    assert job.model.dntm.merge_fn == "latest" and job.data == base.data
    assert job.run.name == "search-t0-120000" and not job.run.register and not job.run.resume
