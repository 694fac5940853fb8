"""The cloze task in one process: prepare stages on generated CBT/CMRC files (quarantine, split,
encoding), metrics round trips, the learning test, serving."""

from __future__ import annotations

import math

import pytest
import torch

from dynlm.data.synthetic_cloze import synthetic_cbt_text, write_synthetic_cbt
from dynlm.models.ga_reader import GAReaderConfig
from dynlm.requests import InputError
from dynlm.tasks import get_task
from dynlm.tasks.cloze_data import ClozeDataConfig, collate_questions
from dynlm.tasks.cloze_metrics import ClozeMetrics
from dynlm.tasks.local import files_table, prepare_in_memory, prepare_local
from dynlm.training import TrainConfig, train_step

TASK = get_task("cloze")
TRAIN = TrainConfig(grad_clip=5.0)


def test_synthetic_corpus_is_deterministic_and_answerable():
    assert synthetic_cbt_text(5, seed=3) == synthetic_cbt_text(5, seed=3) != synthetic_cbt_text(5, seed=4)


def test_prepare_splits_by_question_quarantines_and_encodes(tmp_path):
    write_synthetic_cbt(tmp_path, 60, seed=0)
    broken = tmp_path / "cbtest_CN_extra.txt"
    block = synthetic_cbt_text(1, seed=9)
    answer = block.split("\t")[1]
    broken.write_text(block.replace(f"\t{answer}\t", "\tnowhere\t") + block, encoding="utf-8")
    (tmp_path / "toy.doc_query").write_text("1 ||| 甲 乙 丙 。\n<qid_0> ||| XXXXX 乙 丙 。\n"
                                                  "1 ||| 丁 戊 。\n<qid_1> ||| XXXXX 戊 。\n", encoding="utf-8")
    (tmp_path / "toy.answer").write_text("<qid_0> ||| 甲\n<qid_1> ||| 己\n", encoding="utf-8")
    cfg = ClozeDataConfig(inputs=[str(tmp_path)], bpe_merges=20, gamma=0.5)
    files = cfg.input_files()
    assert sorted(p.rsplit("/", 1)[-1] for p in files) == ["cbtest_CN_extra.txt", "cbtest_NE_synthetic.txt",
                                                           "toy.answer", "toy.doc_query"]
    done = prepare_in_memory(TASK, files_table(files), cfg)
    rejected = {(r["doc_id"], r["reason"]) for r in done.rejected()}
    assert rejected == {("cbtest_CN_extra/0", "line 21: answer 'nowhere' is not among the candidates"),
                        ("toy/qid_1", "answer '己' does not occur in the document")}
    rows = done.rows()
    assert len(rows) == 60 + 1 + 1 and done.split_rule == "hash"
    assert {len(done.splits[s]) for s in ("train", "valid", "test")} != {0}
    toy = next(r for r in rows if r["doc_id"] == "toy/qid_0")
    assert toy["candidates"] == ["甲", "乙", "丙", "。"] and toy["answer_index"] == 0
    assert collate_questions([toy], done.preprocessor.spec).answer_oov == [True]
    assert toy["candidate_of_token"] == [0, 1, 2, 3] and toy["doc_in_query"] == [0, 1, 1, 1]
    assert len(toy["doc_subword_lengths"]) == 4 and sum(toy["doc_subword_lengths"]) == len(toy["doc_subword_ids"])
    assert toy["answer_class"] == "other"
    synthetic = [r for r in rows if r["doc_id"].startswith("cbtest_NE_synthetic/")]
    assert all(len(r["candidates"]) == 10 and r["answer_class"] == "named_entity" for r in synthetic)
    again = prepare_in_memory(TASK, files_table(files), cfg)  # deterministic
    assert again.rows() == rows and again.preprocessor.to_json() == done.preprocessor.to_json()
    assert done.preprocessor.subwords.num_merges == 20


def test_named_splits_keep_the_file_split(tmp_path):
    (tmp_path / "cbtest_NE_train.txt").write_text(synthetic_cbt_text(6, seed=1), encoding="utf-8")
    (tmp_path / "cbtest_NE_test.txt").write_text(synthetic_cbt_text(3, seed=2), encoding="utf-8")
    cfg = ClozeDataConfig(inputs=[str(tmp_path)], bpe_merges=5, named_splits=True)
    done = prepare_in_memory(TASK, files_table(cfg.input_files()), cfg)
    assert {s: len(r) for s, r in done.splits.items()} == {"train": 6, "valid": 0, "test": 3}
    assert done.split_rule == "named"  # CBT's "_"-separated names, not the generic "." rule (which finds none)


