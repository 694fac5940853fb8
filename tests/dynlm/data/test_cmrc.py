"""CMRC-2017 reader: generated files in the upstream format, malformed questions quarantined,
and the real validation sets (skipped when ../shared/data is absent)."""

from __future__ import annotations

import gzip

from dynlm.data.cmrc import answer_path, parse_answers, parse_cmrc, set_name
from dynlm.data.schema import Quarantined

DOC_QUERY = """\
1 ||| 小 猫 在 河边 钓鱼 。
2 ||| XXXXX 看见 一 条 大 鱼 。
<qid_0> ||| XXXXX 看见 一 条 大 鱼 。
1 ||| 兔子 跑 得 很 快 。
<qid_1> ||| 谁 跑 得 很 快 ？
"""
ANSWERS = "<qid_0> ||| 小猫\n<qid_1> ||| 兔子\n"


def _parse(text: str, answers: str = ANSWERS, name: str = "toy.valid.doc_query"):
    table, bad = parse_answers(answers.encode(), "toy.valid.answer")
    assert bad == []
    return list(parse_cmrc(text.encode(), name, table))


def test_questions_are_read_with_their_documents_and_answers():
    first, second = _parse(DOC_QUERY)
    assert first == {"doc_id": "toy.valid/qid_0", "line": 3, "document": "小 猫 在 河边 钓鱼 。 XXXXX 看见 一 条 大 鱼 。".split(),
                     "query": "XXXXX 看见 一 条 大 鱼 。".split(), "answer": "小猫", "candidates": [], "answer_class": "other"}
    assert second["doc_id"] == "toy.valid/qid_1" and second["document"] == "兔子 跑 得 很 快 。".split()
    assert second["answer"] == "兔子" and second["line"] == 5


def test_gzip_is_read_like_the_plain_file():
    assert _parse(DOC_QUERY) == list(parse_cmrc(gzip.compress(DOC_QUERY.encode()), "toy.valid.doc_query",
                                                parse_answers(ANSWERS.encode(), "a")[0]))


def test_malformed_questions_are_quarantined_and_the_rest_goes_on():
    text = ("1 ||| 甲 乙 。\n3 ||| 丙 。\n<qid_0> ||| XXXXX 乙 。\n"       # sentence 3 follows 1
            "1 ||| 丁 戊 。\nno separator here\n<qid_1> ||| XXXXX 戊 。\n"  # a line without |||
            "1 ||| 己 庚 。\n<qid_2> ||| XXXXX 庚 。\n"                      # no answer line
            "<qid_3> ||| XXXXX 辛 。\n"                                      # no sentences
            "1 ||| 壬 癸 。\n<qid_4> ||| XXXXX 癸 。\n"                      # fine
            "1 ||| 子 丑 。\n")                                              # no query at the end
    records = _parse(text, answers="<qid_0> ||| 甲\n<qid_1> ||| 丁\n<qid_3> ||| 辛\n<qid_4> ||| 壬\n")
    good = [r for r in records if isinstance(r, dict)]
    bad = [(r.doc_id, r.line, r.reason) for r in records if isinstance(r, Quarantined)]
    assert [r["doc_id"] for r in good] == ["toy.valid/qid_4"]
    assert bad == [("toy.valid/qid_0", 2, "line 2: sentence 3 follows sentence 1"),
                   ("toy.valid/qid_1", 5, "line 5 has no ' ||| ' separator: 'no separator here'"),
                   ("toy.valid/qid_2", 8, "no answer for qid_2 in toy.valid.answer"),
                   ("toy.valid/qid_3", 9, "query without document sentences"),
                   ("toy.valid/<end>", 0, "document at the end of the file has no query")]


def test_invalid_utf8_quarantines_only_its_document():
    data = DOC_QUERY.encode().replace("钓鱼".encode(), b"\xff\xfe")
    records = list(parse_cmrc(data, "toy.valid.doc_query", parse_answers(ANSWERS.encode(), "a")[0]))
    assert isinstance(records[0], Quarantined) and records[0].line == 1 and "invalid UTF-8" in records[0].reason
    assert records[1]["doc_id"] == "toy.valid/qid_1"


def test_malformed_answer_lines_are_reported():
    answers, bad = parse_answers("<qid_0> ||| 小猫\nqid_1 小狗\n<qid_2> ||| two words\n".encode(), "x.answer")
    assert answers == {"qid_0": "小猫"} and [q.line for q in bad] == [2, 3]


def test_file_names():
    assert answer_path("d/cloze.valid.doc_query.gz") == "d/cloze.valid.answer"
    assert set_name("d/user.valid.doc_query") == "user.valid" == set_name("user.valid.answer")


def test_real_validation_sets_read_without_quarantine(cmrc_dir):
    for name in ("cloze.valid", "user.valid"):
        answers, bad = parse_answers((cmrc_dir / f"{name}.answer").read_bytes(), f"{name}.answer")
        assert bad == [] and len(answers) == 2000
        path = cmrc_dir / f"{name}.doc_query.gz"
        records = list(parse_cmrc(path.read_bytes(), str(path), answers))
        assert len(records) == 2000 and all(isinstance(r, dict) for r in records)
        assert records[0]["doc_id"] == f"{name}/qid_0"
        assert all(r["answer"] in r["document"] for r in records)  # every answer can be pointed at
    cloze = next(parse_cmrc((cmrc_dir / "cloze.valid.doc_query.gz").read_bytes(), "cloze.valid.doc_query.gz",
                            parse_answers((cmrc_dir / "cloze.valid.answer").read_bytes(), "a")[0]))
    assert cloze["answer"] == "啄木鸟" and "XXXXX" in cloze["query"]
