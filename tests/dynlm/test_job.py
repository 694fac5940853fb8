"""JobConfig / RunSettings: strict keys, overrides, the embedded default job, run naming."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dynlm.config import ConfigError
from dynlm.data.batching import per_worker_batch_size
from dynlm.job import JobConfig, RunSettings
from pipelines.cli import build_parser
from pipelines.commands.train import job_from_args
from pipelines.defaults import DEFAULT_JOB_YAML, default_job, default_job_dict, load_job
from pipelines.train import RUN_INFO_FILE, resolve_run

REPO = Path(__file__).resolve().parents[2]


def test_default_job_is_small_and_round_trips():
    job = default_job()
    assert job.model.type == "dntm" and job.run.num_workers == 2 and job.train.epochs == 4
    assert job.run.cpus_per_worker == "auto"  # a share of the cluster's CPUs, 1 left to the ingest
    assert JobConfig.from_dict(job.to_dict()) == job
    assert JobConfig.from_dict(json.loads(json.dumps(job.to_dict()))).hash() == job.hash()


def test_a_minimal_job_file_gets_the_best_known_settings(tmp_path):
    """A user's job with only data: and model: trains as configs/ does: the dataclass defaults are
    the best-known settings (configs/lm_dntm.yaml), and a task's own training defaults come under
    the job's train: section, key by key."""
    import yaml

    known = yaml.safe_load((REPO / "configs" / "lm_dntm.yaml").read_text(encoding="utf-8"))
    (tmp_path / "job.yaml").write_text("data:\n  inputs: [corpus]\nmodel:\n  type: dntm\n", encoding="utf-8")
    job = load_job(tmp_path / "job.yaml")
    for key in ("new_entity_score", "new_entity_replaces_static", "adapt_entity_rows", "entity_row_step",
                "merge_fn", "dynamic"):
        assert getattr(job.model.dntm, key) == known["model"]["dntm"][key], key
    for key in ("lr", "bptt_tokens", "lr_schedule", "grad_clip"):
        assert getattr(job.train, key) == known["train"][key], key

    cloze = JobConfig.from_dict({"task": "cloze", "data": {"inputs": ["q"]}, "train": {"batch_size": 8}})
    assert (cloze.train.grad_clip, cloze.train.batch_size, cloze.train.lr) == (5.0, 8, 0.003)
    naming = JobConfig.from_dict({"task": "naming", "data": {"inputs": ["src"]}})
    assert (naming.train.grad_clip, naming.train.batch_size, naming.train.lr) == (5.0, 64, 0.005)
    assert JobConfig.from_dict(naming.to_dict()) == naming  # saved jobs keep every value they had


def test_unknown_top_level_key_is_named():
    data = default_job_dict()
    data["modle"] = {}
    with pytest.raises(ConfigError, match="'modle'"):
        JobConfig.from_dict(data)


@pytest.mark.parametrize("section,key", [("run", "num_worker"), ("train", "learning_rate"), ("model", "hiden_dim")])
def test_unknown_nested_key_is_named_with_its_section(section, key):
    data = default_job_dict()
    data[section][key] = 1
    with pytest.raises(ConfigError, match=f"'{section}.{key}'"):
        JobConfig.from_dict(data)


def test_missing_data_section_raises():
    with pytest.raises(ConfigError, match="data"):
        JobConfig.from_dict({"model": {}})


def test_overrides_apply_and_coerce():
    job = default_job(["model.dntm.merge_fn=max", "run.num_workers=1", "train.lr=1e-3", "run.use_gpu=true"])
    assert job.model.dntm.merge_fn == "max"
    assert job.run.num_workers == 1
    assert job.train.lr == pytest.approx(1e-3) and isinstance(job.train.lr, float)
    assert job.run.use_gpu is True
    assert default_job().model.dntm.merge_fn == "gru"  # the embedded default is not mutated


def test_unknown_override_key_is_named():
    with pytest.raises(ConfigError, match="run.num_worker"):
        default_job(["run.num_worker=3"])
    with pytest.raises(ConfigError, match="merge_fn"):
        default_job(["model.dntm.merge_fn=mean"])  # not one of the Literal choices


def test_run_settings_validation():
    with pytest.raises(ConfigError, match="run.num_workers"):
        RunSettings.from_dict({"num_workers": 0})
    with pytest.raises(ConfigError, match="fail_rank"):
        RunSettings.from_dict({"num_workers": 2, "fail_at_epoch": 1, "fail_rank": 2})
    with pytest.raises(ConfigError, match="run.name"):
        RunSettings.from_dict({"name": "a/b"})
    with pytest.raises(ConfigError, match="integer"):
        RunSettings.from_dict({"num_workers": "two"})
    with pytest.raises(ConfigError, match="run.cache_train_split must be one of auto, always, never, got 'yes'"):
        RunSettings.from_dict({"cache_train_split": "yes"})


