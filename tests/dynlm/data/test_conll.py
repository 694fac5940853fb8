"""CoNLL readers: exact parses (LitBank 13 columns, OntoNotes last column), one test per bad input."""

from __future__ import annotations

import gzip
from pathlib import Path

from dynlm.data.readers import parse_file
from dynlm.data.schema import Quarantined


def litbank_row(doc: str, index: int, word: str, coref: str = "") -> str:
    return "\t".join([doc, "0", str(index), word] + ["_"] * 8 + [coref])


def litbank(doc: str, sentences: list[list[tuple[str, str]]], part: int = 0) -> str:
    lines = [f"#begin document ({doc}); part {part}"]
    for sentence in sentences:
        lines += [litbank_row(doc, i, w, c) for i, (w, c) in enumerate(sentence)]
        lines.append("")
    lines.append("#end document")
    return "\n".join(lines) + "\n"


def m(sentence, start, end, chain):
    return {"sentence": sentence, "start": start, "end": end, "chain": chain}


def parse(text: str | bytes, name: str = "f.conll", **kw):
    data = text.encode("utf-8") if isinstance(text, str) else text
    return list(parse_file(data, name, **kw))


def test_litbank_nested_joined_multitoken_singleton():
    text = litbank("d", [
        [("Sir", "(0"), ("Walter", ""), ("Elliot", "0)"), ("of", ""), ("Kellynch", "(1"), ("Hall", "1)")],
        [("his", "(0)|(2"), ("own", ""), ("daughter", "2)"), ("Anne", "(3)")],
    ])
    (doc,) = parse(text)
    assert doc == {
        "doc_id": "d/part_0",
        "source_file": "f.conll",
        "sentences": [["Sir", "Walter", "Elliot", "of", "Kellynch", "Hall"], ["his", "own", "daughter", "Anne"]],
        "mentions": [m(0, 0, 2, "0"), m(0, 4, 5, "1"), m(1, 0, 2, "2"), m(1, 0, 0, "0"), m(1, 3, 3, "3")],
    }


def test_overlapping_and_same_chain_nested():
    # chain 5 spans tokens 0-2, chain 6 spans 1-3 (crossing); chain 7 nested twice in itself.
    text = litbank("d", [[("a", "(5|(7"), ("b", "(6|(7)"), ("c", "5)|7)"), ("d", "6)")]])
    (doc,) = parse(text)
    assert doc["mentions"] == [m(0, 0, 2, "5"), m(0, 0, 2, "7"), m(0, 1, 3, "6"), m(0, 1, 1, "7")]


def ontonotes_row(doc, part, index, word, coref, extra=("-",)):
    # 11 fixed columns + predicate-argument columns + coreference, aligned with spaces
    cols = [doc, str(part), str(index), word, "NN", "*", "-", "-", "-", "Speaker#1", "*", *extra, coref]
    return "   ".join(cols)


def test_ontonotes_last_column_multi_part():
    doc = "bc/cnn/00/cnn_0001"
    lines = [f"#begin document ({doc}); part 000",
             ontonotes_row(doc, 0, 0, "Mary", "(12)", ("(ARG0*)", "*")),
             ontonotes_row(doc, 0, 1, "sings", "-", ("(V*)", "*")),
             "",
             ontonotes_row(doc, 0, 0, "She", "(12)|(3"),   # fewer predicate columns in this sentence
             ontonotes_row(doc, 0, 1, "smiles", "3)"),
             "",
             "#end document",
             f"#begin document ({doc}); part 001",
             ontonotes_row(doc, 1, 0, "Bob", "(12)"),
             ontonotes_row(doc, 1, 1, "left", "-"),
             "",
             "#end document"]
    docs = parse("\n".join(lines) + "\n", "cnn_0001.v4_gold_conll")
    assert docs == [
        {"doc_id": f"{doc}/part_0", "source_file": "cnn_0001.v4_gold_conll",
         "sentences": [["Mary", "sings"], ["She", "smiles"]],
         "mentions": [m(0, 0, 0, "12"), m(1, 0, 1, "3"), m(1, 0, 0, "12")]},
        {"doc_id": f"{doc}/part_1", "source_file": "cnn_0001.v4_gold_conll",
         "sentences": [["Bob", "left"]], "mentions": [m(0, 0, 0, "12")]},
    ]


