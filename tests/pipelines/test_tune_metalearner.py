"""`dynlm tune --space tune_spaces/metalearner.yaml`: the meta-learner's search space (eta, gate form,
lambda, meta-lr, K, T, meta-steps via train.epochs, BPTT chunk) runs end to end on real Ray and
MLflow, shrunk with --set to 1 sample, 1 epoch and a tiny model."""

from __future__ import annotations

from pathlib import Path

from mlflow import MlflowClient

from dynlm.search.space_file import load_search_space
from pipelines.cli import main
from pipelines.defaults import default_job

REPO = Path(__file__).resolve().parents[2]
METALEARNER = str(REPO / "tune_spaces" / "metalearner.yaml")


def test_metalearner_space_searches_meta_steps_and_unroll():
    space = load_search_space(METALEARNER, base_job=default_job())
    assert {"model.dynamical.unroll_steps", "train.epochs", "train.bptt_sentences", "model.dynamical.meta_lr",
            "model.dynamical.eta", "model.dynamical.decay", "model.dynamical.segment_len",
            "model.dynamical.gate_form"} <= set(space.search)
    assert space.base.model.type == "dynamical"
    assert space.search["model.dynamical.unroll_steps"] == {"choice": [2, 4, 8]}


def test_metalearner_space_runs_one_small_trial(ray_session, mlflow_uri, tmp_path, monkeypatch, capsys):
    from dynlm.data.synth import SynthConfig, write_conll

    synth = tmp_path / "synth"
    write_conll(SynthConfig(num_documents=24, docs_per_file=12), synth)
    monkeypatch.chdir(tmp_path)
    sets = [f"data.inputs=[{synth}]", f"data.output_root={tmp_path / 'prepared'}", "data.vocab_size=200",
            "data.max_chains=10", "data.num_encode_actors=1", "model.embed_dim=16", "model.hidden_dim=16",
            "train.batch_size=4", "run.num_workers=1", "run.cpus_per_worker=0.4", "run.max_failures=0",
            f"run.storage_path={tmp_path / 'ray'}", "tune.num_samples=1", "tune.max_concurrent_trials=1",
            "tune.searcher=random", "tune.seed=0", "tune.grace_period=1", "train.epochs=1"]
    argv = ["tune", "--space", METALEARNER, "--name", "metalearner"]
    for item in sets:
        argv += ["--set", item]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    client = MlflowClient(tracking_uri=mlflow_uri)
    parent = client.search_runs([client.get_experiment_by_name("dynlm").experiment_id],
                                filter_string="tags.`dynlm.kind` = 'tune'")[0]
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 1 and children[0].info.status == "FINISHED"
    metrics = children[0].data.metrics
    assert "train_gate_input_mean" in metrics, sorted(metrics)  # the meta-steps' gate statistics, logged
