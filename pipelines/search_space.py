"""Load and validate a ``tune_spaces/*.yaml`` file into a Ray Tune ``param_space``.

A space file is a YAML mapping with three sections::

    base:                      # dotted-key overrides of the embedded default JobConfig
      data.inputs: [runs/synth]
      train.epochs: 2
    search:                    # dotted key -> one distribution
      model.dntm.merge_fn: {choice: [max, gru]}
      data.bpe_merges: {grid: [0, 1000]}
      data.gamma: {choice: [0.5, 0.9]}
      train.lr: {loguniform: [1.0e-4, 1.0e-2]}
      model.hidden_dim: {randint: [64, 257]}     # hi is exclusive (Ray Tune's randint)
    tune:                      # TuneSettings below
      num_samples: 4
      searcher: random         # random | grid | optuna
      scheduler: asha          # asha | fifo
      max_concurrent_trials: 2
      grace_period: 1
      metric: valid_ppl
      mode: min

Every error is raised here, before Ray starts: unknown keys (checked against JobConfig's dotted
field paths), empty choices, values the field's type rejects, ``data.gamma`` outside (0, 1],
negative ``data.bpe_merges``, continuous distributions over ``data.*`` keys other than
``data.gamma`` (each distinct encoding setting is one preprocessing run, so those must be
``choice`` or ``grid``; gamma only changes the short list, and a trial derives its folder from
the prepared one in well under a second), and ``grid`` with the Optuna searcher.
"""

from __future__ import annotations

import copy
import itertools
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from dynlm.config import Config, ConfigError, _parse_scalar, config_hash, field_paths
from dynlm.config import set_dotted as config_set_dotted

