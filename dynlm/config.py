"""Strict dataclass configs: ``from_dict`` rejects unknown keys, YAML in, ``key=value`` overrides.

Every config in dynlm is a dataclass that inherits :class:`Config`::

    @dataclass
    class DataConfig(Config):
        vocab_size: int = 10_000
        gamma: float = 0.9

    cfg = DataConfig.from_dict({"vocab_size": 5000})        # ok
    DataConfig.from_dict({"vocab_sise": 5000})              # ConfigError: unknown key 'vocab_sise'
    cfg = DataConfig.from_yaml("data.yaml", overrides=["gamma=0.5"])

Nested dataclasses, ``Optional``, ``list``, ``dict`` and ``Literal`` fields are checked and
coerced (an int is accepted for a float, never the reverse). ``to_dict`` gives plain JSON-able
values, and :func:`config_hash` hashes that canonically (used to key prepared data folders).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

C = TypeVar("C", bound="Config")
PARAM_VALUE_MAX = 6000  # characters of an MLflow param value (flatten_config)


class ConfigError(ValueError):
    """A config value or key is wrong; the message names the dotted key."""


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    origin = get_origin(annotation)
    if annotation is Any:
        return value
    if origin is Literal:
        choices = get_args(annotation)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {list(choices)}")
        return value
    if origin in (Union, types.UnionType):
        args = get_args(annotation)
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"{key}: None is not allowed")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError("; ".join(errors))
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        (item_type,) = get_args(annotation)[:1] or (Any,)
        items = [_coerce(v, item_type, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        _, value_type = get_args(annotation) or (Any, Any)
        return {str(k): _coerce(v, value_type, f"{key}.{k}") for k, v in value.items()}
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        if isinstance(value, annotation):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping for {annotation.__name__}")
        return annotation.from_dict(value, _prefix=f"{key}.")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def _parse_scalar(text: str) -> Any:
    """Parse a command-line override value with YAML rules (``1e-3``, ``true``, ``[a, b]``)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _fix_yaml_floats(value: Any) -> Any:
    # YAML 1.1 reads "1e-3" as a string; accept it as a number where a number is wanted.
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in "eE.") and value[0] in "+-.0123456789" else value
        except ValueError:
            return value
    return value


@dataclasses.dataclass
class Config:
    """Base class for strict configs. Subclasses are plain ``@dataclass`` classes."""

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any] | None, _prefix: str = "") -> C:
        data = dict(data or {})
        hints = get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ConfigError(
                f"{cls.__name__}: unknown key {_prefix + unknown[0]!r}"
                + (f" (and {unknown[1:]})" if len(unknown) > 1 else "")
                + f"; known keys: {sorted(fields)}"
            )
        kwargs = {}
        for name, value in data.items():
            annotation = hints[name]
            if annotation in (float, typing.Optional[float]):
                value = _fix_yaml_floats(value)
            kwargs[name] = _coerce(value, annotation, f"{_prefix}{name}")
        try:
            obj = cls(**kwargs)
        except TypeError as exc:  # a required field is missing
            raise ConfigError(f"{cls.__name__}: {exc}") from exc
        obj.validate()
        return obj

    def validate(self) -> None:
        """Override to check value ranges; raise :class:`ConfigError` with the key's name."""

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def replace(self: C, **changes: Any) -> C:
        merged = self.to_dict()
        merged.update(changes)
        return type(self).from_dict(merged)

    def with_overrides(self: C, overrides: list[str] | None) -> C:
        """Apply ``a.b=value`` overrides (values parsed as YAML scalars)."""
        data = self.to_dict()
        for item in overrides or []:
            if "=" not in item:
                raise ConfigError(f"override {item!r} is not of the form key=value")
            dotted, raw = item.split("=", 1)
            set_dotted(data, dotted.strip(), _parse_scalar(raw), what="override")
        return type(self).from_dict(data)

    @classmethod
    def from_yaml(cls: type[C], path: str | Path | None, overrides: list[str] | None = None) -> C:
        data = {}
        if path is not None:
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh) or {}
            if not isinstance(data, dict):
                raise ConfigError(f"{path}: top level must be a mapping")
        return cls.from_dict(data).with_overrides(overrides)

    def hash(self, length: int = 16) -> str:
        return config_hash(self.to_dict(), length)


def set_dotted(data: dict[str, Any], dotted: str, value: Any, *, what: str = "key") -> None:
    """Set ``data["a"]["b"]["c"] = value`` for ``dotted="a.b.c"``: every section and the key
    must exist already (so a typo raises :class:`ConfigError` naming ``what`` and the key)."""
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            raise ConfigError(f"{what} {dotted!r}: {part!r} is not a section")
        node = node[part]
    if parts[-1] not in node:
        raise ConfigError(f"{what}: unknown key {dotted!r}")
    node[parts[-1]] = value


def field_paths(config: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf field of a (nested) config, by dotted path: ``{"data.gamma": float, ...}``.

    ``config`` is an instance or a class; a field typed ``Any`` whose value is a config (a
    task's ``data`` / ``model`` section of :class:`dynlm.job.JobConfig`) is walked through
    its value, so give an instance for those.
    """
    config_cls = config if isinstance(config, type) else type(config)
    hints = get_type_hints(config_cls)
    paths: dict[str, Any] = {}
    for f in dataclasses.fields(config_cls):
        annotation = hints[f.name]
        value = None if isinstance(config, type) else getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            paths.update(field_paths(value, f"{prefix}{f.name}."))
        elif isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            paths.update(field_paths(annotation, f"{prefix}{f.name}."))
        else:
            paths[f"{prefix}{f.name}"] = annotation
    return paths


def flatten_config(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"model": {"dntm": {"merge_fn": "gru"}}}`` -> ``{"model.dntm.merge_fn": "gru"}``.

    Lists and None become JSON text so every value is a string MLflow accepts as a param (at
    most ``PARAM_VALUE_MAX`` characters: a longer one is a ValueError naming the key).
    """
    flat: dict[str, str] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_config(value, prefix=f"{dotted}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            if len(text) > PARAM_VALUE_MAX:
                raise ValueError(f"config value {dotted} is {len(text)} characters; MLflow "
                                 f"params hold at most {PARAM_VALUE_MAX}")
            flat[dotted] = text
    return flat


def config_hash(data: dict[str, Any], length: int = 16) -> str:
    """A stable hash of a JSON-able mapping (sorted keys, no whitespace)."""
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:length]


def seconds_from_env(name: str, default: float) -> float:
    """A number of seconds above 0 from the environment variable ``name``; ``default`` when it
    is unset or empty.

    Raises:
        ConfigError: the value is not a number above 0 (the message names the variable).
    """
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:
        raise ConfigError(f"${name}={text!r}: give a number of seconds above 0")
    return seconds
