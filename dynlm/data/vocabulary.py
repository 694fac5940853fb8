"""Word vocabulary of the output space and the input short list (Zhang et al., 2018 "SAW").

Id layout (see dynlm/vocab_spec.py): the specials ``<pad> <unk> <bos> <eos>`` (ids 0-3), then the
``vocab_size`` most frequent words of the train split, most frequent first (ties broken by the
word itself, so the order is deterministic). Entity identifiers come after ``num_words`` and are
not part of this class.

Short list: the most frequent ``ceil(gamma * len(words))`` words keep their own input embedding;
``shortlist_size`` counts the 4 specials too, so input ids ``< shortlist_size`` are embedded.
"""

from __future__ import annotations

import math
from collections import Counter

from dynlm.vocab_spec import SPECIAL_WORDS, UNK_ID


def shortlist_count(num_words: int, gamma: float) -> int:
    """ceil(gamma * num_words), robust to float noise (0.7 * 10 is 7, not 8)."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    return min(num_words, math.ceil(round(gamma * num_words, 9)))


class Vocabulary:
    """Words of the output space, most frequent first, after the specials.

    Args:
        words: the vocabulary words (no specials), most frequent first.
        shortlist_size: number of input ids with their own embedding, specials included.
    """

    def __init__(self, words: list[str], shortlist_size: int):
        duplicates = {w for w, n in Counter(words).items() if n > 1}
        if duplicates:
            raise ValueError(f"duplicate vocabulary words: {sorted(duplicates)[:5]}")
        specials = set(SPECIAL_WORDS) & set(words)
        if specials:
            raise ValueError(f"special tokens {sorted(specials)} cannot be vocabulary words")
        if not len(SPECIAL_WORDS) <= shortlist_size <= len(SPECIAL_WORDS) + len(words):
            raise ValueError(
                f"shortlist_size {shortlist_size} must be between {len(SPECIAL_WORDS)} and "
                f"{len(SPECIAL_WORDS) + len(words)}"
            )
        self.words = list(words)
        self.shortlist_size = shortlist_size
        self.itos = list(SPECIAL_WORDS) + self.words
        self.stoi = {word: i for i, word in enumerate(self.itos)}

    @classmethod
    def from_counts(cls, counts: dict[str, int], vocab_size: int, gamma: float) -> "Vocabulary":
        """Keep the ``vocab_size`` most frequent words (ties by word); specials in counts are skipped.

        Args:
            counts: word -> count in the train split (entity tokens excluded by the caller).
            vocab_size: most words kept (fewer when the corpus has fewer types).
            gamma: short-list fraction of the kept words (ceil).

        Returns:
            The vocabulary.
        """
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        ranked = sorted(
            ((word, count) for word, count in counts.items() if word not in SPECIAL_WORDS and count > 0),
            key=lambda item: (-item[1], item[0]),
        )
        words = [word for word, _ in ranked[:vocab_size]]
        return cls(words, len(SPECIAL_WORDS) + shortlist_count(len(words), gamma))

    @property
    def num_words(self) -> int:
        """Specials + words (the start of the entity id range)."""
        return len(self.itos)

    def id(self, word: str) -> int:
        """Id of ``word``; ``<unk>`` (1) for words outside the vocabulary."""
        return self.stoi.get(word, UNK_ID)

    def __contains__(self, word: str) -> bool:
        return word in self.stoi

    def __len__(self) -> int:
        return len(self.itos)

    def to_dict(self) -> dict:
        return {"words": self.words, "shortlist_size": self.shortlist_size}

    @classmethod
    def from_dict(cls, data: dict) -> "Vocabulary":
        unknown = set(data) - {"words", "shortlist_size"}
        if unknown:
            raise ValueError(f"Vocabulary.from_dict: unknown keys {sorted(unknown)}")
        return cls(list(data["words"]), int(data["shortlist_size"]))