DISTRIBUTIONS = ("choice", "grid", "uniform", "loguniform", "randint")
DISCRETE = ("choice", "grid")
# The one data key that may be continuous: it changes the short list, not the encoded shards
# (pipelines.prepare derives a gamma's folder from a prepared sibling by hard links).
CONTINUOUS_DATA_KEY = "data.gamma"


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
        metric / mode: what ASHA, the searcher and the best-trial pick optimise.
        seed: seed of the searcher.
    """

    num_samples: int = 4
    searcher: Literal["random", "grid", "optuna"] = "random"
    scheduler: Literal["asha", "fifo"] = "asha"
    max_concurrent_trials: int = 2
    grace_period: int = 1
    reduction_factor: int = 2
    metric: str = "valid_ppl"
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
        """A JSON-able mapping that :func:`from_resolved` reads back to an equal space."""
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

    def expected_trials(self) -> int:
        """How many trials the searcher will create (grid axes multiply num_samples)."""
        grid_size = 1
        for spec in self.search.values():
            kind, values = next(iter(spec.items()))
            if kind == "grid" or (kind == "choice" and self.tune.searcher == "grid"):
                grid_size *= len(values)
        return self.tune.num_samples * grid_size


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    """:func:`dynlm.config.set_dotted`, raising :class:`SearchSpaceError`."""
    try:
        config_set_dotted(data, dotted, value)
    except ConfigError as exc:
        raise SearchSpaceError(str(exc)) from None


def apply_params(base: Any, params: dict[str, Any]) -> Any:
    """The JobConfig of one trial: ``base`` with dotted ``params`` set (strictly re-validated)."""
    data = base.to_dict()
    for dotted, value in params.items():
        set_dotted(data, dotted, value)
    return type(base).from_dict(data)


def _numeric_kind(annotation: Any) -> type | None:
    """float or int when the field holds a number (Optional allowed), else None."""
    if annotation in (float, typing.Optional[float]):
        return float
    if annotation in (int, typing.Optional[int]):
        return int
    return None


# Value ranges checked here (on top of each Config.validate) so a bad space fails by name.
def _check_range(key: str, value: Any, where: str) -> None:
    if key == "data.gamma" and not (isinstance(value, (int, float)) and 0.0 < value <= 1.0):
        raise SearchSpaceError(f"{where}: data.gamma must be in (0, 1], got {value!r}")
    if key == "data.bpe_merges" and not (isinstance(value, int) and value >= 0):
        raise SearchSpaceError(f"{where}: data.bpe_merges must be a non-negative integer, got {value!r}")
    if key in ("data.vocab_size", "train.epochs", "train.batch_size") and not (isinstance(value, int) and value > 0):
        raise SearchSpaceError(f"{where}: {key} must be a positive integer, got {value!r}")
    if key == "train.lr" and not (isinstance(value, (int, float)) and value > 0):
        raise SearchSpaceError(f"{where}: train.lr must be positive, got {value!r}")


def _validate_entry(key: str, spec: Any, base: Any, paths: dict, searcher: str, where: str) -> dict:
    where = f"{where}: search.{key}"
    if key not in paths:
        close = [p for p in paths if p.split(".")[-1] == key.split(".")[-1]]
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SearchSpaceError(f"{where}: unknown key {key!r}{hint}")
    if key.startswith("run."):
        raise SearchSpaceError(f"{where}: run.* settings are not searchable (set them in base:)")
    if not isinstance(spec, dict) or len(spec) != 1:
        raise SearchSpaceError(f"{where}: expected one of {{{'|'.join(DISTRIBUTIONS)}: [...]}}, got {spec!r}")
    (kind, values), = spec.items()
    if kind not in DISTRIBUTIONS:
        raise SearchSpaceError(f"{where}: unknown distribution {kind!r}; use one of {list(DISTRIBUTIONS)}")
    if not isinstance(values, list):
        raise SearchSpaceError(f"{where}: {kind} needs a list, got {values!r}")
    if kind in DISCRETE:
        if not values:
            raise SearchSpaceError(f"{where}: {kind} has no values")
        if kind == "grid" and searcher == "optuna":
            raise SearchSpaceError(f"{where}: grid is not supported by the optuna searcher; use choice")
        coerced = []
        for value in values:
            if isinstance(value, (int, float)):
                _check_range(key, value, where)
            try:  # the field's own type and range checks
                value = _get_dotted(apply_params(base, {key: value}), key)
            except ConfigError as exc:
                raise SearchSpaceError(f"{where}: value {value!r} rejected: {exc}") from exc
            _check_range(key, value, where)
            coerced.append(value)
        return {kind: coerced}
    # continuous / integer ranges
    if key.startswith("data.") and key != CONTINUOUS_DATA_KEY:
        raise SearchSpaceError(
            f"{where}: data settings other than {CONTINUOUS_DATA_KEY} must use choice or grid "
            f"(each distinct value is one preprocessing run), got {kind}")
    if searcher == "grid":
        raise SearchSpaceError(f"{where}: the grid searcher needs choice or grid values, got {kind}")
    number = _numeric_kind(paths[key])
    if number is None:
        raise SearchSpaceError(f"{where}: {kind} needs a numeric field, {key} is {paths[key]}")
    if kind == "randint" and number is not int:
        raise SearchSpaceError(f"{where}: randint needs an integer field, {key} is a float")
    if len(values) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise SearchSpaceError(f"{where}: {kind} needs [lo, hi] numbers, got {values!r}")
    lo, hi = values
    if not lo < hi:
        raise SearchSpaceError(f"{where}: {kind} needs lo < hi, got [{lo}, {hi}]")
    if kind == "loguniform" and lo <= 0:
        raise SearchSpaceError(f"{where}: loguniform needs lo > 0, got {lo}")
    if kind == "randint" and not (float(lo).is_integer() and float(hi).is_integer()):
        raise SearchSpaceError(f"{where}: randint needs integer bounds, got {values!r}")
    edge_values = [lo, hi - 1] if kind == "randint" else [lo, hi]
    for value in edge_values:
        value = int(value) if number is int else float(value)
        _check_range(key, value, where)
        try:
            apply_params(base, {key: value})
        except ConfigError as exc:
            raise SearchSpaceError(f"{where}: bound {value!r} rejected: {exc}") from exc
    return {kind: [int(lo), int(hi)] if kind == "randint" else [float(lo), float(hi)]}


def default_job() -> Any:
    """The embedded default JobConfig (pipelines/defaults.py)."""
    from pipelines.defaults import default_job as embedded_default

    return embedded_default()


def _possible_values(space: SearchSpace, key: str) -> list[Any]:
    spec = space.search.get(key)
    if spec is None:
        return [_get_dotted(space.base, key)]
    (kind, values), = spec.items()
    return list(values) if kind in DISCRETE else []  # [] = a range: not enumerated


def _check_axes_matter(space: SearchSpace) -> None:
    """Refuse a searched key that cannot change what any trial trains."""
    if "data.bpe_merges" in space.search:
        embeddings = _possible_values(space, "model.embedding")
        if embeddings and all(e == "word" for e in embeddings):
            raise SearchSpaceError(
                f"{space.source}: data.bpe_merges is searched but model.embedding is 'word' in every "
                "trial (no subwords): every merge count would train the same model. Set "
                "model.embedding to subword or word+subword, or drop data.bpe_merges")
    if "data.gamma" in space.search:
        embeddings = _possible_values(space, "model.embedding")
        if embeddings and all(e == "subword" for e in embeddings):
            raise SearchSpaceError(
                f"{space.source}: data.gamma (the word short list) is searched but model.embedding is "
                "'subword' in every trial (no word embeddings): every gamma would train the same model")


def from_mapping(raw: Any, *, overrides: list[str] | None = None, source: str = "<dict>",
                 base_job: Any = None) -> SearchSpace:
    """Validate a parsed space file.

    Args:
        raw: the YAML mapping (``base``, ``search``, ``tune``).
        overrides: ``key=value`` strings; ``tune.*`` keys set TuneSettings, others the base JobConfig.
        source: the file name used in error messages.
        base_job: the JobConfig that ``base:`` overrides (default: the embedded default).
    Returns:
        a :class:`SearchSpace`.
    Raises:
        SearchSpaceError naming the file and the key.
    """
    if not isinstance(raw, dict):
        raise SearchSpaceError(f"{source}: top level must be a mapping with base/search/tune")
    unknown = sorted(set(raw) - {"base", "search", "tune"})
    if unknown:
        raise SearchSpaceError(f"{source}: unknown section {unknown[0]!r}; expected base, search, tune")
    base_raw = raw.get("base") or {}
    search_raw = raw.get("search") or {}
    tune_raw = dict(raw.get("tune") or {})
    for name, section in (("base", base_raw), ("search", search_raw), ("tune", tune_raw)):
        if not isinstance(section, dict):
            raise SearchSpaceError(f"{source}: {name} must be a mapping, got {type(section).__name__}")
    if not search_raw:
        raise SearchSpaceError(f"{source}: search is empty; nothing to tune")

    job = base_job if base_job is not None else default_job()
    paths = field_paths(job)
    data = job.to_dict()
    base_overrides = dict(base_raw)
    for item in overrides or []:
        if "=" not in item:
            raise SearchSpaceError(f"--set {item!r} is not of the form key=value")
        key, text = item.split("=", 1)
        key = key.strip()
        if key.startswith("tune."):
            tune_raw[key[len("tune."):]] = _parse_scalar(text)
        else:
            base_overrides[key] = _parse_scalar(text)
    for key, value in base_overrides.items():
        if key not in paths:
            raise SearchSpaceError(f"{source}: base: unknown key {key!r}")
        if isinstance(value, (int, float)):  # strings like "1e-3" are coerced by from_dict first
            _check_range(key, value, f"{source}: base")
        set_dotted(data, key, value)
    try:
        base = type(job).from_dict(data)
        tune_settings = TuneSettings.from_dict(tune_raw, _prefix="tune.")
    except ConfigError as exc:
        raise SearchSpaceError(f"{source}: {exc}") from exc
    for key in {"data.gamma", "data.bpe_merges", *base_overrides}:
        _check_range(key, _get_dotted(base, key), f"{source}: base")

    search = {key: _validate_entry(str(key), spec, base, paths, tune_settings.searcher, source)
              for key, spec in search_raw.items()}
    space = SearchSpace(base=base, search=search, tune=tune_settings, source=source)
    _check_axes_matter(space)
    if tune_settings.scheduler == "asha" and tune_settings.grace_period > space.max_epochs:
        raise SearchSpaceError(
            f"{source}: tune.grace_period ({tune_settings.grace_period}) exceeds the epochs ({space.max_epochs})")
    return space


def from_resolved(data: dict) -> SearchSpace:
    """Rebuild a space from :meth:`SearchSpace.to_dict` (used by ``dynlm tune --resume``)."""
    job = default_job()
    base = type(job).from_dict(data["base"])
    raw = {"search": data["search"], "tune": data["tune"]}
    return from_mapping(raw, source=data.get("source", "<resumed>"), base_job=base)


def load_search_space(path: str | Path, overrides: list[str] | None = None) -> SearchSpace:
    """Read and validate a space file (see the module docstring for the format)."""
    path = Path(path)
    if not path.is_file():
        raise SearchSpaceError(f"search space file {str(path)!r} does not exist")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SearchSpaceError(f"{path}: not valid YAML: {exc}") from exc
    return from_mapping(raw, overrides=overrides, source=str(path))


def _get_dotted(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


def to_param_space(space: SearchSpace) -> dict[str, Any]:
    """The Ray Tune ``param_space``: flat dotted keys -> ``ray.tune`` domains.

    With ``searcher: grid`` every ``choice`` becomes ``tune.grid_search``.
    """
    from ray import tune

    params: dict[str, Any] = {}
    for key, spec in space.search.items():
        (kind, values), = spec.items()
        if kind == "grid" or (kind == "choice" and space.tune.searcher == "grid"):
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


__all__ = [
    "SearchSpace", "SearchSpaceError", "TuneSettings", "apply_params", "data_configs", "describe",
    "field_paths", "from_mapping", "from_resolved", "load_search_space", "set_dotted", "to_param_space",
]
