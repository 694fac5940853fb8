"""Ray Train DDP training on a small prepared synthetic corpus: real Ray, real gloo, real MLflow.

One uninterrupted 2-worker run is shared by the tests (module fixture); the resume and the
fault-injection runs are compared with it.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
from pathlib import Path

import pytest
import torch

from dynlm import checkpoint as dynlm_checkpoint
from dynlm.data.synth import SynthConfig, write_conll
from pipelines.defaults import default_job

EPOCHS = 2


def _job(tmp: Path, prepared_root: Path, *overrides: str):
    return default_job([
        f"data.inputs=[{tmp / 'synth'}]", f"data.output_root={prepared_root}", "data.vocab_size=300",
        "data.bpe_merges=30", "data.num_encode_actors=1",
        "model.embed_dim=16", "model.hidden_dim=16", "model.dropout=0.1",
        f"train.epochs={EPOCHS}", "train.batch_size=4", "train.lr=0.01", "train.early_stopping_patience=0",
        f"run.storage_path={tmp / 'ray'}", "run.register=false", "run.num_workers=2", *overrides])


@pytest.fixture(scope="module")
def corpus(ray_session, tmp_path_factory):
    """(tmp folder, prepared data) of a 40-document synthetic corpus."""
    from pipelines.prepare import prepare

    tmp = tmp_path_factory.mktemp("train")
    write_conll(SynthConfig(num_documents=24, docs_per_file=12), tmp / "synth")
    job = _job(tmp, tmp / "prepared")
    return tmp, prepare(job.data, progress=False)


@pytest.fixture(scope="module")
def mlflow_module_uri(tmp_path_factory, empty_mlflow_db):
    tmp = tmp_path_factory.mktemp("mlflow")
    shutil.copy(empty_mlflow_db, tmp / "mlflow.db")
    old = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "DYNLM_MLFLOW_ARTIFACTS")}
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow.db'}"
    os.environ["DYNLM_MLFLOW_ARTIFACTS"] = str(tmp / "artifacts")
    yield os.environ["MLFLOW_TRACKING_URI"]
    for key, value in old.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _split_coordinators() -> int:
    """Ray Data split-coordinator actors the session's Ray has started (dead ones included):
    one per training whose train split Ray Train streams (``streaming_split``)."""
    from ray.util.state import list_actors

    return sum(a.class_name == "SplitCoordinator" for a in list_actors(limit=10_000, raise_on_missing_output=False))


@pytest.fixture(scope="module")
def baseline(corpus, mlflow_module_uri):
    from pipelines.train import run_training

    tmp, prepared = corpus
    coordinators = _split_coordinators()
    result = run_training(_job(tmp, prepared.root, "run.name=baseline", "run.system_metrics_s=0.5"), prepared)
    result.split_coordinators_started = _split_coordinators() - coordinators  # checked by the first test
    return result


def test_two_workers_learn_and_stay_in_sync(baseline, corpus, mlflow_module_uri):
    history = baseline.history
    assert [r["epoch"] for r in history] == [1, 2]
    assert history[-1]["train_ppl"] < history[0]["train_ppl"]
    assert history[-1]["valid_ppl"] < history[0]["valid_ppl"]
    # every rank ends with bit-identical parameters, after every epoch
    assert len(baseline.param_checksums) == 2
    assert baseline.param_checksums[0] == baseline.param_checksums[1]
    assert all(r["param_checksum_spread"] == 0.0 for r in history)
    # every training document is seen once per epoch, except what Ray's equal split drops
    # (fewer than num_workers, reported); padding waste is reported
    _, prepared = corpus
    for r in history:
        assert r["train_documents"] + r["train_documents_dropped"] == prepared.num_documents("train")
        assert 0 <= r["train_documents_dropped"] < 2
    assert all(0.0 <= r["train_padding_fraction"] < 1.0 for r in history)
    # the train split is this small: read once into the object store, not again every epoch
    from dynlm.job import RunSettings
    from pipelines.train import caches_train_split

    assert caches_train_split(RunSettings(), prepared)
    assert caches_train_split(RunSettings(cache_train_split="always"), prepared)
    assert not caches_train_split(RunSettings(cache_train_split="never"), prepared)
    # ... and cut once on the driver into one part per rank: no split coordinator (a new actor
    # process in every training) starts (the streamed path: the dynamical model's test below)
    assert baseline.split_coordinators_started == 0
    # the validation metrics cover the whole valid split (summed over ranks)
    assert history[0]["valid_tokens"] == sum(
        sum(n - 1 for n in row["sentence_lengths"]) for row in prepared.iter_rows("valid"))
    # the best checkpoint: model + preprocessor, loaded with weights_only=True
    best = Path(baseline.best_checkpoint_dir)
    assert (best / "preprocessor.json").is_file()
    model, model_cfg, spec, extra = dynlm_checkpoint.load(best / "model.pt")
    assert model_cfg.embed_dim == 16 and spec == prepared.spec
    assert extra["fit_state"]["epoch"] == min(history, key=lambda r: r["valid_ppl"])["epoch"]
    assert baseline.best_valid_objective == pytest.approx(min(r["valid_ppl"] for r in history))
    # MLflow: one value per epoch, logged by rank 0 only
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_module_uri)
    values = client.get_metric_history(baseline.run_id, "valid_ppl")
    assert sorted(m.step for m in values) == [1, 2]
    # system metrics of rank 0's node, sampled by MLflow's monitor during the training
    from pipelines import tracking

    cpu = client.get_metric_history(baseline.run_id, "system/cpu_utilization_percentage")
    assert cpu and all(0.0 <= m.value <= 100.0 for m in cpu)
    assert tracking.system_metrics_summary(baseline.run_id, tracking_uri=mlflow_module_uri).startswith("mean CPU ")
    # the DNTM paper's accumulation analysis of the best epoch, as a figure and as metrics
    assert "accumulation.png" in {a.path for a in client.list_artifacts(baseline.run_id)}
    best = min(history, key=lambda r: r["valid_ppl"])
    counts = [best[f"valid_count_reappearing_{b}"] for b in ("1", "2", "3_5", "6_plus")]
    assert sum(counts) == best["valid_count_reappearing"] > 0
    # a local Ray gets dynlm's settings (pipelines.ray_env.LOCAL_RAY_ENV), and Ray still reads them:
    # no preemption watcher; and a split of a few files is read without a footer-reader actor
    # (pipelines.train.read_split), Ray's default datasource untouched afterwards
    import ray.data
    from ray.util.state import list_actors

    from pipelines.train import read_split

    started = [a.class_name for a in list_actors(limit=10_000, raise_on_missing_output=False)]
    assert "PreemptionWatcher" not in started
    assert "FooterReader" not in started, started
    assert ray.data.DataContext.get_current().use_datasource_v2
    assert read_split(prepared, "valid").count() == prepared.num_documents("valid")
    assert ray.data.DataContext.get_current().use_datasource_v2


def _close(a: dict, b: dict, keys=("train_loss", "valid_ppl", "param_checksum"), rel=1e-6):
    for key in keys:
        assert a[key] == pytest.approx(b[key], rel=rel), key


def test_evaluate_as_a_ray_data_job_equals_the_in_process_evaluation(baseline, corpus, capsys):
    """`dynlm evaluate --ray-scoring always`: the split read by Ray Data, scored by an actor that
    loaded the checkpoint once, the metric sums added up here: the in-process metrics again."""
    import json

    from pipelines.cli import main

    _, prepared = corpus
    scored = {}
    for how in ("never", "always"):
        capsys.readouterr()
        assert main(["evaluate", "--model", baseline.best_checkpoint_dir, "--data", str(prepared.root),
                     "--split", "valid", "--ray-scoring", how, "--score-actors", "1", "--json"]) == 0
        scored[how] = json.loads(capsys.readouterr().out)
    here, on_ray = scored["never"], scored["always"]
    assert (here["scored_on"], on_ray["scored_on"]) == ("this process", "Ray Data, 1 CPU actor(s)")
    assert here["documents"] == on_ray["documents"] == prepared.num_documents("valid")
    assert here["metrics"].keys() == on_ray["metrics"].keys()
    for key, value in here["metrics"].items():
        assert on_ray["metrics"][key] == pytest.approx(value, rel=1e-6), key  # float32 sums, other batches
    # the validation of the training saw the same documents and model: the same perplexity
    best = min(baseline.history, key=lambda r: r["valid_ppl"])
    assert on_ray["metrics"]["ppl"] == pytest.approx(best["valid_ppl"], rel=1e-5)


def test_resume_from_checkpoint_equals_uninterrupted(baseline, corpus):
    from pipelines.train import _read_run_info, run_training

    tmp, prepared = corpus
    # the first command dies in epoch 2 (no retries) after checkpointing epoch 1 ...
    with pytest.raises(Exception, match="fault injection"):
        run_training(_job(tmp, prepared.root, "run.name=resumed", "run.fail_at_epoch=2", "run.fail_rank=0",
                          "run.max_failures=0"), prepared)
    # ... a fresh command with --resume continues from the epoch-1 checkpoint
    result = run_training(_job(tmp, prepared.root, "run.name=resumed", "run.fail_at_epoch=2", "run.fail_rank=0",
                               "run.resume=true"), prepared)
    assert [r["epoch"] for r in result.history] == [1, 2]
    for resumed, uninterrupted in zip(result.history, baseline.history):
        _close(resumed, uninterrupted)
    assert result.run_id == _read_run_info(f"{tmp / 'ray'}/resumed")["mlflow_run_id"]  # one MLflow run


def test_resume_with_other_data_is_a_user_error_before_training(baseline, corpus):
    from dynlm.config import ConfigError
    from pipelines.cli import is_user_error
    from pipelines.train import run_training

    tmp, prepared = corpus
    with pytest.raises(ConfigError, match=r"--resume: run 'baseline' trained on data \w+, this job prepares \w+") as raised:
        run_training(_job(tmp, prepared.root, "run.name=baseline", "run.resume=true", "data.vocab_size=301"), prepared)
    assert is_user_error(raised.value)  # `dynlm train --resume`: one line, exit 2


def test_worker_failure_restarts_from_checkpoint(baseline, corpus):
    from pipelines.train import run_training

    tmp, prepared = corpus
    result = run_training(_job(tmp, prepared.root, "run.name=faulted", "run.fail_at_epoch=2", "run.fail_rank=1",
                               "run.max_failures=1"), prepared)
    assert (tmp / "ray" / "faulted" / "fault_injected_epoch2_rank1").is_file()  # it did fail once
    assert [r["epoch"] for r in result.history] == [1, 2]  # no epoch lost or counted twice
    for faulted, uninterrupted in zip(result.history, baseline.history):
        _close(faulted, uninterrupted, rel=1e-5)
    assert result.param_checksums[0] == result.param_checksums[1]


# --- lockstep DDP over uneven shards, without Ray (2 gloo processes) ---------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _uneven_worker(rank: int, root: str, port: int, batches_per_rank: tuple, out: str) -> None:
    import torch.distributed as dist

    from dynlm.data.prepared import PreparedData
    from dynlm.distributed import EveryParameterUsed, parameter_checksum
    from dynlm.models import build_model
    from dynlm.optim import LRSchedule, build_optimizer
    from dynlm.tasks.lm import LMTask
    from dynlm.training import train_one_epoch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    job = default_job(["model.embed_dim=16", "model.hidden_dim=16"])
    prepared = PreparedData.open(root)
    torch.manual_seed(rank)  # different initial weights: DDP must broadcast rank 0's
    core = build_model(job.model, prepared.spec)
    model = torch.nn.parallel.DistributedDataParallel(EveryParameterUsed(core))
    optimizer = build_optimizer(core, job.train)
    rows = list(prepared.iter_rows("train"))[rank::2]
    batches = list(LMTask().stream_batches(iter(rows), prepared.spec, 2, seed=rank, buffer_rows=64))
    batches = batches[: batches_per_rank[rank]]
    totals = train_one_epoch(model, optimizer, LRSchedule(optimizer, "constant"), job.train, iter(batches),
                             torch.device("cpu"), spec=prepared.spec, task=LMTask())
    Path(out, f"rank{rank}.txt").write_text(f"{parameter_checksum(core)!r} {totals['steps']} {totals['idle_batches']}")
    # The results are on disk: leave without interpreter teardown (gloo's threads can std::terminate
    # while Python finalizes, pytorch/pytorch#190489; see tests/dynlm/tasks/test_naming.py).
    os._exit(0)


def test_uneven_shards_run_in_lockstep_without_hanging(corpus, tmp_path):
    import torch.multiprocessing as mp

    _, prepared = corpus
    mp.start_processes(_uneven_worker, args=(str(prepared.root), _free_port(), (3, 1), str(tmp_path)),
                       nprocs=2, join=True, start_method="spawn")
    (sum0, steps0, idle0), (sum1, steps1, idle1) = [
        (tmp_path / f"rank{r}.txt").read_text().split() for r in range(2)]
    assert sum0 == sum1 and math.isfinite(float(sum0))  # identical parameters after the epoch
    assert steps0 == steps1  # the same optimizer steps on both ranks
    assert (idle0, idle1) == ("0", "2")  # rank 1 ran two inactive batches while rank 0 finished


def test_dynamical_model_trains_registers_and_evaluates_by_alias(corpus, mlflow_module_uri, capsys):
    """The meta-learned dynamical LM goes through the same pipeline as the other models: 2 DDP
    workers (autograd.grad inside the forward), an MLflow run, the registry, and `dynlm evaluate`
    of ``models:/dynlm-dynamical@champion``. Its train split is streamed from the Parquet files
    every epoch (``run.cache_train_split=never``, what a split too large for the object store
    gets): Ray Train's ``streaming_split`` hands each rank its shard."""
    from mlflow import MlflowClient

    from pipelines.cli import main
    from pipelines.train import run_training

    tmp, prepared = corpus
    job = _job(tmp, prepared.root, "run.name=dynamical", "run.register=true", "train.epochs=2",
               "model.type=dynamical", "model.embedding=word", "model.dynamical.fast_params=[output]",
               "model.dynamical.segment_len=8", "model.dynamical.unroll_steps=2", "run.cache_train_split=never")
    coordinators = _split_coordinators()
    result = run_training(job, prepared)
    assert _split_coordinators() > coordinators  # streamed through Ray Train's split
    assert [r["epoch"] for r in result.history] == [1, 2]
    for record in result.history:  # every document once per epoch but the equal split's remainder
        assert record["train_documents"] + record["train_documents_dropped"] == prepared.num_documents("train")
        assert 0 <= record["train_documents_dropped"] < 2
    assert all(math.isfinite(r["valid_ppl"]) for r in result.history)
    assert result.param_checksums[0] == result.param_checksums[1]  # DDP kept theta and phi in sync
    assert result.model_version is not None

    client = MlflowClient(mlflow_module_uri, registry_uri=mlflow_module_uri)
    champion = client.get_model_version_by_alias("dynlm-dynamical", "champion")
    assert champion.run_id == result.run_id
    run = client.get_run(result.run_id)
    assert run.data.params["model.type"] == "dynamical"
    gate_history = client.get_metric_history(result.run_id, "train_gate_input_mean")
    assert [m.step for m in gate_history] == [1, 2] and all(0 < m.value < 2 for m in gate_history)
    model, model_cfg, _, _ = dynlm_checkpoint.load(Path(result.best_checkpoint_dir) / "model.pt")
    assert model_cfg.type == "dynamical" and type(model).__name__ == "DynamicalLM"

    capsys.readouterr()
    assert main(["evaluate", "--model", "models:/dynlm-dynamical@champion", "--data", str(prepared.root)]) == 0
    out = capsys.readouterr().out
    test_ppl = float(next(line for line in out.splitlines() if "all tokens" in line).split()[-1])
    assert 1.0 < test_ppl < prepared.spec.output_size  # finite, better than uniform


