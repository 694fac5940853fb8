"""Scheduled retraining on real Ray + real MLflow: promotion, refusal, idempotency, a race
between two retrains, and a crash before promotion.

One weak champion (1 epoch) is trained once per module into a template SQLite store; every
test starts from a copy of that store, so each test sees champion v1 and nothing else.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from mlflow import MlflowClient

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
        "margin": 0.01,
        "job_overrides": ["train.epochs=2", "train.lr=0.01", f"run.storage_path={tmp_path / 'ray'}"],
        "tracking_uri": uri,
    }
    data.update(changes)
    return RetrainConfig.from_dict(data)


def _champion(uri: str) -> str:
    return str(MlflowClient(uri, uri).get_model_version_by_alias(NAME, "champion").version)


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
    config_path.write_text(__import__("yaml").safe_dump(cfg.to_dict()))
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
    from pipelines.retrain import validation_ppl, validation_rows

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
    here = validation_ppl(task, model, model_cfg, spec, validation_rows(str(validation), task, preprocessor, None), 8)
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
