"""A validated :class:`dynlm.search.space.SearchSpace` as Ray Tune objects: the ``param_space``,
the searcher and the scheduler. Reading and validating a space file is Ray-free
(:mod:`dynlm.search.space_file`).
"""

from __future__ import annotations

from typing import Any

from dynlm.search.space import SearchSpace


def to_param_space(space: SearchSpace) -> dict[str, Any]:
    """The Ray Tune ``param_space``: flat dotted keys -> ``ray.tune`` domains.

    With ``searcher: grid`` every ``choice`` becomes ``tune.grid_search``.
    """
    from ray import tune

    params: dict[str, Any] = {}
    for key, spec in space.search.items():
        (kind, values), = spec.items()
        if space.is_grid_axis(key):
            params[key] = tune.grid_search(values)
        elif kind == "choice":
            params[key] = tune.choice(values)
        elif kind == "uniform":
            params[key] = tune.uniform(*values)
        elif kind == "loguniform":
            params[key] = tune.loguniform(*values)
        elif kind == "randint":
            params[key] = tune.randint(*values)
    return params


def searcher(space: SearchSpace):
    """Optuna TPE (``searcher: optuna``) or Ray's BasicVariantGenerator (``random`` / ``grid``)."""
    settings = space.tune
    if settings.searcher == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        return OptunaSearch(metric=settings.metric, mode=settings.mode, seed=settings.seed)
    from ray.tune.search.basic_variant import BasicVariantGenerator

    # A BasicVariantGenerator instance ignores TuneConfig.max_concurrent_trials: set it here.
    return BasicVariantGenerator(random_state=settings.seed, max_concurrent=settings.max_concurrent_trials)


def scheduler(space: SearchSpace):
    """ASHA (``scheduler: asha``, max_t = the largest ``train.epochs``) or FIFO."""
    if space.tune.scheduler == "fifo":
        from ray.tune.schedulers import FIFOScheduler

        return FIFOScheduler()
    from ray.tune.schedulers import ASHAScheduler

    # stop_last_trials=False: a trial that reaches max_t ends by itself. Stopping it at its last
    # report would kill it before its run logs the model (a race the trial loses under load).
    return ASHAScheduler(time_attr="training_iteration", max_t=space.max_epochs,
                         grace_period=space.tune.grace_period,
                         reduction_factor=space.tune.reduction_factor, stop_last_trials=False)
