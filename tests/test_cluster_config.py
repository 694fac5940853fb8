"""cluster.yaml passes Ray's own cluster-config validation offline (no cloud call); typos fail it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
GPU_IMAGE = "rayproject/ray:2.60.0-py311-gpu"


def _validate(config: dict) -> dict:
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))  # merges the provider's defaults.yaml, no API call
    validate_config(prepared)  # Ray's JSON schema: unknown keys are errors
    return prepared


@pytest.fixture(scope="module")
def cluster() -> dict:
    return yaml.safe_load((REPO / "cluster.yaml").read_text(encoding="utf-8"))


def test_cluster_yaml_validates(cluster):
    prepared = _validate(cluster)
    nodes = prepared["available_node_types"]
    head = nodes[prepared["head_node_type"]]
    assert head["resources"] == {"CPU": 0}  # the head runs no training
    gpu_counts = sorted(node["resources"].get("GPU", 0) for name, node in nodes.items()
                        if name != prepared["head_node_type"])
    assert gpu_counts == [4, 8]
    for name, node in nodes.items():
        if name != prepared["head_node_type"]:
            assert 0 <= node["min_workers"] < node["max_workers"] <= prepared["max_workers"]
    assert prepared["docker"]["image"] == GPU_IMAGE
    assert "ray-ml" not in yaml.safe_dump(cluster)
    assert any("pip install" in cmd and "/home/ray/dynlm" in cmd for cmd in prepared["setup_commands"])
    assert prepared["file_mounts"]["/home/ray/dynlm"] == "."


@pytest.mark.parametrize("mutate, bad_key", [
    (lambda c: c.update(idle_timout_minutes=5), "idle_timout_minutes"),
    (lambda c: c["available_node_types"]["gpu4"].update(min_worker=1), "min_worker"),
    (lambda c: c["docker"].update(imag="x"), "imag"),
    (lambda c: c["available_node_types"]["head"].update(resorces={"CPU": 0}), "resorces"),
    (lambda c: c.update(setup_comands=["true"]), "setup_comands"),
])
def test_typo_in_cluster_yaml_fails(cluster, mutate, bad_key):
    import jsonschema

    broken = copy.deepcopy(cluster)
    mutate(broken)
    with pytest.raises((jsonschema.ValidationError, ValueError, KeyError)) as info:
        _validate(broken)
    assert bad_key in str(info.value)
