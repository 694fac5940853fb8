"""BPE: exact merge counts (0 / 10 / 1000), word-internal subwords, clear error past the maximum."""

from __future__ import annotations

import random

import pytest

from dynlm.data.bpe import SubwordTokenizer
from dynlm.vocab_spec import SPECIAL_WORDS


def generated_words(num_words: int, seed: int = 0) -> dict[str, int]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return {"".join(rng.choice(letters) for _ in range(rng.randint(4, 10))): rng.randint(1, 50)
            for _ in range(num_words)}


@pytest.mark.parametrize("num_merges", [0, 10, 1000])
def test_exact_merge_counts(num_merges):
    counts = generated_words(3000)
    tok = SubwordTokenizer.train(counts, num_merges)
    assert tok.num_merges == num_merges
    alphabet = len({ch for w in counts for ch in w})
    assert alphabet == 26
    # specials + alphabet + at most one new subword per merge
    assert len(SPECIAL_WORDS) + alphabet <= tok.vocab_size <= len(SPECIAL_WORDS) + alphabet + num_merges
    if num_merges == 0:
        assert tok.subwords("hello") == ["h", "e", "l", "l", "o"]
    reloaded = SubwordTokenizer.from_json(tok.to_json())
    words = sorted(counts)[:200]
    assert reloaded.num_merges == num_merges
    assert reloaded.encode_words(words) == tok.encode_words(words)


def test_known_segmentation_and_specials():
    counts = {"lower": 5, "lowest": 3, "newer": 6, "wider": 2}
    tok = SubwordTokenizer.train(counts, 3, special_tokens=[*SPECIAL_WORDS, "<unk1>"])
    # most frequent pairs first: (w,e) 14, (we,r) 11, then (l,o) 8 (tied with (o,we) 8)
    assert tok.subwords("newer") == ["n", "e", "wer"]
    assert tok.subwords("lowest") == ["lo", "we", "s", "t"]
    assert tok.encode_words(["<bos>", "<unk1>", "q"]) == [[2], [4], [1]]  # unknown character -> <unk>
    # subwords never cross a word boundary: "ab" and "cd" allow 2 merges, never "bc"
    assert SubwordTokenizer.train({"ab": 100, "cd": 100}, 2).subwords("abcd") == ["ab", "cd"]
    with pytest.raises(ValueError, match="at most 2 BPE merges"):
        SubwordTokenizer.train({"ab": 100, "cd": 100}, 3)


def test_too_many_merges_names_the_maximum():
    with pytest.raises(ValueError, match=r"supports at most 13 BPE merges, 100 were asked"):
        SubwordTokenizer.train({"lower": 5, "lowest": 3, "newer": 6, "wider": 2}, 100)
    with pytest.raises(ValueError, match="whitespace"):
        SubwordTokenizer.train({"a b": 1}, 0)


def test_the_trainer_sees_the_counts_however_they_are_cut(monkeypatch):
    """A word's repetitions split over several strings and batches (bounded memory for any
    count) give the merges of one string per word type."""
    from dynlm.data import bpe

    counts = {"lower": 700, "lowest": 300, "newer": 650, "wider": 120, "new": 90, "the": 5000}
    whole = bpe._train_merges(counts, ["<pad>"], 40)
    monkeypatch.setattr(bpe, "_BATCH_CHARS", 64)  # "the " 16 times a string, 4 strings a batch
    batches = list(bpe._word_batches(counts))
    assert len(batches) > 10 and max(len(s) for b in batches for s in b) <= 64
    assert sum(s.count("the ") for b in batches for s in b) == 5000
    assert bpe._train_merges(counts, ["<pad>"], 40) == whole
