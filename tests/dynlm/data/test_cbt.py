"""CBT reader: a generated 21-line block, malformed blocks quarantined, the six real samples."""

from __future__ import annotations

from dynlm.data.cbt import file_class, is_cbt, parse_cbt
from dynlm.data.schema import Quarantined


def _block(query: str = "the cat saw XXXXX .", answer: str = "ann", candidates: str = "ann|bob|cat") -> str:
    context = "".join(f"{i} ann met bob number{i} .\n" for i in range(1, 21))
    return f"{context}21 {query}\t{answer}\t\t{candidates}\n\n"


def test_a_block_is_one_question():
    (question,) = parse_cbt(_block().encode(), "data/cbtest_NE_train.txt")
    assert question["doc_id"] == "cbtest_NE_train/0" and question["line"] == 1
    assert question["document"][:6] == ["ann", "met", "bob", "number1", ".", "ann"] and len(question["document"]) == 100
    assert question["query"] == ["the", "cat", "saw", "XXXXX", "."]
    assert question["answer"] == "ann" and question["candidates"] == ["ann", "bob", "cat"]
    assert question["answer_class"] == "named_entity"


def test_malformed_blocks_are_quarantined_and_the_rest_goes_on():
    short = "".join(f"{i} a b .\n" for i in range(1, 20)) + "20 a .\n\n"
    renumbered = _block().replace("7 ann", "8 ann", 1)
    blocks = [_block(), short, renumbered, _block(answer="zed"), _block(query="no blank ."),
              _block(candidates=""), _block().replace("\t\t", "\t"), _block()]
    records = list(parse_cbt("".join(blocks).encode(), "cbtest_CN_valid.txt"))
    assert [r["doc_id"] for r in records if isinstance(r, dict)] == ["cbtest_CN_valid/0", "cbtest_CN_valid/7"]
    reasons = [(r.doc_id, r.reason) for r in records if isinstance(r, Quarantined)]
    assert reasons == [
        ("cbtest_CN_valid/1", "block has 20 lines, a question has 21"),
        ("cbtest_CN_valid/2", "line 50: numbered '8', expected 7"),
        ("cbtest_CN_valid/3", "line 86: answer 'zed' is not among the candidates"),
        ("cbtest_CN_valid/4", "line 108: query has no XXXXX blank"),
        ("cbtest_CN_valid/5", "line 130: no candidate"),
        ("cbtest_CN_valid/6", "line 152: query line is not 'query<TAB>answer<TAB><TAB>candidates'"),
    ]


def test_invalid_utf8_quarantines_its_block():
    data = _block().encode() + _block().encode().replace(b"number3", b"\xffnumber3")
    first, second = parse_cbt(data, "cbtest_P_test.txt")
    assert first["answer_class"] == "preposition"
    assert isinstance(second, Quarantined) and second.line == 23 and "invalid UTF-8" in second.reason


def test_file_names():
    assert is_cbt("x/cbtest_CN_train.txt") and not is_cbt("x/cloze.valid.answer")
    assert [file_class(f"cbtest_{c}_x.txt") for c in ("NE", "CN", "V", "P", "XX")] == [
        "named_entity", "common_noun", "verb", "preposition", "other"]


def test_real_samples(cbt_dir):
    expected = {"cbtest_CN_train.txt": "queen", "cbtest_NE_valid_2000ex.txt": "Chuck"}
    files = sorted(cbt_dir.glob("cbtest_*.txt"))
    assert len(files) == 6
    for path in files:
        (question,) = parse_cbt(path.read_bytes(), str(path))
        assert len(question["candidates"]) == 10 and question["answer"] in question["candidates"]
        assert question["answer"] in question["document"] and "XXXXX" in question["query"]
        assert question["answer"] == expected.get(path.name, question["answer"])