def _write_cmrc(folder, name: str, questions: int) -> None:
    """A CMRC-2017 ``<name>.doc_query`` + ``<name>.answer`` pair, one answerable question per document."""
    lines = [f"1 ||| w{i} 在 家 。\n2 ||| 他 说 w{i} 。\n<qid_{i}> ||| XXXXX 在 家 。\n" for i in range(questions)]
    (folder / f"{name}.doc_query").write_text("".join(lines), encoding="utf-8")
    (folder / f"{name}.answer").write_text("".join(f"<qid_{i}> ||| w{i}\n" for i in range(questions)), encoding="utf-8")


def test_cmrc_files_that_name_one_split_are_hashed_and_the_manifest_says_hash(tmp_path):
    """CMRC-2017's files all say ``valid``: without data.named_splits its questions are split by a
    hash of their doc_id (seeded), and the manifest and the prepare table record ``hash``, not
    ``named`` (what the "." in cloze.valid.doc_query alone would say)."""
    (tmp_path / "in").mkdir()
    _write_cmrc(tmp_path / "in", "cloze.valid", 12)
    logged: list[str] = []
    cfg = ClozeDataConfig(inputs=[str(tmp_path / "in")], output_root=str(tmp_path / "out"), bpe_merges=5, split_seed=3)
    data = prepare_local(cfg, task="cloze", log=logged.append)
    assert data.manifest["split_rule"] == "hash"
    assert any(line.startswith("split rule") and "hash: unsplit inputs" in line
               for text in logged for line in text.splitlines())
    ids = {split: [row["doc_id"] for row in data.iter_rows(split)] for split in ("train", "valid", "test")}
    assert ids == {"train": [f"cloze.valid/qid_{i}" for i in (0, 10, 11, 3, 4, 6, 7, 8)],  # sorted by doc_id
                   "valid": ["cloze.valid/qid_5", "cloze.valid/qid_9"], "test": ["cloze.valid/qid_1", "cloze.valid/qid_2"]}

    _write_cmrc(tmp_path / "in", "cloze.train", 4)  # with named_splits the names are kept, and said
    named = prepare_local(cfg.replace(named_splits=True), task="cloze", log=logged.append)
    assert named.manifest["split_rule"] == "named"
    assert {split: named.num_documents(split) for split in ("train", "valid", "test")} == {"train": 4, "valid": 12, "test": 0}


def test_metrics_all_reduce_round_trip():
    metrics = ClozeMetrics()
    log_p = torch.log(torch.tensor([[0.7, 0.3], [0.2, 0.8], [0.6, 0.4], [0.5, 0.5]]))
    metrics.update(log_p, torch.tensor([0, 0, 1, -1]), [True, True, False, False],
                   ["named_entity", "common_noun", "common_noun", ""])
    out = metrics.compute()
    assert (out["questions"], out["oov_questions"], out["named_entity_questions"], out["common_noun_questions"]) == (3, 2, 1, 2)
    assert math.isclose(out["accuracy"], 1 / 3) and math.isclose(out["error"], 2 / 3)
    assert out["oov_accuracy"] == 0.5 and out["named_entity_accuracy"] == 1.0 and out["common_noun_accuracy"] == 0.0
    assert math.isclose(out["loss"], -(math.log(0.7) + math.log(0.2) + math.log(0.4)) / 3, rel_tol=1e-6)
    assert math.isnan(out["verb_accuracy"])
    assert ClozeMetrics.from_tensor(metrics.as_tensor()).compute() == pytest.approx(out, nan_ok=True)
    assert ClozeMetrics.from_metrics(out).compute() == pytest.approx(out, nan_ok=True)
    assert "answer out of vocabulary" in TASK.metric_table(out, "t") and "answer class named_entity" in TASK.metric_table(out, "t")


