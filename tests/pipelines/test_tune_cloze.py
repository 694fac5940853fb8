"""A small variant of tune_spaces/saw.yaml through `dynlm tune`'s search on real Ray + MLflow: the
cloze task's trials prepare nothing themselves, the parent run gets the results table and the
error-vs-bpe_merges / gamma figure, and the best reader is registered as dynlm-saw."""

from __future__ import annotations

from pathlib import Path

import yaml
from mlflow import MlflowClient

from dynlm.data.synthetic_cloze import write_synthetic_cbt
from dynlm.search.space_file import from_mapping, load_search_space
from pipelines.defaults import default_job
from pipelines.tune import run_search

REPO = Path(__file__).resolve().parents[2]


def test_small_saw_search(ray_session, mlflow_uri, tmp_path):
    write_synthetic_cbt(tmp_path / "cloze", 120, seed=4)
    full = yaml.safe_load((REPO / "tune_spaces" / "saw.yaml").read_text())
    base = {**full["base"], "data.inputs": [str(tmp_path / "cloze")], "data.output_root": str(tmp_path / "prepared"),
            "data.num_encode_actors": 1, "model.embed_dim": 16, "model.hidden_size": 16, "model.subword_dim": 8,
            "train.epochs": 1, "run.storage_path": str(tmp_path / "ray")}
    search = {"data.bpe_merges": {"grid": [0, 20]}, "data.gamma": {"uniform": [0.1, 1.0]},
              "model.combine": {"choice": full["search"]["model.combine"]["choice"]}}
    space = from_mapping({"base": base, "search": search, "tune": {**full["tune"], "num_samples": 1, "grace_period": 1}},
                         base_job=default_job(), source="saw_small.yaml")
    assert space.expected_trials() == 2 and set(space.search) == set(load_search_space(
        REPO / "tune_spaces" / "saw.yaml", base_job=default_job()).search)
    result = run_search(space, experiment="saw-small")

    assert len(result.trials) == 2 and sorted(t.params["data.bpe_merges"] for t in result.trials) == [0, 20]
    assert all(0.0 <= t.best_valid_objective <= 1.0 for t in result.trials)  # error = 1 - accuracy
    client = MlflowClient(tracking_uri=mlflow_uri, registry_uri=mlflow_uri)
    artifacts = {a.path for a in client.list_artifacts(result.parent_run_id)}
    assert {"tune_results.csv", "tune_results.png"} <= artifacts
    assert client.get_model_version_by_alias("dynlm-saw", "champion").tags["run_id"] == result.best.run_id