def test_gzip_and_format_detection():
    text = litbank("g", [[("x", "(1)")]])
    assert parse(gzip.compress(text.encode()), "g.conll.gz")[0]["sentences"] == [["x"]]
    # format="text" reads the same bytes as plain text (every line a sentence)
    assert parse(text, format="text")[0]["mentions"] == []


GOOD = litbank("good", [[("fine", "(0)")]])


def only_quarantine(items, good_count=1):
    bad = [x for x in items if isinstance(x, Quarantined)]
    good = [x for x in items if not isinstance(x, Quarantined)]
    assert [g["doc_id"] for g in good] == ["good/part_0"] * good_count  # the rest of the file survives
    assert len(bad) == 1
    return bad[0]


def test_bad_unbalanced_close():
    bad = only_quarantine(parse(litbank("bad", [[("a", "4)")]]) + GOOD))
    assert (bad.doc_id, bad.line) == ("bad/part_0", 2)
    assert "unbalanced" in bad.reason and "4)" in bad.reason


def test_bad_mention_outside_sentence():
    bad = only_quarantine(parse(litbank("bad", [[("a", "(4")], [("b", "4)")]]) + GOOD))
    assert (bad.doc_id, bad.line) == ("bad/part_0", 3)
    assert "outside its sentence" in bad.reason and "chain 4" in bad.reason


def test_bad_unclosed_at_document_end():
    text = "#begin document (bad); part 0\n" + litbank_row("bad", 0, "a", "(4") + "\n#end document\n"
    bad = only_quarantine(parse(text + GOOD))
    assert bad.line == 3 and "not closed" in bad.reason


def test_bad_column_count():
    text = "#begin document (bad); part 0\n" + litbank_row("bad", 0, "a") + "\nbad\t0\t1\tb\t_\n\n#end document\n"
    bad = only_quarantine(parse(text + GOOD))
    assert (bad.doc_id, bad.line) == ("bad/part_0", 3)
    assert "wrong column count: 5 columns" in bad.reason


def test_bad_malformed_mark():
    bad = only_quarantine(parse(litbank("bad", [[("a", "(4x(")]]) + GOOD))
    assert "malformed coreference mark" in bad.reason


def test_bad_invalid_utf8_only_that_document():
    data = GOOD.encode() + litbank("bad", [[("ok", ""), ("caf\x00", "")]]).encode().replace(b"\x00", b"\xff") + GOOD.replace("good", "good2").encode()
    items = parse(data)
    assert [x["doc_id"] for x in items if isinstance(x, dict)] == ["good/part_0", "good2/part_0"]
    (bad,) = [x for x in items if isinstance(x, Quarantined)]
    assert (bad.doc_id, bad.line) == ("bad/part_0", 7)
    assert "invalid UTF-8" in bad.reason


def test_bad_empty_document():
    bad = only_quarantine(parse("#begin document (bad); part 0\n\n#end document\n" + GOOD))
    assert (bad.doc_id, bad.line, bad.reason) == ("bad/part_0", 1, "empty document: no tokens")


def test_bad_missing_end_and_duplicate_id():
    bad = only_quarantine(parse("#begin document (bad); part 0\n" + litbank_row("bad", 0, "a") + "\n" + GOOD))
    assert bad.doc_id == "bad/part_0" and "missing '#end document'" in bad.reason
    items = parse(GOOD + GOOD)
    assert isinstance(items[1], Quarantined) and "duplicate document id" in items[1].reason


def test_litbank_smoke(litbank_dir: Path):
    docs, quarantined = [], []
    for path in sorted(litbank_dir.glob("*.conll")):
        for item in parse_file(path.read_bytes(), str(path)):
            (quarantined if isinstance(item, Quarantined) else docs).append(item)
    assert quarantined == []
    assert len(docs) == 80
    # SOURCE.md totals: 167,959 tokens, 6,859 sentences, 23,304 mentions, 6,278 chains
    assert sum(len(s) for d in docs for s in d["sentences"]) == 167_959
    assert sum(len(d["sentences"]) for d in docs) == 6_859
    assert sum(len(d["mentions"]) for d in docs) == 23_304
    assert sum(len({x["chain"] for x in d["mentions"]}) for d in docs) == 6_278
    persuasion = next(d for d in docs if d["doc_id"] == "105_persuasion_brat/part_0")
    assert persuasion["mentions"][0] == m(0, 2, 4, "0")  # "Sir Walter Elliot"
