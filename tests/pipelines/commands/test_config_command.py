"""``dynlm config show``: the effective job, complete, read back by ``--config`` to the same job."""

from __future__ import annotations

import yaml

from pipelines.cli import USAGE_ERROR_EXIT_CODE, main
from pipelines.defaults import load_job


def test_the_shown_job_is_complete_and_reads_back_to_the_same_job(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DYNLM_STORAGE_PATH", raising=False)
    assert main(["config", "show", "--set", "train.lr=0.01", "--set", "model.dntm.merge_fn=max"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# the effective job of the embedded default job (pipelines/defaults.py), "
                          "with --set train.lr=0.01 model.dntm.merge_fn=max\n")
    shown = yaml.safe_load(out)
    expected = load_job(None, ["train.lr=0.01", "model.dntm.merge_fn=max"])
    assert shown == expected.to_dict()  # every key, defaults included
    assert shown["train"]["lr"] == 0.01 and shown["train"]["grad_clip"] == 0.25  # embedded job's clip
    (tmp_path / "shown.yaml").write_text(out)
    assert load_job(tmp_path / "shown.yaml") == expected


def test_a_task_job_file_is_shown_with_its_task_sections(tmp_path, capsys):
    (tmp_path / "cloze.yaml").write_text(yaml.safe_dump({
        "task": "cloze", "data": {"inputs": ["cloze"]}, "model": {"combine": "mul"}}))
    assert main(["config", "show", "--config", str(tmp_path / "cloze.yaml")]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["task"] == "cloze" and shown["model"]["combine"] == "mul"
    assert shown == load_job(tmp_path / "cloze.yaml").to_dict()


def test_an_unknown_key_is_one_line(capsys):
    assert main(["config", "show", "--set", "train.lrr=1"]) == USAGE_ERROR_EXIT_CODE
    assert capsys.readouterr().err == "dynlm: error: override: unknown key 'train.lrr'\n"