@pytest.mark.parametrize("flags, reason", [
    (["--use-gpu"], "run.use_gpu asks for 2 GPU(s) (one per worker, run.num_workers=2) and this Ray has 0: "),
    (["--num-workers", "4", "--set", "run.cpus_per_worker=0.5"],
     "run.num_workers=4 x run.cpus_per_worker=0.5 = 2 CPUs leave 0.00 of this Ray's 2 CPUs free; "),
])
def test_workers_beyond_the_local_ray_are_one_line_at_once(ray_session, mlflow_uri, tmp_path, monkeypatch,
                                                           capsys, flags, reason):
    """On a Ray this process started (the session's 2-CPU, no-GPU one), asking for more than it
    has fails before the data is prepared and before any worker or MLflow run starts."""
    import time

    from mlflow import MlflowClient

    from pipelines.cli import main

    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    assert main(["train", *flags, "--set", f"run.storage_path={tmp_path / 'ray'}"]) == 2
    assert time.monotonic() - start < 30  # not Ray Train's endless worker-group start-up retries
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"dynlm: error: {reason}"), err
    assert not (tmp_path / "runs" / "prepared").exists() and not (tmp_path / "ray").exists()
    assert MlflowClient(mlflow_uri).search_experiments(filter_string="name = 'dynlm'") == []
