"""The cloze builder: answerable, deterministic, classes, CBT round trip, split by document."""

from __future__ import annotations

import pyarrow as pa

from dynlm.data.cbt import parse_cbt
from dynlm.data.cloze_builder import (
    build_questions,
    cbt_block,
    cbt_files,
    questions_table,
)


def _sentences(n: int) -> list[list[str]]:
    names = ["<unk1>", "<unk2>", "<unk3>"]
    return [[names[i % 3], "carried", f"lantern{i % 4}", "across", "the", "bridge", "."] for i in range(n)]


def test_every_answer_is_answerable_and_the_blank_is_where_it_was():
    sentences = _sentences(63)
    questions = build_questions("doc", sentences)
    assert [q["doc_id"] for q in questions] == ["doc#0", "doc#1", "doc#2"]  # 3 windows of 21
    for window, q in enumerate(questions):
        original = [t.replace("<unk", "@entity").rstrip(">") for t in sentences[21 * window + 20]]
        assert q["query"].count("XXXXX") == 1
        position = q["query"].index("XXXXX")
        assert original[position] == q["answer"] and q["query"][:position] == original[:position]
        assert q["answer"] in {t for s in q["context"] for t in s}  # answerable
        assert q["answer"] in q["candidates"] and q["candidates"] == sorted(q["candidates"])
        assert q["answer_class"] == "NE" and q["answer"].startswith("@entity")  # gold mention preferred


def test_without_entities_a_content_word_is_blanked():
    sentences = [["The", "miller", "ground", "the", "grain", "."]] * 21
    (question,) = build_questions("d", sentences)
    assert question["answer_class"] == "W" and question["answer"] in {"miller", "ground", "grain"}
    assert "The" not in question["candidates"] and "." not in question["candidates"]


def test_deterministic_by_seed_and_independent_of_other_documents():
    one = build_questions("a", _sentences(42), seed=1)
    assert one == build_questions("a", _sentences(42), seed=1)
    plain = [["The", "miller", "ground", "the", "grain", "."]] * 42
    seeds = {tuple(q["query"].index("XXXXX") for q in build_questions("a", plain, seed=s)) for s in range(8)}
    assert len(seeds) > 1  # the seed picks the blank
    parsed = pa.table({"kind": ["document", "quarantine", "document"], "doc_id": ["a", "x", "b"],
                       "sentences": [_sentences(42), [], _sentences(21)]})
    table = questions_table(parsed, seed=1)
    again = questions_table(parsed.take([2, 1, 0]), seed=1)  # another order of the documents
    assert cbt_files(table) == cbt_files(again)
    assert table.num_rows == 3 and len(set(zip(table["doc_id"].to_pylist(), table["split"].to_pylist()))) == 3
    splits = {}
    for doc_id, split in zip(table["doc_id"].to_pylist(), table["split"].to_pylist()):
        splits.setdefault(doc_id.split("#")[0], set()).add(split)
    assert all(len(s) == 1 for s in splits.values())  # a document's questions share its split


def test_blocks_read_back_with_the_cbt_reader():
    questions = build_questions("doc", _sentences(42))
    text = "".join(cbt_block(q) for q in questions)
    read = list(parse_cbt(text.encode(), "cbtest_NE_train.txt"))
    assert [(r["answer"], r["candidates"], r["query"]) for r in read] == [
        (q["answer"], q["candidates"], q["query"]) for q in questions]