def test_yaml_file_and_cli_flags(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(DEFAULT_JOB_YAML.replace("epochs: 4", "epochs: 7"))
    assert load_job(path).train.epochs == 7
    args = build_parser().parse_args(
        ["train", "--config", str(path), "--set", "train.lr=0.01", "--num-workers", "3", "--use-gpu",
         "--resume", "--tracking-uri", "sqlite:///x.db"])
    job = job_from_args(args)
    assert (job.train.epochs, job.train.lr, job.run.num_workers) == (7, 0.01, 3)
    assert job.run.use_gpu and job.run.resume and job.run.tracking_uri == "sqlite:///x.db"
    bad = build_parser().parse_args(["train", "--set", "train.lrr=0.01"])
    with pytest.raises(ConfigError, match="train.lrr"):
        job_from_args(bad)


def test_global_batch_is_split_over_workers():
    assert per_worker_batch_size(16, 2) == 8
    assert per_worker_batch_size(5, 2) == 2
    with pytest.raises(ValueError, match="batch_size=1"):
        per_worker_batch_size(1, 2)


def _fake_run(storage, name, mtime):
    folder = storage / name
    folder.mkdir(parents=True)
    (folder / RUN_INFO_FILE).write_text("{}")
    os.utime(folder / RUN_INFO_FILE, (mtime, mtime))


def test_resolve_run_names_new_runs_and_finds_the_latest_to_resume(tmp_path):
    storage = tmp_path / "ray"
    run = RunSettings(storage_path=str(storage), name="exp")
    assert resolve_run(run, "dntm") == ("exp", False)
    fresh, resuming = resolve_run(RunSettings(storage_path=str(storage)), "dntm")
    assert fresh.startswith("dntm-") and not resuming
    with pytest.raises(FileNotFoundError, match="no dynlm run"):
        resolve_run(RunSettings(storage_path=str(storage), resume=True), "dntm")
    _fake_run(storage, "exp", 1000)
    _fake_run(storage, "newer", 2000)
    with pytest.raises(FileExistsError, match="--resume"):
        resolve_run(run, "dntm")  # Ray would silently continue it
    assert resolve_run(RunSettings(storage_path=str(storage), name="exp", resume=True), "dntm") == ("exp", True)
    assert resolve_run(RunSettings(storage_path=str(storage), resume=True), "dntm") == ("newer", True)
    with pytest.raises(FileNotFoundError, match="'nope'"):
        resolve_run(RunSettings(storage_path=str(storage), name="nope", resume=True), "dntm")


def test_storage_env_sets_run_storage_path_of_every_verb(tmp_path, monkeypatch):
    from dynlm.job import STORAGE_ENV, with_storage_env
    from dynlm.search.space_file import load_search_space
    from pipelines.retrain import RetrainConfig, challenger_job
    from pipelines.tune import _default_storage_uri

    monkeypatch.delenv(STORAGE_ENV, raising=False)
    assert load_job(None).run.storage_path == "runs/ray" and with_storage_env(None) == []
    monkeypatch.setenv(STORAGE_ENV, "s3://bucket/dynlm")
    assert with_storage_env(["train.lr=0.1"]) == ["run.storage_path=s3://bucket/dynlm", "train.lr=0.1"]
    # train and run (load_job), the job file included: the environment beats the file ...
    path = tmp_path / "job.yaml"
    path.write_text(DEFAULT_JOB_YAML.replace("storage_path: runs/ray", "storage_path: runs/other"))
    assert load_job(path).run.storage_path == "s3://bucket/dynlm"
    assert job_from_args(build_parser().parse_args(["train"])).run.storage_uri() == "s3://bucket/dynlm"
    # ... and a --set beats the environment
    args = build_parser().parse_args(["run", "--set", f"run.storage_path={tmp_path}"])
    assert load_job(args.config, args.overrides).run.storage_path == str(tmp_path)
    # tune: the space's base job, and where --resume looks for an experiment by name
    space = load_search_space(REPO / "tune_spaces" / "quickstart.yaml", with_storage_env([]), base_job=default_job())
    assert space.base.run.storage_path == "s3://bucket/dynlm"
    assert _default_storage_uri() == "s3://bucket/dynlm"
    # retrain: the challenger's job (the champion's job had its own storage path)
    cfg = RetrainConfig.from_dict({"data": {"inputs": ["new"]}, "validation": "valid", "model_type": "dntm"})
    champion = default_job([f"run.storage_path={tmp_path / 'old'}"])
    assert challenger_job(cfg, champion, "r1", "sqlite:///x.db").run.storage_path == "s3://bucket/dynlm"
    cfg = cfg.replace(job_overrides=["run.storage_path=gs://other/x"])
    assert challenger_job(cfg, champion, "r1", "sqlite:///x.db").run.storage_path == "gs://other/x"


def test_missing_resources_names_the_settings():
    from dynlm.job import missing_resources

    assert missing_resources(RunSettings(num_workers=2, cpus_per_worker=0.5), 2.0, 0.0) is None
    assert missing_resources(RunSettings(num_workers=2, use_gpu=True), 16.0, 2.0) is None
    assert missing_resources(RunSettings(num_workers=2, use_gpu=True), 16.0, 0.0) == (
        "run.use_gpu asks for 2 GPU(s) (one per worker, run.num_workers=2) and this Ray has 0: "
        "drop --use-gpu (run.use_gpu=false) or run where the GPUs are")
    assert missing_resources(RunSettings(num_workers=3, cpus_per_worker=0.5), 2.0, 0.0) == (
        "run.num_workers=3 x run.cpus_per_worker=0.5 = 1.5 CPUs leave 0.50 of this Ray's 2 CPUs free; "
        "Ray Data's ingest needs 1, so the workers would wait forever: lower run.num_workers or "
        "run.cpus_per_worker")


def test_auto_cpus_per_worker_shares_what_the_ingest_leaves():
    from dynlm.job import auto_cpus_per_worker, missing_resources, with_worker_cpus

    assert auto_cpus_per_worker(2, 2.0) == 0.5  # a laptop: as before, half a CPU each
    assert auto_cpus_per_worker(1, 2.0) == 1.0
    assert auto_cpus_per_worker(2, 16.0) == 7.0  # whole CPUs: the worker's torch threads
    assert auto_cpus_per_worker(4, 2.0) == 0.25
    assert auto_cpus_per_worker(2, 16.0, concurrent_runs=2) == 3.0  # two trials at once
    assert auto_cpus_per_worker(1, 64.0, node_cpus=8.0) == 8.0  # a worker runs on one node
    assert auto_cpus_per_worker(2, 1.0) == 0.1  # nothing left: the least, then refused below
    assert missing_resources(RunSettings(num_workers=2), 1.0, 0.0).startswith(
        "run.num_workers=2 x run.cpus_per_worker=0.1 (auto) = 0.2 CPUs leave 0.80 of this Ray's 1 CPUs free")
    assert missing_resources(RunSettings(num_workers=2), 2.0, 0.0) is None
    run = RunSettings(num_workers=2)
    assert with_worker_cpus(run, 16.0).cpus_per_worker == 7.0 and run.cpus_per_worker == "auto"
    assert with_worker_cpus(RunSettings(cpus_per_worker=0.4), 16.0).cpus_per_worker == 0.4
    # a joined cluster whose autoscaler has not added its nodes yet: whole workers are requested
    assert with_worker_cpus(run, 0.0, may_grow=True).cpus_per_worker == 1.0
    assert with_worker_cpus(run, 16.0, may_grow=True).cpus_per_worker == 7.0
    assert RunSettings.from_dict({"cpus_per_worker": 2}).cpus_per_worker == 2.0
    with pytest.raises(ConfigError, match="cpus_per_worker"):
        RunSettings.from_dict({"cpus_per_worker": "many"})


def test_seconds_from_env(monkeypatch):
    from dynlm.config import seconds_from_env

    monkeypatch.delenv("DYNLM_TEST_WAIT_S", raising=False)
    assert seconds_from_env("DYNLM_TEST_WAIT_S", 7.0) == 7.0
    monkeypatch.setenv("DYNLM_TEST_WAIT_S", "0.25")
    assert seconds_from_env("DYNLM_TEST_WAIT_S", 7.0) == 0.25
    for bad in ("0", "-1", "soon", "nan"):
        monkeypatch.setenv("DYNLM_TEST_WAIT_S", bad)
        with pytest.raises(ConfigError, match=rf"^\$DYNLM_TEST_WAIT_S='{bad}': give a number of seconds above 0$"):
            seconds_from_env("DYNLM_TEST_WAIT_S", 7.0)
