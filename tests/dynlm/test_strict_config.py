from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from dynlm.config import (
    PARAM_VALUE_MAX,
    Config,
    ConfigError,
    config_hash,
    flatten_config,
)
from dynlm.models.config import ModelConfig


@dataclass
class Inner(Config):
    rate: float = 0.5
    names: list[str] = field(default_factory=lambda: ["a"])


@dataclass
class Outer(Config):
    size: int = 3
    mode: Literal["x", "y"] = "x"
    inner: Inner = field(default_factory=Inner)
    path: str | None = None


def test_unknown_key_names_the_dotted_key():
    with pytest.raises(ConfigError, match=r"'inner\.rte'"):
        Outer.from_dict({"inner": {"rte": 1.0}})
    with pytest.raises(ConfigError, match=r"'sise'"):
        Outer.from_dict({"sise": 1})


def test_types_are_checked_and_ints_widen_to_floats():
    cfg = Outer.from_dict({"size": 4, "inner": {"rate": 1}})
    assert cfg.inner.rate == 1.0 and isinstance(cfg.inner.rate, float)
    with pytest.raises(ConfigError, match="size: expected an integer"):
        Outer.from_dict({"size": 2.5})
    with pytest.raises(ConfigError, match="mode"):
        Outer.from_dict({"mode": "z"})
    with pytest.raises(ConfigError, match="expected true/false"):
        ModelConfig.from_dict({"tie_weights": "yes"})


def test_overrides_parse_yaml_scalars(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("size: 5\ninner:\n  rate: 1e-3\n")
    cfg = Outer.from_yaml(path, overrides=["inner.names=[p, q]", "path=/tmp/x", "mode=y"])
    assert cfg.size == 5 and cfg.inner.rate == 1e-3
    assert cfg.inner.names == ["p", "q"] and cfg.path == "/tmp/x" and cfg.mode == "y"
    with pytest.raises(ConfigError, match="unknown key 'inner.nope'"):
        cfg.with_overrides(["inner.nope=1"])


def test_round_trip_and_hash_are_stable():
    cfg = Outer.from_dict({"size": 7, "inner": {"names": ["b", "c"]}})
    assert Outer.from_dict(cfg.to_dict()) == cfg
    assert cfg.hash() == Outer.from_dict(cfg.to_dict()).hash()
    assert cfg.hash() != cfg.replace(size=8).hash()
    assert config_hash({"b": 1, "a": 2}) == config_hash({"a": 2, "b": 1})


def test_model_config_validation():
    with pytest.raises(ConfigError, match="tie_weights"):
        ModelConfig.from_dict({"tie_weights": True, "embed_dim": 64, "hidden_dim": 128})
    with pytest.raises(ConfigError, match="fast_params"):
        ModelConfig.from_dict({"dynamical": {"fast_params": ["everything"]}})
    cfg = ModelConfig.from_dict({"dntm": {"merge_fn": "attention", "dynamic": "input"}})
    assert cfg.dntm.merge_fn == "attention"


def test_flatten_config():
    flat = flatten_config({"model": {"dntm": {"merge_fn": "gru"}, "dim": 8},
                           "data": {"inputs": ["a", "b"], "x": None, "splits": {}}})
    assert flat == {"model.dntm.merge_fn": "gru", "model.dim": "8",
                    "data.inputs": '["a", "b"]', "data.x": "null", "data.splits": "{}"}
    with pytest.raises(ValueError, match=f"config value data.inputs is {PARAM_VALUE_MAX + 4} characters"):
        flatten_config({"data": {"inputs": ["x" * PARAM_VALUE_MAX]}})