def _trained(tmp_path, embedding: str, epochs: int):
    torch.manual_seed(0)
    write_synthetic_cbt(tmp_path, 300, seed=5)
    cfg = ClozeDataConfig(inputs=[str(tmp_path)], bpe_merges=40, gamma=0.3)
    done = prepare_in_memory(TASK, files_table(cfg.input_files()), cfg)
    spec = done.preprocessor.spec
    model = TASK.build_model(GAReaderConfig(embedding=embedding, embed_dim=24, subword_dim=12, hidden_size=24), spec)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005)
    for epoch in range(epochs):
        for batch in TASK.batches(done.splits["train"], spec, 16, seed=epoch):
            train_step(TASK, model, batch, optimizer, TRAIN)
    return done, model


def test_word_plus_subword_reader_learns_far_above_chance(tmp_path):
    done, model = _trained(tmp_path, "word+subword", epochs=2)
    spec = done.preprocessor.spec
    held_out = done.splits["valid"] + done.splits["test"]
    metrics = TASK.evaluate(model, TASK.batches(held_out, spec, 32, seed=None))
    assert metrics["questions"] == len(held_out) >= 60
    assert metrics["accuracy"] > 0.6, metrics["accuracy"]  # chance: 1 of 10 candidates
    assert metrics["oov_questions"] > 0 and metrics["oov_accuracy"] > 0.5


def test_served_model_answers_questions_and_refuses_bad_ones(tmp_path):
    done, model = _trained(tmp_path, "word+subword", epochs=1)
    block = synthetic_cbt_text(1, seed=77).splitlines()
    document = " ".join(line.split(" ", 1)[1] for line in block[:20])
    query, answer, _, candidates = block[20].split(" ", 1)[1].split("\t")
    request = {"document": [document, document], "query": [query, query], "candidates": [candidates.split("|"), None]}
    rows = TASK.serve(model, model.cfg, done.preprocessor.spec, done.preprocessor, request)
    assert [r["row"] for r in rows] == [0, 1]
    assert rows[0]["answer"] in candidates.split("|") and rows[1]["answer"] in document.split()
    assert all(0.0 < r["probability"] <= 1.0 for r in rows)
    for bad, reason in [({"document": [""], "query": ["x"]}, "'document' must be non-empty"),
                        ({"document": ["a b"]}, "'query' must be non-empty"),
                        ({"document": ["a b"], "query": ["XXXXX b"], "candidates": [["z"]]}, "no candidate occurs"),
                        ({"text": ["a"]}, "unknown input column")]:
        with pytest.raises(InputError, match=reason):
            TASK.serve(model, model.cfg, done.preprocessor.spec, done.preprocessor, bad)


def test_another_gamma_shares_the_encoding_and_moves_the_oov_flags(tmp_path):
    write_synthetic_cbt(tmp_path, 40, seed=6)
    cfg = ClozeDataConfig(inputs=[str(tmp_path)], bpe_merges=10, gamma=1.0)
    other = cfg.replace(gamma=0.1)
    assert cfg.encoding_hash() == other.encoding_hash() and cfg.data_hash() != other.data_hash()
    done = prepare_in_memory(TASK, files_table(cfg.input_files()), cfg)
    derived = TASK.derive_preprocessor(done.preprocessor, other)
    direct = prepare_in_memory(TASK, files_table(cfg.input_files()), other)
    assert derived.to_json() == direct.preprocessor.to_json() and direct.rows() == done.rows()
    rows = done.splits["train"]
    assert sum(collate_questions(rows, done.preprocessor.spec).answer_oov) == 0  # gamma 1: every train word listed
    assert sum(collate_questions(rows, derived.spec).answer_oov) > 0


def test_real_cmrc_cloze_set_is_split_by_document(cmrc_dir):
    files = [cmrc_dir / "cloze.valid.doc_query.gz", cmrc_dir / "cloze.valid.answer"]
    cfg = ClozeDataConfig(inputs=[str(p) for p in files], bpe_merges=200, gamma=0.9)
    done = prepare_in_memory(TASK, files_table(files), cfg)
    sizes = {split: len(rows) for split, rows in done.splits.items()}
    assert done.rejected() == [] and sum(sizes.values()) == 2000
    assert 1300 < sizes["train"] < 1500 and 120 < sizes["valid"] < 280 and 320 < sizes["test"] < 480
    first = next(r for r in done.rows() if r["doc_id"] == "cloze.valid/qid_0")
    assert first["candidates"][first["answer_index"]] == "啄木鸟" and "XXXXX" not in first["candidates"]
    assert done.preprocessor.subwords.num_merges == 200
