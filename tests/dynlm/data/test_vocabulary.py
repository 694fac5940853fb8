"""Vocabulary: frequency order with deterministic ties, <unk>, short-list sizes."""

from __future__ import annotations

import pytest

from dynlm.data.vocabulary import Vocabulary, shortlist_count


def test_most_frequent_with_ties_by_word():
    counts = {"b": 3, "a": 3, "c": 5, "d": 1, "e": 1, "<unk>": 100}
    vocab = Vocabulary.from_counts(counts, vocab_size=4, gamma=1.0)
    assert vocab.itos == ["<pad>", "<unk>", "<bos>", "<eos>", "c", "a", "b", "d"]
    assert vocab.id("c") == 4 and vocab.id("e") == 1 and vocab.id("zzz") == 1
    assert vocab.num_words == 8 and vocab.shortlist_size == 8
    assert Vocabulary.from_dict(vocab.to_dict()).itos == vocab.itos


@pytest.mark.parametrize("gamma,expected", [(0.0, 4), (0.1, 5), (0.25, 7), (0.5, 9), (0.7, 11), (0.9, 13), (1.0, 14)])
def test_shortlist_sizes(gamma, expected):
    counts = {f"w{i}": 100 - i for i in range(10)}
    vocab = Vocabulary.from_counts(counts, vocab_size=50, gamma=gamma)
    assert vocab.shortlist_size == expected  # 4 specials + ceil(gamma * 10)
    assert vocab.itos[4:expected] == [f"w{i}" for i in range(expected - 4)]


def test_shortlist_count_and_errors():
    assert shortlist_count(33_278, 0.9) == 29_951
    with pytest.raises(ValueError, match="gamma"):
        shortlist_count(10, 1.5)
    with pytest.raises(ValueError, match="duplicate"):
        Vocabulary(["a", "a"], 4)
