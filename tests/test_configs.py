"""``configs/``: the job file per task and model that a user starts from. Each is complete and
strict (``dynlm config show`` reads it), and each trains through ``dynlm train --local`` on
generated data of its task (sizes shrunk with ``--set``; no Ray: the unit tier)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.defaults import CONFIG_DIR, DEFAULT_JOB_FILE, load_job

CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))
SMALL = {"lm": ["model.embed_dim=16", "model.hidden_dim=16", "data.vocab_size=200", "data.bpe_merges=20"],
         "cloze": ["model.embed_dim=16", "model.subword_dim=8", "model.hidden_size=16", "data.bpe_merges=20"],
         "naming": ["model.embed_dim=16", "model.noise_samples=4"]}


def _inputs(task: str, folder: Path) -> Path:
    """A small generated corpus of ``task``."""
    if task == "lm":
        from dynlm.data.synth import SynthConfig, write_conll

        write_conll(SynthConfig(num_documents=16, docs_per_file=8), folder)
    elif task == "cloze":
        from dynlm.data.synthetic_cloze import write_synthetic_cbt

        write_synthetic_cbt(folder, 60, seed=1)
    else:
        from dynlm.data.synthetic_code import SynthCodeConfig, write_code_corpus

        write_code_corpus(SynthCodeConfig(num_files=12, seed=1), folder)
    return folder


def test_every_task_and_model_has_a_config_and_the_default_job_is_one():
    assert [p.name for p in CONFIGS] == ["cloze_saw.yaml", "lm_dntm.yaml", "lm_dynamical.yaml", "lm_rnn.yaml",
                                         "naming_lbl.yaml"]
    assert load_job(None) == load_job(DEFAULT_JOB_FILE)  # `dynlm run` / `dynlm train` with no --config
    kinds = {(load_job(p).task, load_job(p).model_type) for p in CONFIGS}
    assert kinds == {("lm", "dntm"), ("lm", "rnn"), ("lm", "dynamical"), ("cloze", "saw"), ("naming", "naming")}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_a_config_trains_as_written_but_for_its_size(path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    job = load_job(path)
    inputs = _inputs(job.task, tmp_path / "inputs")
    sets = [f"data.inputs=[{inputs}]", f"data.output_root={tmp_path / 'prepared'}", "train.epochs=1",
            f"run.storage_path={tmp_path / 'runs'}", "run.name=local", *SMALL[job.task]]
    assert main(["config", "show", "--config", str(path)]) == 0  # complete and strict
    capsys.readouterr()
    argv = ["train", "--local", "--config", str(path)]
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])  # `train --local`'s last line
    assert summary["best_epoch"] == 1
    assert (tmp_path / "runs" / "local" / "model.pt").is_file()
