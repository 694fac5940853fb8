"""The JobConfig of each trial of a search: the space's base job made portable (absolute paths,
the resolved storage and tracking URIs), plus the trial's sampled settings."""

from __future__ import annotations

from typing import Any

from dynlm import storage
from dynlm.job import JobConfig
from dynlm.search.space import SearchSpace, apply_params


def trials_base(space: SearchSpace, tracking_uri: str) -> JobConfig:
    """The base job with every local path absolute (trials run in other working directories),
    ``run.storage_path`` resolved (``$DYNLM_STORAGE_PATH``) and ``run.tracking_uri`` set."""
    base = space.base
    data = base.data.to_dict()
    data["inputs"] = [storage.absolute(p) for p in data["inputs"]]
    data["output_root"] = storage.absolute(data["output_root"])
    run = base.run.to_dict()
    run["storage_path"] = base.run.storage_uri()
    run["tracking_uri"] = tracking_uri
    return base.replace(data=data, run=run)


def trial_job(base: dict, params: dict[str, Any], name: str) -> JobConfig:
    """The JobConfig of one trial: ``base`` (a :func:`trials_base` dict) + its sampled ``params``
    (dotted keys), run ``name``, never registering or resuming on its own."""
    job = apply_params(JobConfig.from_dict(base), params)
    run = job.run.to_dict()
    run.update(name=name, register=False, resume=False)
    return job.replace(run=run)
