"""Shared helpers for model/batching tests: a tiny VocabSpec and hand-made encoded rows."""

from __future__ import annotations

import pytest

from dynlm.vocab_spec import VocabSpec

TINY_SPEC = VocabSpec(num_words=20, num_entities=3, shortlist_size=15, num_subwords=12)


def subwords_of(word_id: int, spec: VocabSpec = TINY_SPEC) -> list[int]:
    """A deterministic 1-3 unit segmentation of a word id (ids in [1, num_subwords))."""
    if word_id >= spec.num_words or word_id < 4:  # entities / specials: one special unit
        return [1]
    return [2 + (word_id + k) % (spec.num_subwords - 2) for k in range(1 + word_id % 3)]


def make_row(doc_id: str, sentences: list[list[int]], spec: VocabSpec = TINY_SPEC) -> dict:
    """An ENCODED_SCHEMA row from sentences of word ids (without <bos>/<eos>; added here)."""
    word_ids, entity_ids, sub_ids, sub_lengths, lengths = [], [], [], [], []
    for sentence in sentences:
        full = [spec.bos_id, *sentence, spec.eos_id]
        lengths.append(len(full))
        for w in full:
            word_ids.append(w)
            entity_ids.append(w - spec.num_words + 1 if w >= spec.num_words else 0)
            units = subwords_of(w, spec)
            sub_ids.extend(units)
            sub_lengths.append(len(units))
    return {
        "doc_id": doc_id, "source_file": "test", "num_tokens": len(word_ids), "sentence_lengths": lengths,
        "word_ids": word_ids, "entity_ids": entity_ids, "subword_ids": sub_ids, "subword_lengths": sub_lengths,
    }


def random_rows(num_docs: int, seed: int = 0, spec: VocabSpec = TINY_SPEC, max_sentences: int = 5) -> list[dict]:
    """Random documents (1..max_sentences sentences of 1..8 tokens, some entity mentions, numbered
    in order of first appearance as anonymized documents are)."""
    import random

    rng = random.Random(seed)
    rows = []
    for d in range(num_docs):
        sentences = []
        for _ in range(rng.randint(1, max_sentences)):
            sentence = [rng.randrange(4, spec.output_size) for _ in range(rng.randint(1, 8))]
            sentences.append(sentence)
        rows.append(make_row(f"doc{d}", _in_first_appearance_order(sentences, spec), spec))
    return rows


def _in_first_appearance_order(sentences: list[list[int]], spec: VocabSpec) -> list[list[int]]:
    """Entity ids renumbered as anonymization numbers chains: <unk1> first, then <unk2>, ..."""
    order: dict[int, int] = {}
    renumbered = []
    for sentence in sentences:
        renumbered.append([w if w < spec.num_words else spec.num_words + order.setdefault(w, len(order))
                           for w in sentence])
    return renumbered


@pytest.fixture
def tiny_spec() -> VocabSpec:
    """20 words (short list 15), 3 entity identifiers (ids 20..22), 12 subwords."""
    return TINY_SPEC


@pytest.fixture(name="make_row")
def make_row_fixture():
    """``make_row(doc_id, sentences_of_word_ids) -> encoded row`` over TINY_SPEC."""
    return make_row


@pytest.fixture(name="random_rows")
def random_rows_fixture():
    """``random_rows(num_docs, seed=0) -> list of encoded rows`` over TINY_SPEC."""
    return random_rows
