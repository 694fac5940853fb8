"""Plain-text reader: WikiText headings, lines_per_document chunks, gzip, bad input."""

from __future__ import annotations

import gzip
from pathlib import Path

from dynlm.data.plaintext import parse_text
from dynlm.data.readers import parse_file
from dynlm.data.schema import Quarantined

WIKI = """ 
 = First Article = 
 
 The cat sat . 
 = = Section = = 
 It slept <unk> . 
 
 = Second = 
 One more line . 
"""


def test_wikitext_headings_start_documents():
    docs = list(parse_text(WIKI, "wiki.train.tokens"))
    assert docs == [
        {"doc_id": "wiki.train.tokens/doc_0", "source_file": "wiki.train.tokens", "mentions": [],
         "sentences": [["=", "First", "Article", "="], ["The", "cat", "sat", "."],
                       ["=", "=", "Section", "=", "="], ["It", "slept", "<unk>", "."]]},
        {"doc_id": "wiki.train.tokens/doc_1", "source_file": "wiki.train.tokens", "mentions": [],
         "sentences": [["=", "Second", "="], ["One", "more", "line", "."]]},
    ]


def test_lines_per_document_chunks_ptb_style():
    text = "a b\nc\n\nd e f\ng\nh\n"
    docs = list(parse_file(gzip.compress(text.encode()), "ptb.train.txt.gz", lines_per_document=2))
    assert [d["doc_id"] for d in docs] == ["ptb.train.txt/doc_0", "ptb.train.txt/doc_1", "ptb.train.txt/doc_2"]
    assert [d["sentences"] for d in docs] == [[["a", "b"], ["c"]], [["d", "e", "f"], ["g"]], [["h"]]]
    (whole,) = parse_file(text.encode(), "ptb.txt")  # 0: one document
    assert len(whole["sentences"]) == 5


def test_bad_utf8_quarantines_only_its_article():
    data = WIKI.encode().replace(b"It slept", b"It sl\xe9pt")
    items = list(parse_file(data, "w.txt"))
    assert isinstance(items[0], Quarantined)
    assert (items[0].doc_id, items[0].line) == ("w.txt/doc_0", 6)
    assert "invalid UTF-8" in items[0].reason
    assert items[1]["doc_id"] == "w.txt/doc_1" and items[1]["sentences"][0] == ["=", "Second", "="]


def test_empty_text_file_is_quarantined():
    (item,) = parse_file(b"\n \n", "empty.txt")
    assert isinstance(item, Quarantined) and item.reason.startswith("empty document")


def test_wikitext2_train(wikitext_dir: Path):
    data = (wikitext_dir / "train.txt.gz").read_bytes()
    assert gzip.decompress(data).count(b"\n") == 36_718
    docs = list(parse_file(data, "train.txt.gz"))
    assert not [d for d in docs if isinstance(d, Quarantined)]
    assert len(docs) == 629  # level-1 " = Title = " headings = articles
    assert all(d["sentences"][0][0] == "=" for d in docs)
    # every non-empty line is a sentence: 2,088,628 tokens incl. one <eos> per line (SOURCE.md)
    num_tokens = sum(len(s) for d in docs for s in d["sentences"])
    assert num_tokens == 2_088_628 - 36_718
