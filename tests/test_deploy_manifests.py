"""deploy/ manifests parse, and they, the Dockerfile, cluster.yaml and the docs agree on image and entrypoint."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
BASE_IMAGE = "rayproject/ray:2.60.0-py311-gpu"


def _load(name: str) -> dict:
    docs = list(yaml.safe_load_all((DEPLOY / name).read_text(encoding="utf-8")))
    assert len(docs) == 1 and isinstance(docs[0], dict)
    return docs[0]


def _containers(pod_template: dict) -> list[dict]:
    return pod_template["spec"]["containers"]


def _rayjob_images(job: dict) -> set[str]:
    spec = job["spec"]["rayClusterSpec"]
    templates = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
    return {c["image"] for t in templates for c in _containers(t)}


def _cron_container(cron: dict) -> dict:
    (container,) = _containers(cron["spec"]["jobTemplate"]["spec"]["template"])
    return container


def _dynlm_command(text: str) -> list[str]:
    """The ``dynlm ...`` part of a command line (after ``ray job submit ... --``)."""
    words = shlex.split(" ".join(text.split()))
    if "--" in words:
        words = words[words.index("--") + 1:]
    return words


def test_rayjob_is_a_kuberay_v1_rayjob():
    job = _load("rayjob-tune.yaml")
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    assert spec["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    gpus = sorted(int(g["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
                  for g in spec["rayClusterSpec"]["workerGroupSpecs"])
    assert gpus == [4, 8]
    command = _dynlm_command(spec["entrypoint"])
    assert command[:2] == ["dynlm", "tune"] and "--space" in command
    space = command[command.index("--space") + 1]
    assert (REPO / Path(space).relative_to("/home/ray/dynlm")).is_file()


def test_cronjob_submits_dynlm_retrain():
    cron = _load("cronjob-retrain.yaml")
    assert cron["apiVersion"] == "batch/v1" and cron["kind"] == "CronJob"
    assert len(cron["spec"]["schedule"].split()) == 5
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    container = _cron_container(cron)
    script = " ".join(container["args"])
    assert script.split()[:3] == ["ray", "job", "submit"]
    command = _dynlm_command(script)
    assert command[:2] == ["dynlm", "retrain"] and "--config" in command
    config = command[command.index("--config") + 1]
    assert (REPO / Path(config).relative_to("/home/ray/dynlm")).is_file()


def test_same_image_and_entrypoint_everywhere():
    job, cron = _load("rayjob-tune.yaml"), _load("cronjob-retrain.yaml")
    images = _rayjob_images(job) | {_cron_container(cron)["image"]}
    assert len(images) == 1, images
    (image,) = images
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert f"FROM {BASE_IMAGE}" in dockerfile and "pip install" in dockerfile
    assert f"-t {image}" in dockerfile
    cluster = yaml.safe_load((REPO / "cluster.yaml").read_text(encoding="utf-8"))
    assert cluster["docker"]["image"] == BASE_IMAGE
    # the console script both manifests run is the project's entrypoint
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert 'dynlm = "pipelines.cli:main"' in pyproject
    docs = (REPO / "docs" / "cluster.md").read_text(encoding="utf-8")
    assert image in docs and BASE_IMAGE in docs
    assert " ".join(_dynlm_command(job["spec"]["entrypoint"])) in " ".join(docs.split())
    assert "dynlm retrain --config /home/ray/dynlm/deploy/retrain.yaml" in docs


def test_retrain_config_is_a_valid_retrain_of_an_lm_champion():
    """deploy/retrain.yaml (what the CronJob runs) parses, names its registered model, and its
    ``data`` fits the LM task's data config (a DNTM champion trained by the embedded default job)."""
    from pipelines.defaults import default_job
    from pipelines.retrain import RetrainConfig, challenger_data_config

    cfg = RetrainConfig.from_yaml(DEPLOY / "retrain.yaml")
    champion = default_job()
    assert cfg.model_type == champion.model_type == "dntm"
    data = challenger_data_config(cfg.data, champion)
    assert (data.inputs, data.format, data.splits) == (["/mnt/shared/incoming"], "auto", {})
    assert data.vocab_size == champion.data.vocab_size  # the champion's other data settings
