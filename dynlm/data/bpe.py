"""BPE subwords of word types with an EXACT number of merges (tokenizers' Rust BPE + BpeTrainer).

Words are whitespace-split tokens; BPE runs inside each word, so a subword never crosses a word
boundary. The subword vocabulary is laid out as::

    special tokens (one subword each: <pad>=0, <unk>, <bos>, <eos>, then the entity tokens <unk1>...)
    the alphabet (every character of the training words, sorted)
    one new subword per merge, in merge order (a merge whose result already exists adds none)

``BpeTrainer`` is driven by a vocabulary size, not a merge count, so :meth:`SubwordTokenizer.train`
computes ``vocab_size = specials + alphabet + merges``, checks the merges of the trained model,
keeps exactly the first ``num_merges`` of them, and raises a clear error when the corpus cannot
support that many (the message gives the maximum).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from dynlm.config import ConfigError
from dynlm.vocab_spec import SPECIAL_WORDS

UNK_SUBWORD = "<unk>"
# characters per batch of the trainer's iterator: tokenizers buffers up to 256 batches ahead of
# its Rust workers, so this bounds what the fit holds (64 KiB: 16 MiB buffered at most)
_BATCH_CHARS = 1 << 16


def _word_batches(word_counts: dict[str, int]) -> Iterator[list[str]]:
    """Each word repeated count times with spaces between, in strings of at most about
    :data:`_BATCH_CHARS` characters, in batches of about that many: the trainer's whitespace
    pre-tokenizer splits and counts them in Rust, so it sees the same word counts as from every
    occurrence fed one by one, at about twice the speed (WikiText-2 train x 16, 33M words:
    11.8 s -> 5.4 s, the same merges). The memory stays bounded whatever the counts: a frequent
    word of a large corpus is split over several strings (256 word types a batch, one string
    each, took the driver of a 64 M-token prepare to 1.5 GB, ``benchmarks/results/scale_cpu.md``)."""
    batch: list[str] = []
    size = 0
    for word, count in word_counts.items():
        unit = len(word) + 1
        per_string = max(1, _BATCH_CHARS // unit)
        while count > 0:
            repeats = min(count, per_string)
            batch.append((word + " ") * repeats)
            size += repeats * unit
            count -= repeats
            if size >= _BATCH_CHARS:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def _train_merges(word_counts: dict[str, int], special_tokens: list[str], vocab_size: int) -> list[tuple[str, str]]:
    tokenizer = Tokenizer(models.BPE(unk_token=UNK_SUBWORD))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # for training only: words hold no whitespace
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=0, special_tokens=special_tokens, show_progress=False
    )
    tokenizer.train_from_iterator(_word_batches(word_counts), trainer=trainer)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]


class SubwordTokenizer:
    """A trained BPE model plus a per-word-type cache of its segmentations.

    Build with :meth:`train` or :meth:`from_json`.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        data = json.loads(tokenizer.to_str())
        self.num_merges = len(data["model"]["merges"])
        self.special_tokens = [t["content"] for t in data["added_tokens"] if t["special"]]
        self._special_ids = {t: tokenizer.token_to_id(t) for t in self.special_tokens}
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def train(
        cls,
        word_counts: dict[str, int],
        num_merges: int,
        special_tokens: Iterable[str] = SPECIAL_WORDS,
    ) -> "SubwordTokenizer":
        """Learn exactly ``num_merges`` BPE merges from word counts.

        Args:
            word_counts: word type -> count (words must not contain whitespace).
            num_merges: merges to learn; 0 gives characters only.
            special_tokens: tokens that get one subword each, first ids; must start with
                ``<pad>`` (id 0, the subword padding id) and contain ``<unk>``.

        Returns:
            The trained tokenizer.

        Raises:
            ConfigError: (a ValueError) the corpus cannot support ``num_merges`` merges (the
                message gives the maximum): a setting to change, one line at the command.
            ValueError: a word is empty / contains whitespace.
        """
        special_tokens = list(special_tokens)
        if not special_tokens or special_tokens[0] != SPECIAL_WORDS[0] or UNK_SUBWORD not in special_tokens:
            raise ValueError(f"special_tokens must start with {SPECIAL_WORDS[0]!r} and contain {UNK_SUBWORD!r}")
        if num_merges < 0:
            raise ValueError(f"num_merges must be >= 0, got {num_merges}")
        specials = set(special_tokens)
        counts = {w: int(c) for w, c in sorted(word_counts.items()) if c > 0 and w not in specials}
        for word in counts:
            if not word or any(ch.isspace() for ch in word):
                raise ValueError(f"BPE words must be non-empty and without whitespace, got {word!r}")
        alphabet = sorted({ch for word in counts for ch in word})
        base = len(special_tokens) + len(alphabet)
        merges = _train_merges(counts, special_tokens, base + num_merges) if num_merges else []
        if len(merges) < num_merges:
            # Every merge shortens at least one word type by one symbol: this bound is never reached.
            ceiling = base + sum(len(word) - 1 for word in counts) + 1
            maximum = len(_train_merges(counts, special_tokens, ceiling))
            raise ConfigError(
                f"the corpus ({len(counts)} word types, {len(alphabet)} characters) supports at most "
                f"{maximum} BPE merges, {num_merges} were asked (bpe_merges)"
            )
        merges = merges[:num_merges]
        vocab: dict[str, int] = {}
        for token in [*special_tokens, *alphabet, *(a + b for a, b in merges)]:
            vocab.setdefault(token, len(vocab))
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=UNK_SUBWORD))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tokenizer.add_special_tokens(special_tokens)
        result = cls(tokenizer)
        if result.num_merges != num_merges:  # the rebuilt model must hold exactly what was asked
            raise RuntimeError(f"BPE model has {result.num_merges} merges, expected {num_merges}")
        return result

    @property
    def vocab_size(self) -> int:
        """Number of subword ids (specials + alphabet + merged subwords)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int:
        """Id of a subword string (e.g. a special token); KeyError when absent."""
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise KeyError(f"{token!r} is not a subword of this tokenizer")
        return token_id

    def encode_word(self, word: str) -> list[int]:
        """Subword ids of one word (specials: their one id; unknown characters: ``<unk>``)."""
        ids = self._cache.get(word)
        if ids is None:
            special = self._special_ids.get(word)
            if special is not None:
                ids = [special]
            else:
                ids = [t.id for t in self.tokenizer.model.tokenize(word)]
                if not ids:
                    raise ValueError(f"cannot segment an empty word {word!r}")
            self._cache[word] = ids
        return ids

    def encode_words(self, words: list[str]) -> list[list[int]]:
        """Subword ids of each word (cached per word type)."""
        return [self.encode_word(w) for w in words]

    def subwords(self, word: str) -> list[str]:
        """The subword strings of a word (for inspection)."""
        return [self.tokenizer.id_to_token(i) for i in self.encode_word(word)]

    def to_json(self) -> str:
        """The tokenizers JSON of the model (``Tokenizer.from_str`` reads it)."""
        return self.tokenizer.to_str()

    @classmethod
    def from_json(cls, text: str) -> "SubwordTokenizer":
        return cls(Tokenizer.from_str(text))
