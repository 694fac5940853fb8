"""Anonymization: order of first appearance, nested/crossing rules, max_chains policies."""

from __future__ import annotations

import pytest

from dynlm.data.anonymize import anonymize


def m(sentence, start, end, chain):
    return {"sentence": sentence, "start": start, "end": end, "chain": chain}


def doc(sentences, mentions):
    return {"doc_id": "d", "source_file": "f", "sentences": [s.split() for s in sentences], "mentions": mentions}


def test_order_of_first_appearance_multitoken_and_singletons():
    d = doc(
        ["the old king met Anne Elliot", "Anne smiled at him near Bath"],
        [m(0, 0, 2, "9"), m(0, 4, 5, "3"), m(1, 0, 0, "3"), m(1, 3, 3, "9"), m(1, 5, 5, "7")],
    )
    out, stats = anonymize(d, max_chains=5)
    assert out == {"doc_id": "d", "source_file": "f", "num_chains": 2,
                   "sentences": [["<unk1>", "met", "<unk2>"], ["<unk2>", "smiled", "at", "<unk1>", "near", "Bath"]]}
    assert stats["chains"] == 2 and stats["anonymized_mentions"] == 4
    assert stats["dropped_nested"] == stats["dropped_overlapping"] == 0


def test_nested_outermost_wins_and_crossing_keeps_first():
    d = doc(
        ["his mother saw a b c d", "x y"],
        [m(0, 0, 1, "A"), m(0, 0, 0, "B"), m(0, 3, 5, "C"), m(0, 4, 6, "A"),
         m(1, 0, 0, "B"), m(1, 1, 1, "C"), m(0, 2, 2, "S")],  # S is a singleton: never a conflict
    )
    out, stats = anonymize(d, max_chains=5)
    # "his" (B) is inside "his mother" (A): dropped; "b c d" (A) crosses "a b c" (C): C starts first
    assert out["sentences"] == [["<unk1>", "saw", "<unk2>", "d"], ["<unk3>", "<unk2>"]]
    assert stats["dropped_nested"] == 1 and stats["dropped_overlapping"] == 1
    assert stats["anonymized_mentions"] == 4


def test_min_chain_mentions():
    d = doc(["a b c"], [m(0, 0, 0, "1"), m(0, 2, 2, "1"), m(0, 1, 1, "2")])
    assert anonymize(d, max_chains=3)[0]["sentences"] == [["<unk1>", "b", "<unk1>"]]
    assert anonymize(d, max_chains=3, min_chain_mentions=1)[0]["sentences"] == [["<unk1>", "<unk2>", "<unk1>"]]
    assert anonymize(d, max_chains=3, min_chain_mentions=3)[0]["sentences"] == [["a", "b", "c"]]


def test_too_many_chains_drop_and_truncate():
    d = doc(["a b c a b c"], [m(0, i, i, "abc"[i % 3]) for i in range(6)])
    out, stats = anonymize(d, max_chains=2)
    assert out is None and stats["dropped_docs_too_many_chains"] == 1
    out, stats = anonymize(d, max_chains=2, too_many_chains="truncate")
    assert out["sentences"] == [["<unk1>", "<unk2>", "c", "<unk1>", "<unk2>", "c"]]
    assert out["num_chains"] == 2 and stats["truncated_chains"] == 1


def test_mention_outside_sentence_raises():
    with pytest.raises(ValueError, match="outside its sentence"):
        anonymize(doc(["a b"], [m(0, 1, 2, "x")]), max_chains=3)
    with pytest.raises(ValueError, match="too_many_chains"):
        anonymize(doc(["a"], []), max_chains=3, too_many_chains="keep")
