"""Scheduled retraining on real Ray + real MLflow: promotion, refusal, idempotency, a race
between two retrains, and a crash before promotion.

One weak LM champion (1 epoch) is trained once per module into a template SQLite store; every
LM test starts from a copy of that store, so each test sees champion v1 and nothing else. The
last two tests retrain the other tasks' champions (cloze: ``dynlm-saw``, naming:
``dynlm-naming``), each trained in its test (a tiny model, 1 epoch, ``dynlm train --local``) and
registered: the new data goes through the champion's task, the challenger trains on the
session's Ray (1 worker), both models are scored by the task's primary metric.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from dynlm.data.prepared import PreparedData
from dynlm.job import JobConfig
from pipelines.cli import main as cli_main
from pipelines.retrain import InjectedFailure, RetrainConfig, retrain

NAME = "dynlm-dntm"


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    from dynlm.data.synth import SynthConfig, write_conll

    root = tmp_path_factory.mktemp("corpora")
    out = {"prepared": root / "prepared"}  # the retrains' prepared folders, shared: content-addressed
    for name, seed, docs in (("initial", 0, 24), ("new", 1, 24), ("validation", 2, 12)):
        write_conll(SynthConfig(num_documents=docs, docs_per_file=12, seed=seed), root / name)
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def champion_store(ray_session, corpora, tmp_path_factory, empty_mlflow_db) -> Path:
    """A SQLite store holding dynlm-dntm v1 @champion, trained 1 epoch (a beatable champion)."""
    from pipelines.prepare import prepare
    from pipelines.train import run_training

    root = tmp_path_factory.mktemp("champion")
    shutil.copy(empty_mlflow_db, root / "mlflow.db")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    job = JobConfig.from_dict({
        "data": {"inputs": [str(corpora["initial"])], "format": "conll", "output_root": str(root / "prepared"),
                 "vocab_size": 300, "bpe_merges": 50, "max_chains": 20, "num_encode_actors": 1},
        "model": {"type": "dntm", "embed_dim": 16, "hidden_dim": 16, "dropout": 0.0},
        "train": {"epochs": 1, "batch_size": 4, "lr": 0.003},
        "run": {"num_workers": 1, "cpus_per_worker": 0.4, "max_failures": 0,
                "storage_path": str(root / "ray"), "tracking_uri": uri},
    })
    result = run_training(job, prepare(job.data, progress=False))
    assert result.model_version == "1"
    return root / "mlflow.db"


@pytest.fixture
def store(champion_store, mlflow_uri, tmp_path) -> str:
    shutil.copy(champion_store, tmp_path / "mlflow.db")
    assert mlflow_uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
    return mlflow_uri


def _config(tmp_path, corpora, uri, **changes) -> RetrainConfig:
    data = {
        # the tests that encode "new" with champion v1's preprocessor share that folder (prepared once)
        "data": {"inputs": [str(corpora["new"])], "output_root": str(corpora["prepared"]), "num_encode_actors": 1},
        "validation": str(corpora["validation"]),
        "model_type": "dntm",
        "margin": 0.01,
        "job_overrides": ["train.epochs=2", "train.lr=0.01", f"run.storage_path={tmp_path / 'ray'}"],
        "tracking_uri": uri,
    }
    data.update(changes)
    return RetrainConfig.from_dict(data)


def _champion(uri: str) -> str:
    return _champion_of(NAME, uri)


def _champion_of(name: str, uri: str) -> str:
    return str(MlflowClient(uri, uri).get_model_version_by_alias(name, "champion").version)


def _retrain_runs(uri: str):
    client = MlflowClient(uri, uri)
    experiment = client.get_experiment_by_name("dynlm-retrain")
    return [] if experiment is None else client.search_runs([experiment.experiment_id])


def _training_runs(uri: str):
    client = MlflowClient(uri, uri)
    return client.search_runs([client.get_experiment_by_name("dynlm").experiment_id])


def test_promotes_a_better_challenger_then_trains_nothing_again(store, corpora, tmp_path, capsys):
    cfg = _config(tmp_path, corpora, store)
    result = retrain(cfg)
    assert result.decision == "promoted", result.reason
    assert result.trained and result.champion_version_before == "1" and result.challenger_version == "2"
    assert result.challenger_ppl < result.champion_ppl * 0.99
    assert _champion(store) == "2"

    (run,) = _retrain_runs(store)
    tags = run.data.tags
    assert run.info.status == "FINISHED"
    assert tags["decision"] == "promoted" and tags["champion_version_after"] == "2"
    assert float(tags["champion_ppl"]) == pytest.approx(result.champion_ppl)
    assert float(tags["challenger_ppl"]) == pytest.approx(result.challenger_ppl)
    assert tags["inputs_hash"] == result.inputs_hash and len(tags["validation_hash"]) == 16
    child = MlflowClient(store, store).get_run(tags["challenger_run_id"])
    assert child.data.tags["mlflow.parentRunId"] == run.info.run_id
    assert len(_training_runs(store)) == 2  # the champion's and this challenger's

    # same inputs + config again, through the CLI: nothing is trained, nothing is recorded
    config_path = tmp_path / "retrain.yaml"
    config_path.write_text(yaml.safe_dump(cfg.to_dict()))
    capsys.readouterr()
    assert cli_main(["retrain", "--config", str(config_path)]) == 0
    assert "already done" in capsys.readouterr().out
    assert len(_training_runs(store)) == 2 and len(_retrain_runs(store)) == 1
    assert _champion(store) == "2"



def test_refuses_a_worse_challenger(store, corpora, tmp_path):
    # from scratch with a vanishing learning rate: random weights, far worse than the champion
    cfg = _config(tmp_path, corpora, store, init_from="scratch",
                  job_overrides=["train.epochs=1", "train.lr=1e-9", f"run.storage_path={tmp_path / 'ray'}"])
    result = retrain(cfg)
    assert result.decision == "rejected", result.reason
    assert result.challenger_ppl > result.champion_ppl
    assert _champion(store) == "1"
    client = MlflowClient(store, store)
    assert str(client.get_model_version_by_alias(NAME, "challenger").version) == "2"
    (run,) = _retrain_runs(store)
    assert run.data.tags["decision"] == "rejected" and run.data.tags["reason"].startswith("not promoted")


def test_two_concurrent_retrains_promote_once(store, corpora, tmp_path):
    cfg = _config(tmp_path, corpora, store)
    results, errors = [], []
    barrier = threading.Barrier(2)

    def worker():
        try:
            barrier.wait()
            results.append(retrain(cfg))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert sorted(r.decision for r in results) == ["conflict", "promoted"]
    winner = next(r for r in results if r.decision == "promoted")
    loser = next(r for r in results if r.decision == "conflict")
    assert loser.exit_code == 3 and winner.exit_code == 0
    assert f"champion moved from v1 to v{winner.challenger_version}" in loser.reason
    assert _champion(store) == winner.challenger_version
    assert sorted(r.data.tags["decision"] for r in _retrain_runs(store)) == ["conflict", "promoted"]


def test_crash_before_promotion_leaves_the_champion(store, champion_store, corpora, tmp_path):
    """Also: the validation set is the champion's prepared folder (its valid split), both models
    scored on it as Ray Data jobs (``validation_scoring: always``): the champion's score is its
    in-process score."""
    from pipelines.commands.evaluate import load_any_model
    from pipelines.retrain import validation_rows, validation_score

    (validation,) = [p for p in (champion_store.parent / "prepared").iterdir() if (p / "manifest.json").is_file()]
    cfg = _config(tmp_path, corpora, store, fail_before_promote=True,  # one epoch: the crash is after training
                  job_overrides=["train.epochs=1", "train.lr=0.01", f"run.storage_path={tmp_path / 'ray'}"],
                  validation=str(validation), validation_scoring="always")
    with pytest.raises(InjectedFailure):
        retrain(cfg)
    assert _champion(store) == "1"
    (run,) = _retrain_runs(store)
    assert run.info.status == "FAILED" and run.data.tags["decision"] == "failed"
    assert "InjectedFailure" in run.data.tags["reason"]
    task, model, model_cfg, spec, preprocessor = load_any_model(f"models:/{NAME}/1", store)
    here = validation_score(task, model, model_cfg, spec, validation_rows(str(validation), task, preprocessor, None), 8)
    assert float(run.data.tags["champion_ppl"]) == pytest.approx(here, rel=1e-6)
    assert run.data.tags["validation_scored_on"].startswith("Ray Data, ")  # not the in-process path


def test_config_errors_and_content_addressing(corpora, tmp_path):
    from tiny_lm import make_tiny_lm

    from dynlm.config import ConfigError
    from dynlm.data.config import DataConfig
    from dynlm.data.fingerprint import input_listing as file_listing
    from dynlm.tasks import get_task
    from pipelines.retrain import validation_hash, validation_rows

    with pytest.raises(ConfigError, match="needs init_from: scratch"):
        _config(tmp_path, corpora, "sqlite:///x.db", rebuild_vocabulary=True)
    with pytest.raises(ConfigError, match="margin"):
        _config(tmp_path, corpora, "sqlite:///x.db", margin=1.5)
    with pytest.raises(ConfigError, match="unknown key 'epochs'"):
        _config(tmp_path, corpora, "sqlite:///x.db", epochs=3)
    with pytest.raises(ConfigError, match=r"^data\.inputs: required"):
        _config(tmp_path, corpora, "sqlite:///x.db", data={"format": "conll"})
    config = _config(tmp_path, corpora, "sqlite:///x.db").to_dict()
    del config["model_type"]  # no LM default: which registered model is retrained is said
    with pytest.raises(ConfigError, match=r"^model_type: required: the registered model dynlm-<model_type>"):
        RetrainConfig.from_dict(config)
    # where the prepared folder goes is not part of the idempotency key; what the data holds is
    cfg = _config(tmp_path, corpora, "sqlite:///x.db")
    moved = cfg.replace(data={**cfg.data, "output_root": "elsewhere", "num_encode_actors": 2})
    assert moved.key_dict() == cfg.key_dict() and cfg.key_dict()["data"] == {"inputs": [str(corpora["new"])]}
    assert cfg.replace(data={**cfg.data, "format": "text"}).key_dict() != cfg.key_dict()

    folder = tmp_path / "docs"
    shutil.copytree(corpora["validation"], folder)
    data_cfg = DataConfig(inputs=["x"], max_chains=20)
    listing, fixed_hash = file_listing([str(folder)]), validation_hash(str(folder), data_cfg)
    _, _, _, preprocessor_path = make_tiny_lm(tmp_path)
    from dynlm.data.preprocessor import Preprocessor

    rows = validation_rows(str(folder), get_task("lm"), Preprocessor.load(preprocessor_path), data_cfg)
    assert len(rows) == 12 and all(row["num_tokens"] == sum(row["sentence_lengths"]) for row in rows)
    # one changed byte: other content hash, other validation hash; a copy elsewhere: same hashes
    first = sorted(folder.iterdir())[0]
    first.write_bytes(first.read_bytes().replace(b"the", b"a", 1))
    assert file_listing([str(folder)]) != listing and validation_hash(str(folder), data_cfg) != fixed_hash
    assert validation_hash(str(corpora["validation"]), data_cfg) == fixed_hash
    assert validation_hash(str(corpora["validation"]), data_cfg.replace(max_chains=5)) != fixed_hash


# ---------------------------------------------------------------------------------------------
# Every task retrains: a cloze and a naming champion, each retrained through its own task
# ---------------------------------------------------------------------------------------------

#: Per task: its registered model, its primary metric, tiny data and model settings.
TASK_CASES = {
    "cloze": {"name": "dynlm-saw", "metric": "error",
              "data": {"bpe_merges": 30, "num_encode_actors": 1},
              "model": {"embed_dim": 16, "subword_dim": 8, "hidden_size": 16, "dropout": 0.0}},
    "naming": {"name": "dynlm-naming", "metric": "f1_error",
               "data": {"num_encode_actors": 1},
               "model": {"embed_dim": 16, "noise_samples": 4}},
}


def _task_corpora(task: str, root: Path) -> dict[str, Path]:
    """The champion's (``initial``), the retrain's (``new``) and the fixed validation data of
    ``task``, each from its own seed: CBT-format question files, or folders of Python files."""
    from dynlm.data.synthetic_cloze import write_synthetic_cbt
    from dynlm.data.synthetic_code import SynthCodeConfig, write_code_corpus

    sizes = {"cloze": {"initial": 120, "new": 120, "validation": 60},  # questions
             "naming": {"initial": 12, "new": 12, "validation": 8}}[task]  # files (~17 functions each)
    out = {}
    for seed, (name, size) in enumerate(sizes.items()):
        if task == "cloze":
            write_synthetic_cbt(root / name, size, seed=seed)
        else:
            write_code_corpus(SynthCodeConfig(num_files=size, seed=seed), root / name)
        out[name] = root / name
    return out


def _register_champion(task: str, corpora: dict[str, Path], root: Path, uri: str, lr: float, capsys) -> JobConfig:
    """Train ``task``'s tiny model one epoch on ``corpora["initial"]`` with ``dynlm train --local``
    (one process: a Ray Train run costs ~15 s more, and the retrain's challenger takes that path)
    and register it through the tracking gateway the Ray Train driver uses (the run with its job
    config, its epoch metrics and pyfunc model, then ``register_and_promote``): v1, the champion."""
    from dynlm import checkpoint
    from dynlm.tasks.local import prepare_local
    from pipelines import tracking

    job = JobConfig.from_dict({
        "task": task,
        "data": {"inputs": [str(corpora["initial"])], "output_root": str(root / "prepared"),
                 **TASK_CASES[task]["data"]},
        "model": TASK_CASES[task]["model"],
        "train": {"epochs": 1, "lr": lr},
        "run": {"num_workers": 1, "cpus_per_worker": 0.4, "max_failures": 0, "name": "champion",
                "storage_path": str(root / "ray"), "tracking_uri": uri},
    })
    (root / "champion.yaml").write_text(yaml.safe_dump(job.to_dict()))
    capsys.readouterr()
    assert cli_main(["train", "--local", "--config", str(root / "champion.yaml")]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])  # `train --local`'s last line
    saved = root / "ray" / "champion" / "model.pt"
    history = checkpoint.load_checkpoint(saved).extra["history"]
    prepared = prepare_local(job.data, task=job.get_task(), log=lambda *_: None)  # the folder it trained on
    run_id = tracking.start_training_run(job, prepared)
    for record in history:
        tracking.log_epoch_metrics(run_id, record["epoch"], record)
    tracking.finish_training_run(run_id, saved, prepared, history)
    registration = tracking.register_and_promote(run_id, summary["best_valid_objective"],
                                                 metric=job.get_task().primary_metric)
    assert (registration.version, registration.decision) == ("1", "promoted")
    return job


def _task_retrain_config(task: str, corpora: dict[str, Path], root: Path, uri: str, data=None,
                         **changes) -> RetrainConfig:
    return RetrainConfig.from_dict({
        "data": data or {"inputs": [str(corpora["new"])], "output_root": str(root / "prepared")},
        "validation": str(corpora["validation"]),
        "model_type": TASK_CASES[task]["name"].removeprefix("dynlm-"),
        "tracking_uri": uri,
        **changes,
    })


def _validation_records(task: str, folder: Path) -> int:
    """How many records the validation files hold, counted without dynlm: a question is a CBT
    block's 21st line (``21 <query>\t<answer>...``), a function every ``def`` of a file."""
    import ast

    if task == "cloze":
        return sum(line.startswith("21 ") for path in folder.iterdir() for line in path.read_text().splitlines())
    return sum(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               for path in folder.rglob("*.py") for node in ast.walk(ast.parse(path.read_text())))


def _check_scores_and_tags(task: str, result, champion_job: JobConfig, cfg: RetrainConfig, uri: str) -> None:
    """The scores are the task's primary metric of v1 and v2 on every record of the validation
    files, as this process scores them; the run, the version and the reason name that metric,
    not perplexity."""
    from pipelines.commands.evaluate import load_any_model
    from pipelines.retrain import challenger_data_config, validation_rows, validation_score

    case = TASK_CASES[task]
    data_cfg = challenger_data_config(cfg.data, champion_job)
    for version, score in (("1", result.champion_ppl), ("2", result.challenger_ppl)):
        task_obj, model, model_cfg, spec, preprocessor = load_any_model(f"models:/{case['name']}/{version}", uri)
        rows = validation_rows(str(cfg.validation), task_obj, preprocessor, data_cfg)
        assert len(rows) == _validation_records(task, Path(cfg.validation))
        assert validation_score(task_obj, model, model_cfg, spec, rows, 8) == pytest.approx(score, rel=1e-6), version
        assert 0.0 <= score <= 1.0
    (run,) = _retrain_runs(uri)
    assert run.data.tags["objective_metric"] == case["metric"] == result.metric
    assert float(run.data.tags["champion_ppl"]) == pytest.approx(result.champion_ppl)
    assert float(run.data.tags["challenger_ppl"]) == pytest.approx(result.challenger_ppl)
    challenger = MlflowClient(uri, uri).get_model_version(case["name"], "2")
    assert challenger.tags["objective_metric"] == case["metric"]
    assert f"valid_{case['metric']} {result.challenger_ppl:.4f}" in result.reason
    assert f"champion {case['metric']} {result.champion_ppl:.4f}" in result.reason and "ppl" not in result.reason


def test_a_cloze_champion_retrains_on_new_questions_and_is_replaced_by_error(ray_session, mlflow_uri, tmp_path,
                                                                             capsys):
    """A barely trained SAW Reader (1 epoch at a small rate: chance-level error) is retrained on
    new questions through the cloze task's readers and data config, warm-started, 2 epochs: its
    challenger's error on the fixed validation questions beats it and is promoted. An LM data key
    is refused before anything is recorded; the same retrain again trains nothing."""
    from dynlm.config import ConfigError

    corpora = _task_corpora("cloze", tmp_path)
    champion_job = _register_champion("cloze", corpora, tmp_path, mlflow_uri, lr=0.003, capsys=capsys)

    lm_key = _task_retrain_config("cloze", corpora, tmp_path, mlflow_uri,
                                  data={"inputs": [str(corpora["new"])], "format": "conll"})
    with pytest.raises(ConfigError, match=r"^data\.format: the champion is a 'cloze' task model, whose data config "
                                          r"ClozeDataConfig has no key 'format'; known keys: \[.*'named_splits'"):
        retrain(lm_key)
    assert _retrain_runs(mlflow_uri) == []

    cfg = _task_retrain_config("cloze", corpora, tmp_path, mlflow_uri, job_overrides=[
        "train.epochs=2", "train.lr=0.01", f"run.storage_path={tmp_path / 'retrain-ray'}"])
    result = retrain(cfg)
    assert result.decision == "promoted", result.reason
    assert result.challenger_ppl < result.champion_ppl * (1 - cfg.margin)
    assert _champion_of("dynlm-saw", mlflow_uri) == "2"
    _check_scores_and_tags("cloze", result, champion_job, cfg, mlflow_uri)
    (run,) = _retrain_runs(mlflow_uri)
    prepared = PreparedData.open(run.data.tags["challenger_data_dir"])
    assert prepared.manifest["task"] == "cloze" and prepared.manifest["preprocessor_source"] == "given"
    assert prepared.manifest["config"]["bpe_merges"] == 30  # the champion's data settings, the new inputs
    assert sum(prepared.num_documents(split) for split in ("train", "valid", "test")) == 120

    again = retrain(cfg)
    assert again.decision == "already_done" and not again.trained and again.metric == "error"


def test_a_naming_champion_retrains_on_new_code_and_a_worse_challenger_is_rejected(ray_session, mlflow_uri,
                                                                                   tmp_path, capsys):
    """A naming champion (1 epoch) is retrained on new Python files through the naming task's
    readers (a key of its own data config, ``exclude``, given): a challenger from scratch at a
    vanishing rate (random weights) has a worse f1_error on the fixed validation functions and is
    rejected; the champion stays. A cloze/LM data key is refused, naming the task."""
    from dynlm.config import ConfigError

    corpora = _task_corpora("naming", tmp_path)
    champion_job = _register_champion("naming", corpora, tmp_path, mlflow_uri, lr=0.02, capsys=capsys)

    other_task_key = _task_retrain_config("naming", corpora, tmp_path, mlflow_uri,
                                          data={"inputs": [str(corpora["new"])], "bpe_merges": 30})
    with pytest.raises(ConfigError, match=r"^data\.bpe_merges: the champion is a 'naming' task model, whose data "
                                          r"config NamingDataConfig has no key 'bpe_merges'"):
        retrain(other_task_key)
    assert _retrain_runs(mlflow_uri) == []

    cfg = _task_retrain_config(
        "naming", corpora, tmp_path, mlflow_uri, init_from="scratch",
        data={"inputs": [str(corpora["new"])], "output_root": str(tmp_path / "prepared"), "exclude": ["__pycache__/"]},
        job_overrides=["train.lr=1e-9", f"run.storage_path={tmp_path / 'retrain-ray'}"])
    result = retrain(cfg)
    assert result.decision == "rejected", result.reason
    assert result.challenger_ppl > result.champion_ppl and "does not beat" in result.reason
    assert _champion_of("dynlm-naming", mlflow_uri) == "1"
    assert str(MlflowClient(mlflow_uri, mlflow_uri).get_model_version_by_alias("dynlm-naming", "challenger").version) \
        == "2"
    _check_scores_and_tags("naming", result, champion_job, cfg, mlflow_uri)
    (run,) = _retrain_runs(mlflow_uri)
    prepared = PreparedData.open(run.data.tags["challenger_data_dir"])
    assert prepared.manifest["task"] == "naming" and prepared.manifest["config"]["exclude"] == ["__pycache__/"]
