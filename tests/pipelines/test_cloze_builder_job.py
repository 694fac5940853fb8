"""`dynlm data cloze` (a Ray Data job) on the synthetic CoNLL corpus (gold coreference): the same
bytes on a second run, every question answerable, its files read by the cloze task."""

from __future__ import annotations

from dynlm.data.cbt import parse_cbt
from dynlm.data.synth import SynthConfig, write_conll
from dynlm.tasks import get_task
from dynlm.tasks.cloze_data import ClozeDataConfig
from dynlm.tasks.local import files_table, prepare_in_memory
from pipelines.cli import main


def test_cloze_corpus_from_a_coreference_corpus(ray_session, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_conll(SynthConfig(num_documents=30, seed=1, events_per_document=24), tmp_path / "synth")  # >= 21 sentences
    assert main(["data", "cloze", "--input", "synth", "--out", "cloze"]) == 0
    assert main(["data", "cloze", "--input", "synth", "--out", "again"]) == 0
    assert "cloze questions" in capsys.readouterr().out
    files = sorted((tmp_path / "cloze").iterdir())
    assert files and [f.name for f in files] == sorted(f.name for f in (tmp_path / "again").iterdir())
    assert all(f.read_bytes() == (tmp_path / "again" / f.name).read_bytes() for f in files)  # deterministic
    questions = [q for f in files for q in parse_cbt(f.read_bytes(), str(f))]
    assert questions and all(isinstance(q, dict) for q in questions)
    assert all(q["answer"] in q["document"] and q["answer"] in q["candidates"] for q in questions)
    assert any(f.name.startswith("cbtest_NE_") for f in files)  # entity mentions from gold coreference

    cfg = ClozeDataConfig(inputs=[str(tmp_path / "cloze")], named_splits=True, bpe_merges=10)
    done = prepare_in_memory(get_task("cloze"), files_table(cfg.input_files()), cfg)
    assert done.rejected() == [] and len(done.rows()) == len(questions)
    by_file = {row["source_file"].rsplit("/", 1)[-1].removesuffix(".txt").rsplit("_", 1)[-1]
               for split, rows in done.splits.items() for row in rows if split not in row["source_file"]}
    assert by_file == set()  # every question is in the split its file names
