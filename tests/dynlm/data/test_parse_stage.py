"""The LM parse stage's document cuts: ``data.max_sentence_tokens`` and ``data.max_document_sentences``."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from dynlm.data.config import DataConfig
from dynlm.data.parse_stage import parse_files, shorten_document
from dynlm.data.schema import DOCUMENT_SCHEMA


def _parquet_input(documents: list[dict], path: str) -> pa.Table:
    """The ``{bytes, path}`` batch of one Parquet input file holding ``documents``."""
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(documents, schema=DOCUMENT_SCHEMA), sink)
    return pa.table({"bytes": [sink.getvalue()], "path": [path]})


def test_shorten_document_cuts_long_sentences_then_keeps_the_first_ones():
    sentences = [list("abcde"), list("xy"), list("pqrstu")]
    assert shorten_document(sentences, max_sentence_tokens=2, max_document_sentences=0) == [
        list("ab"), list("cd"), list("e"), list("xy"), list("pq"), list("rs"), list("tu")]
    assert shorten_document(sentences, max_sentence_tokens=2, max_document_sentences=4) == [
        list("ab"), list("cd"), list("e"), list("xy")]
    assert shorten_document(sentences, max_sentence_tokens=0, max_document_sentences=2) == sentences[:2]
    assert shorten_document(sentences, max_sentence_tokens=0, max_document_sentences=0) == sentences


def test_parse_stage_cuts_after_anonymizing_the_whole_document(tmp_path):
    # the chain "anne" has its second mention in the third sentence: it is still a chain of the
    # document (min_chain_mentions 2) when that sentence is cut away
    mention = lambda sentence, start, end: {"sentence": sentence, "start": start, "end": end, "chain": "anne"}  # noqa: E731
    document = {"doc_id": "d1", "source_file": "novel", "mentions": [mention(0, 0, 1), mention(2, 0, 0)],
                "sentences": [["Anne", "Elliot", "walked", "to", "the", "sea", "alone"], ["It", "rained"],
                              ["Anne", "smiled"]]}
    path = str(tmp_path / "corpus" / "train.parquet")
    cfg = DataConfig(inputs=[str(tmp_path / "corpus")], max_chains=5, max_sentence_tokens=4,
                     max_document_sentences=2)
    parsed = parse_files(_parquet_input([document], path), cfg.to_dict()).to_pylist()
    assert [(row["kind"], row["split"]) for row in parsed] == [("document", "train")]
    assert parsed[0]["sentences"] == [["<unk1>", "walked", "to", "the"], ["sea", "alone"]]
    assert parsed[0]["num_sentences"] == 2 and parsed[0]["num_tokens"] == 6
    uncut = parse_files(_parquet_input([document], path), cfg.replace(max_sentence_tokens=0,
                                                                       max_document_sentences=0).to_dict())
    assert uncut.to_pylist()[0]["sentences"][2] == ["<unk1>", "smiled"]
