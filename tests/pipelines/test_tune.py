"""Ray Tune search on real Ray + real MLflow: shared preprocessing, parent/child runs, ASHA,
best model registered, no placement group left behind, restore after an interrupted driver."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from dynlm.search.report import TrialSummary, error_line
from dynlm.search.space_file import from_mapping
from pipelines.cli import main
from pipelines.defaults import default_job
from pipelines.tune import resume_search, run_search

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "tune_spaces" / "quickstart.yaml")


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory) -> Path:
    from dynlm.data.synth import SynthConfig, write_conll

    out = tmp_path_factory.mktemp("synth")
    write_conll(SynthConfig(num_documents=24, docs_per_file=12), out)
    return out


@pytest.fixture
def stale_ray_address_file(ray_session):
    """Ray's address file naming a cluster that is gone (as a finished test cluster leaves it).

    Regression: Train's placement-group cleaner read it, failed, and the placement groups of
    ended trials leaked until the next trial could not be scheduled. ``run_search`` claims it.
    """
    from pipelines.ray_env import write_address_file

    write_address_file("127.0.0.1:1")
    yield
    write_address_file(ray_session.get_runtime_context().gcs_address)


def _space(tmp_path, synth_dir, search, base=None, **tune):
    raw = {
        "base": {
            "data.inputs": [str(synth_dir)], "data.output_root": str(tmp_path / "prepared"),
            "data.vocab_size": 300, "data.max_chains": 20, "data.num_encode_actors": 1,
            "model.embed_dim": 16, "model.hidden_dim": 16, "model.embedding": "word+subword", "model.subword_dim": 8,
            "train.epochs": 2, "train.batch_size": 4,
            "run.num_workers": 1, "run.cpus_per_worker": 0.4, "run.max_failures": 0,
            "run.storage_path": str(tmp_path / "ray"), **(base or {}),
        },
        "search": search,
        "tune": {"max_concurrent_trials": 2, "grace_period": 1, "seed": 0, **tune},
    }
    return from_mapping(raw, base_job=default_job(), source="test_space.yaml")


def _child_runs(client: MlflowClient, parent_run_id: str):
    parent = client.get_run(parent_run_id)
    return client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'")


def _live_placement_groups():
    import ray

    return [pg for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED"]


def _wait_for_idle_cluster(ray, timeout_s: float = 30.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if not _live_placement_groups() and ray.available_resources().get("CPU", 0) >= 2.0 - 1e-6:
            return
        time.sleep(0.5)
    raise AssertionError(f"cluster not idle after {timeout_s}s: live placement groups "
                         f"{_live_placement_groups()}, available {ray.available_resources()}")


def test_four_trial_asha_search(ray_session, stale_ray_address_file, mlflow_uri, tmp_path, synth_dir):
    space = _space(tmp_path, synth_dir,
                   {"data.bpe_merges": {"grid": [0, 50]}, "model.dntm.merge_fn": {"choice": ["max", "latest"]},
                    "train.lr": {"loguniform": [1e-3, 1e-2]}, "data.gamma": {"uniform": [0.5, 1.0]}},
                   num_samples=2, searcher="random", scheduler="asha")
    assert space.expected_trials() == 4
    result = run_search(space, experiment="search4")

    assert not result.interrupted
    # preprocessing: exactly one run per distinct encoding (bpe_merges), shared by the trials;
    # each trial's continuous gamma got a folder derived from it (hard-linked shards)
    assert result.num_prepared == 2
    manifests = [json.loads((p / "manifest.json").read_text()) for p in (tmp_path / "prepared").iterdir()
                 if (p / "manifest.json").is_file()]
    built = {m["config_hash"] for m in manifests if "derived_from" not in m}
    derived = [m for m in manifests if "derived_from" in m]
    assert len(built) == 2 and len(derived) == 4 and {m["derived_from"] for m in derived} == built
    assert sorted(m["config"]["gamma"] for m in derived) == sorted(t.params["data.gamma"] for t in result.trials)
    assert not [p for p in (tmp_path / "prepared").iterdir() if p.name.startswith(".tmp-")]

    assert len(result.trials) == 4
    assert {t.status for t in result.trials} == {"TERMINATED"}
    assert sorted(t.params["data.bpe_merges"] for t in result.trials) == [0, 0, 50, 50]
    for t in result.trials:
        assert 1 <= t.epochs <= 2 and t.best_valid_objective > 1.0

    client = MlflowClient(tracking_uri=mlflow_uri, registry_uri=mlflow_uri)
    children = _child_runs(client, result.parent_run_id)
    assert len(children) == 4  # one child per trial, under one parent
    assert {c.info.status for c in children} <= {"FINISHED", "KILLED"}  # KILLED: stopped by ASHA
    assert {t.run_id for t in result.trials} == {c.info.run_id for c in children}
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["dynlm.kind"] == "tune"

    # the best finished trial is registered and (first model) becomes champion
    finished = [t for t in result.trials if t.run_status == "FINISHED"]
    assert result.best == min(finished, key=lambda t: t.best_valid_objective)
    assert parent.data.metrics["best_valid_objective"] == pytest.approx(result.best.best_valid_objective)
    champion = client.get_model_version_by_alias("dynlm-dntm", "champion")
    assert champion.tags["run_id"] == result.best.run_id
    assert result.registration.promoted

    # results table (CSV) and plot on the parent run
    artifacts = {a.path for a in client.list_artifacts(result.parent_run_id)}
    assert {"tune_results.csv", "tune_results.png"} <= artifacts
    local = client.download_artifacts(result.parent_run_id, "tune_results.csv", str(tmp_path))
    rows = list(csv.DictReader(io.StringIO(Path(local).read_text())))
    assert len(rows) == 4 and {r["trial"] for r in rows} == {t.trial_id for t in result.trials}

    # nothing left behind: the next search can start at once
    _wait_for_idle_cluster(ray_session)


def test_interrupted_search_resumes_without_rerunning_finished_trials(ray_session, mlflow_uri, tmp_path, synth_dir):
    space = _space(tmp_path, synth_dir, {"model.dntm.merge_fn": {"grid": ["max", "latest"]}},
                   base={"train.epochs": 1},
                   num_samples=1, searcher="random", scheduler="fifo", max_concurrent_trials=1)
    client = MlflowClient(tracking_uri=mlflow_uri)
    interrupted_after: list[str] = []

    def interrupt_after_first_finished_trial():
        # Ctrl-C of the driver: Tune's handler (SIGINT/SIGUSR1) saves the state and stops.
        deadline = time.time() + 300
        while time.time() < deadline:
            runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                      filter_string="attributes.status = 'FINISHED' and tags.mlflow.parentRunId != ''")
            if runs:
                interrupted_after.extend(r.info.run_id for r in runs)
                os.kill(os.getpid(), signal.SIGUSR1)
                return
            time.sleep(0.5)

    watcher = threading.Thread(target=interrupt_after_first_finished_trial, daemon=True)
    watcher.start()
    first = run_search(space, experiment="interrupted")
    watcher.join(timeout=5)
    assert interrupted_after, "no trial finished before the watcher gave up"
    assert first.interrupted
    # finished = its MLflow run finished (Tune also calls the trials it stopped at the interrupt
    # TERMINATED in memory, but saves them as unfinished, so the restore runs them)
    done_first = {t.trial_id: t.run_id for t in first.trials if t.run_status == "FINISHED"}
    assert len(done_first) == 1  # the second trial was cut short

    resumed = resume_search("interrupted", storage_path=str(tmp_path / "ray"))
    assert not resumed.interrupted
    assert resumed.parent_run_id == first.parent_run_id
    assert len(resumed.trials) == 2 and {t.status for t in resumed.trials} == {"TERMINATED"}
    for trial_id, run_id in done_first.items():  # finished trials were not re-run
        again = next(t for t in resumed.trials if t.trial_id == trial_id)
        assert again.run_id == run_id
    children = _child_runs(client, first.parent_run_id)
    finished_children = [c for c in children if c.info.status == "FINISHED"]
    assert len(finished_children) == 2  # one finished child per trial, none twice
    assert resumed.best is not None and resumed.registration is not None
    _wait_for_idle_cluster(ray_session)


def test_runs_left_running_are_closed_by_what_happened_to_their_trial(mlflow_uri):
    from types import SimpleNamespace

    from pipelines.tune import close_ended_runs

    client = MlflowClient(tracking_uri=mlflow_uri)
    experiment_id = client.create_experiment("close")
    parent = client.create_run(experiment_id).info.run_id

    def child() -> str:
        return client.create_run(experiment_id, tags={"mlflow.parentRunId": parent}).info.run_id

    errored, stopped, finished, earlier_attempt = child(), child(), child(), child()
    client.set_terminated(finished, "FINISHED")
    trials = [TrialSummary("t0", {}, "ERROR", float("nan"), 0, 1.0, errored, "RUNNING"),
              TrialSummary("t1", {}, "TERMINATED", 40.0, 1, 2.0, stopped, "RUNNING"),
              TrialSummary("t2", {}, "TERMINATED", 30.0, 2, 3.0, finished, "FINISHED")]
    grid = [SimpleNamespace(error=RuntimeError("worker exploded")), SimpleNamespace(error=None),
            SimpleNamespace(error=None)]  # what close_ended_runs reads from Tune's results
    close_ended_runs(trials, grid, {"parent_run_id": parent}, mlflow_uri)

    def status(run_id: str) -> str:
        return client.get_run(run_id).info.status

    assert status(errored) == "FAILED" and "worker exploded" in client.get_run(errored).data.tags["dynlm.error"]
    assert status(stopped) == "KILLED" and "dynlm.stopped" in client.get_run(stopped).data.tags
    assert status(finished) == "FINISHED"
    assert status(earlier_attempt) == "KILLED"  # an attempt a restore re-ran
    assert [t.run_status for t in trials] == ["FAILED", "KILLED", "FINISHED"]


def test_search_where_no_trial_finishes_exits_1_and_names_the_errors(ray_session, mlflow_uri, tmp_path,
                                                                      monkeypatch, capsys):
    import yaml

    monkeypatch.chdir(tmp_path)
    space = yaml.safe_load(Path(QUICKSTART).read_text())
    space["search"]["data.bpe_merges"] = {"grid": [0]}  # the quickstart with one trial
    Path("one_trial.yaml").write_text(yaml.safe_dump(space))
    code = main(["tune", "--space", "one_trial.yaml", "--set", "train.epochs=1", "--set", "tune.num_samples=1",
                 "--set", "run.fail_at_epoch=1", "--set", "run.fail_rank=0", "--name", "failing"])
    captured = capsys.readouterr()
    assert code == 1
    assert "dynlm: error: tune: no trial finished (1 trial; errors above)" in captured.err
    failed_lines = [line for line in captured.out.splitlines() if line.startswith("[tune]   ")]
    assert len(failed_lines) == 1, captured.out[-3000:]
    assert "fault injection: rank 0 fails in epoch 1" in failed_lines[0]
    client = MlflowClient(tracking_uri=mlflow_uri)
    parent = client.search_runs([client.get_experiment_by_name("dynlm").experiment_id],
                                filter_string="tags.`dynlm.kind` = 'tune'")[0]
    assert parent.info.status == "FAILED" and parent.data.metrics["num_failed_trials"] == 1
    assert parent.data.tags["dynlm.failed_trials"].count("fault injection") == 1
    _wait_for_idle_cluster(ray_session)


def test_a_data_config_the_corpus_cannot_support_is_left_to_its_trials(ray_session, tmp_path, synth_dir, capsys):
    """The pre-pass prepares the configs it can; one the corpus cannot support (more BPE merges
    than it has pairs) is recorded with its one-line reason, which its trials fail with (their
    first error line, listed by the search), instead of ending the whole search."""
    from pipelines.tune import prepare_all

    space = _space(tmp_path, synth_dir, {"data.bpe_merges": {"grid": [0, 100000]}})
    roots, unprepared = prepare_all(space)
    (root,) = roots.values()
    assert Path(root).parent == tmp_path / "prepared"
    ((encoding, reason),) = unprepared.items()
    assert re.fullmatch(r"the corpus \(\d+ word types, \d+ characters\) supports at most \d+ BPE merges, "
                        r"100000 were asked \(bpe_merges\)", reason), reason
    assert "[tune] data config 2/2 cannot be prepared; its trials will fail: the corpus" in capsys.readouterr().out


def test_a_trial_never_preprocesses_a_missing_data_config(tmp_path, synth_dir):
    """The trial-side lookup fails at once, naming the data config and the pre-pass, without a
    Ray Data job (it would wait forever for a CPU inside the trial's placement group)."""
    from dynlm.data.config import DataConfig
    from pipelines.prepare import PreparedDataMissing
    from pipelines.tune import _derive_in_trial

    cfg = DataConfig(inputs=[str(synth_dir)], output_root=str(tmp_path / "prepared"), bpe_merges=7)
    start = time.time()
    with pytest.raises(PreparedDataMissing, match=rf"data config {cfg.data_hash()} \(format=auto, .*bpe_merges=7.*"
                                                  r"pre-pass prepared \['abc'\]"):
        _derive_in_trial(cfg, {"prepared": {"abc": "/somewhere"}, "base": {"task": "lm"}})
    assert time.time() - start < 5
    assert not [p for p in (tmp_path / "prepared").iterdir() if not p.name.startswith(".")]


def test_error_line_unwraps_ray_errors():
    """dynlm.search.report.error_line on Ray's own wrappers (it reads them by duck typing)."""
    from ray.train import WorkerGroupError

    grouped = WorkerGroupError("[Rank 0 Error Snippet]: ...", {1: ValueError("b"), 0: KeyError("first rank")})
    assert error_line(grouped) == "KeyError: 'first rank'"

