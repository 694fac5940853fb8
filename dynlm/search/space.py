"""A validated search space: the base job, the searched settings and the ``tune:`` settings.

Built from a space file by :mod:`dynlm.search.space_file`; ``pipelines/search_space.py`` turns
it into Ray Tune's ``param_space``, searcher and scheduler.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any, Literal

from dynlm.config import Config, ConfigError, config_hash
from dynlm.config import set_dotted as config_set_dotted
from dynlm.job import INGEST_FREE_CPUS, with_worker_cpus  # what every training's ingest leaves free

DISTRIBUTIONS = ("choice", "grid", "uniform", "loguniform", "randint")
DISCRETE = ("choice", "grid")
# The one data key that may be continuous: it changes the short list, not the encoded shards
# (pipelines.prepare derives a gamma's folder from a prepared sibling by hard links).
CONTINUOUS_DATA_KEY = "data.gamma"

# CPUs of the function each trial runs in (Ray rejects 0; the trial's TorchTrainer takes the rest).
TRIAL_DRIVER_CPUS = 0.01


class SearchSpaceError(ConfigError):
    """A search-space file is wrong; the message names the file and the key."""


@dataclass
class TuneSettings(Config):
    """The ``tune:`` section of a space file.

    Args:
        num_samples: trials to sample (random/optuna); with ``grid`` entries, repeats of the grid.
        searcher: ``random`` (Ray's BasicVariantGenerator), ``grid`` (every ``choice`` becomes a
            grid axis), ``optuna`` (Optuna TPE).
        scheduler: ``asha`` (early stopping at rungs, max_t = train.epochs) or ``fifo``.
        max_concurrent_trials: trials running at once (each trial = one TorchTrainer).
        grace_period: epochs before ASHA may stop a trial.
        reduction_factor: ASHA keeps 1/reduction_factor of the trials at each rung.
        metric / mode: what ASHA, the searcher and the best-trial pick optimise: any key of the
            epoch record; ``valid_objective`` is the task's primary metric on validation data
            (the LM: perplexity; lower is better), also what registration compares.
        seed: seed of the searcher.
    """

    num_samples: int = 4
    searcher: Literal["random", "grid", "optuna"] = "random"
    scheduler: Literal["asha", "fifo"] = "asha"
    max_concurrent_trials: int = 2
    grace_period: int = 1
    reduction_factor: int = 2
    metric: str = "valid_objective"
    mode: Literal["min", "max"] = "min"
    seed: int = 0

    def validate(self) -> None:
        for name in ("num_samples", "max_concurrent_trials", "grace_period"):
            if getattr(self, name) < 1:
                raise ConfigError(f"tune.{name} must be >= 1, got {getattr(self, name)}")
        if self.reduction_factor < 2:
            raise ConfigError(f"tune.reduction_factor must be >= 2, got {self.reduction_factor}")


@dataclass
class SearchSpace:
    """A validated space file.

    Attributes:
        base: the JobConfig every trial starts from (defaults + ``base:`` + ``--set``).
        search: dotted key -> ``{kind: values}`` exactly as in the file (validated).
        tune: the ``tune:`` section.
        source: the file it came from (for messages), or ``"<dict>"``.
    """

    base: Any  # dynlm.job.JobConfig
    search: dict[str, dict[str, list]]
    tune: TuneSettings
    source: str = "<dict>"

    def to_dict(self) -> dict:
        """A JSON-able mapping that :func:`dynlm.search.space_file.from_resolved` reads back to an
        equal space."""
        return {"base": self.base.to_dict(), "search": copy.deepcopy(self.search),
                "tune": self.tune.to_dict(), "source": self.source}

    @property
    def max_epochs(self) -> int:
        """Largest ``train.epochs`` any trial can get (ASHA's max_t)."""
        spec = self.search.get("train.epochs")
        if spec is None:
            return self.base.train.epochs
        kind, values = next(iter(spec.items()))
        return int(max(values) if kind in DISCRETE else values[1])

    def is_grid_axis(self, key: str) -> bool:
        """True when ``key``'s values are all tried (``grid``, or ``choice`` with the grid searcher)."""
        kind = next(iter(self.search[key]))
        return kind == "grid" or (kind == "choice" and self.tune.searcher == "grid")

    def expected_trials(self) -> int:
        """How many trials the searcher will create (grid axes multiply num_samples)."""
        grid_size = 1
        for key, spec in self.search.items():
            if self.is_grid_axis(key):
                grid_size *= len(next(iter(spec.values())))
        return self.tune.num_samples * grid_size


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    """:func:`dynlm.config.set_dotted`, raising :class:`SearchSpaceError`."""
    try:
        config_set_dotted(data, dotted, value)
    except ConfigError as exc:
        raise SearchSpaceError(str(exc)) from None


def get_dotted(config: Any, dotted: str) -> Any:
    """The value of a dotted field path (``"model.dntm.merge_fn"``) of a config object."""
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


def apply_params(base: Any, params: dict[str, Any]) -> Any:
    """The JobConfig of one trial: ``base`` with dotted ``params`` set (strictly re-validated)."""
    data = base.to_dict()
    for dotted, value in params.items():
        set_dotted(data, dotted, value)
    return type(base).from_dict(data)


def data_configs(space: SearchSpace) -> list[Any]:
    """Every distinct DataConfig of the discrete data settings (one preprocessing run each).

    A continuous ``data.gamma`` keeps the base value here: each trial derives its own gamma's
    folder from the prepared one (same encoding) when it starts.

    Returns:
        DataConfigs, unique by their settings (the inputs are not read: they may not exist
        until the search's pre-pass writes the synthetic corpus), in a deterministic order.
    """
    data_keys = [k for k in space.search if k.startswith("data.") and next(iter(space.search[k])) in DISCRETE]
    axes = [next(iter(space.search[k].values())) for k in data_keys]
    configs: dict[str, Any] = {}
    for combo in itertools.product(*axes):
        cfg = apply_params(space.base, dict(zip(data_keys, combo))).data
        settings = {k: v for k, v in cfg.to_dict().items() if k not in ("output_root", "num_encode_actors")}
        configs.setdefault(config_hash(settings), cfg)
    return list(configs.values())


def describe(space: SearchSpace) -> str:
    """A short human summary (printed before a search starts)."""
    lines = [f"search space {space.source}: {space.expected_trials()} trials, "
             f"searcher={space.tune.searcher}, scheduler={space.tune.scheduler}, "
             f"max_concurrent_trials={space.tune.max_concurrent_trials}"]
    for key, spec in space.search.items():
        (kind, values), = spec.items()
        lines.append(f"  {key}: {kind} {values}")
    return "\n".join(lines)


def check_trials_fit(space: SearchSpace, cluster_cpus: float) -> None:
    """Fail at once when the concurrent trials would leave less than one CPU of this (single,
    non-autoscaling) node free: every trial's ingest would then wait for a CPU forever.

    Raises:
        SearchSpaceError: naming the CPUs the trials reserve and the settings that fix it.
    """
    concurrent = min(space.tune.max_concurrent_trials, space.expected_trials())
    run = with_worker_cpus(space.base.run, cluster_cpus, concurrent_runs=concurrent)
    per_trial = run.num_workers * run.cpus_per_worker + TRIAL_DRIVER_CPUS
    free = cluster_cpus - concurrent * per_trial
    if free < INGEST_FREE_CPUS - 1e-9:
        raise SearchSpaceError(
            f"{concurrent} concurrent trials x {per_trial:g} CPU (run.num_workers={run.num_workers} x "
            f"run.cpus_per_worker={run.cpus_per_worker:g} + {TRIAL_DRIVER_CPUS:g} for the trial "
            f"driver) leave {free:.2f} of this node's {cluster_cpus:g} CPUs free; Ray Data's ingest needs "
            f"{INGEST_FREE_CPUS:g}, so the trials would wait forever. Lower run.cpus_per_worker or "
            "tune.max_concurrent_trials")
