"""Read and validate a ``tune_spaces/*.yaml`` file into a :class:`dynlm.search.space.SearchSpace`.

A space file is a YAML mapping with three sections::

    base:                      # dotted-key overrides of the base JobConfig (the embedded default)
      data.inputs: [runs/synth]
      train.epochs: 2
    search:                    # dotted key -> one distribution
      model.dntm.merge_fn: {choice: [max, gru]}
      data.bpe_merges: {grid: [0, 1000]}
      data.gamma: {choice: [0.5, 0.9]}
      train.lr: {loguniform: [1.0e-4, 1.0e-2]}
      model.hidden_dim: {randint: [64, 257]}     # hi is exclusive (Ray Tune's randint)
    tune:                      # dynlm.search.space.TuneSettings
      num_samples: 4
      searcher: random         # random | grid | optuna
      scheduler: asha          # asha | fifo
      max_concurrent_trials: 2
      grace_period: 1
      metric: valid_objective
      mode: min

Every error is raised here, before Ray starts: unknown keys (checked against JobConfig's dotted
field paths), empty choices, values the field's type rejects, ``data.gamma`` outside (0, 1],
negative ``data.bpe_merges``, continuous distributions over ``data.*`` keys other than
``data.gamma`` (each distinct encoding setting is one preprocessing run, so those must be
``choice`` or ``grid``; gamma only changes the short list, and a trial derives its folder from
the prepared one in well under a second), and ``grid`` with the Optuna searcher.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import yaml

from dynlm.config import ConfigError, _parse_scalar, field_paths
from dynlm.job import JobConfig
from dynlm.search.space import (
    CONTINUOUS_DATA_KEY,
    DISCRETE,
    DISTRIBUTIONS,
    SearchSpace,
    SearchSpaceError,
    TuneSettings,
    apply_params,
    get_dotted,
    set_dotted,
)


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
    """One ``search:`` entry, checked and with its values coerced to the field's type."""
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
        return {kind: _validate_values(key, kind, values, base, searcher, where)}
    return {kind: _validate_range(key, kind, values, base, paths, searcher, where)}


def _validate_values(key: str, kind: str, values: list, base: Any, searcher: str, where: str) -> list:
    """The values of a ``choice`` / ``grid`` entry, each accepted by the field's own checks."""
    if not values:
        raise SearchSpaceError(f"{where}: {kind} has no values")
    if kind == "grid" and searcher == "optuna":
        raise SearchSpaceError(f"{where}: grid is not supported by the optuna searcher; use choice")
    coerced = []
    for value in values:
        if isinstance(value, (int, float)):
            _check_range(key, value, where)
        try:  # the field's own type and range checks
            value = get_dotted(apply_params(base, {key: value}), key)
        except ConfigError as exc:
            raise SearchSpaceError(f"{where}: value {value!r} rejected: {exc}") from exc
        _check_range(key, value, where)
        coerced.append(value)
    return coerced


def _validate_range(key: str, kind: str, values: list, base: Any, paths: dict, searcher: str,
                    where: str) -> list:
    """The ``[lo, hi]`` of a ``uniform`` / ``loguniform`` / ``randint`` entry."""
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
    return [int(lo), int(hi)] if kind == "randint" else [float(lo), float(hi)]


def _possible_values(space: SearchSpace, key: str) -> list[Any]:
    spec = space.search.get(key)
    if spec is None:
        return [get_dotted(space.base, key)]
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


def _sections(raw: Any, source: str) -> tuple[dict, dict, dict]:
    """The ``base``, ``search`` and ``tune`` mappings of a parsed space file."""
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
    return base_raw, search_raw, tune_raw


def job_for_task(job: Any, task: Any, inputs: Any = None) -> Any:
    """``job`` for another task: that task's default ``data:`` (with ``inputs`` when given) and
    ``model:`` sections, ``job``'s ``train:`` and ``run:`` (``base: {task: naming}`` searches the
    naming task from the embedded default job's run settings; the LM's data and model keys mean
    nothing there)."""
    if task == job.task:
        return job
    data = {} if inputs is None else {"inputs": inputs}
    try:
        return type(job).from_dict({"task": task, "data": data, "train": job.train.to_dict(), "run": job.run.to_dict()})
    except ConfigError as exc:
        raise SearchSpaceError(f"base: task {task!r}: {exc}") from exc


def _base_and_tune(job: Any, base_raw: dict, tune_raw: dict, overrides: list[str], source: str):
    """The base JobConfig (``job`` + ``base:`` + ``--set``; a ``task`` key first switches to that
    task's default sections, :func:`job_for_task`) and the TuneSettings (``tune:`` + ``--set tune.*``)."""
    base_overrides = dict(base_raw)
    for item in overrides:
        if "=" not in item:
            raise SearchSpaceError(f"--set {item!r} is not of the form key=value")
        key, text = item.split("=", 1)
        key = key.strip()
        if key.startswith("tune."):
            tune_raw[key[len("tune."):]] = _parse_scalar(text)
        else:
            base_overrides[key] = _parse_scalar(text)
    if "task" in base_overrides:
        job = job_for_task(job, base_overrides.pop("task"), base_overrides.get("data.inputs"))
    paths = field_paths(job)
    data = job.to_dict()
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
    known = field_paths(base)  # gamma / bpe_merges: the LM task's keys
    for key in sorted({"data.gamma", "data.bpe_merges", *base_overrides} & set(known)):
        _check_range(key, get_dotted(base, key), f"{source}: base")
    return base, tune_settings


def from_mapping(raw: Any, *, base_job: Any, overrides: list[str] | None = None,
                 source: str = "<dict>") -> SearchSpace:
    """Validate a parsed space file.

    Args:
        raw: the YAML mapping (``base``, ``search``, ``tune``).
        base_job: the JobConfig that ``base:`` overrides (the pipelines pass the embedded default,
            ``pipelines.defaults.default_job()``).
        overrides: ``key=value`` strings; ``tune.*`` keys set TuneSettings, others the base JobConfig.
        source: the file name used in error messages.
    Returns:
        a :class:`SearchSpace`.
    Raises:
        SearchSpaceError naming the file and the key.
    """
    base_raw, search_raw, tune_raw = _sections(raw, source)
    base, tune_settings = _base_and_tune(base_job, base_raw, tune_raw, overrides or [], source)
    paths = field_paths(base)
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
    base = JobConfig.from_dict(data["base"])
    raw = {"search": data["search"], "tune": data["tune"]}
    return from_mapping(raw, base_job=base, source=data.get("source", "<resumed>"))


def load_search_space(path: str | Path, overrides: list[str] | None = None, *, base_job: Any) -> SearchSpace:
    """Read and validate a space file (see the module docstring for the format).

    Args:
        path: the YAML file.
        overrides: ``--set key=value`` strings (see :func:`from_mapping`).
        base_job: the JobConfig that the file's ``base:`` overrides.
    """
    path = Path(path)
    if not path.is_file():
        raise SearchSpaceError(f"search space file {str(path)!r} does not exist")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SearchSpaceError(f"{path}: not valid YAML: {exc}") from exc
    return from_mapping(raw, base_job=base_job, overrides=overrides, source=str(path))
