"""The preprocessing artifact: vocabulary + short list + BPE + max_chains + VocabSpec in ONE
versioned JSON file (``preprocessor.json`` of a prepared folder).

It turns (anonymized) sentences into the flat ENCODED_SCHEMA row of docs/ARCHITECTURE.md:
every sentence is ``<bos> tokens <eos>``; a token ``<unkN>`` is entity N (word id
``spec.entity_word_id(N)``, entity id N, one special subword); other tokens get their word id
(``<unk>`` when outside the vocabulary) and their BPE subwords.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dynlm.data.bpe import SubwordTokenizer
from dynlm.data.config import DataConfig
from dynlm.data.vocabulary import Vocabulary, shortlist_count
from dynlm.vocab_spec import SPECIAL_WORDS, VocabSpec

FORMAT_VERSION = 1
KIND = "dynlm.preprocessor"
_ENTITY = re.compile(r"^<unk([1-9][0-9]*)>$")


def is_entity_token(token: str) -> bool:
    """True for ``<unk1>``, ``<unk2>``, ... (not for ``<unk>``)."""
    return _ENTITY.match(token) is not None


def entity_index(token: str) -> int:
    """N of ``<unkN>``; 0 for any other token."""
    match = _ENTITY.match(token)
    return int(match.group(1)) if match else 0


class Preprocessor:
    """Vocabulary, short list, BPE and entity range, fitted on the train split.

    Args:
        vocabulary: the word vocabulary (with its short list).
        subwords: the BPE tokenizer (its specials: SPECIAL_WORDS then ``<unk1>..<unk{max_chains}>``).
        max_chains: number of entity identifiers.
    """

    def __init__(self, vocabulary: Vocabulary, subwords: SubwordTokenizer, max_chains: int):
        expected = list(SPECIAL_WORDS) + [f"<unk{k}>" for k in range(1, max_chains + 1)]
        if subwords.special_tokens != expected:
            raise ValueError(
                f"the BPE tokenizer's special tokens must be {expected[:6]}... ({len(expected)}), "
                f"got {subwords.special_tokens[:6]}... ({len(subwords.special_tokens)})"
            )
        self.vocabulary = vocabulary
        self.subwords = subwords
        self.max_chains = max_chains
        self.spec = VocabSpec(
            num_words=vocabulary.num_words,
            num_entities=max_chains,
            shortlist_size=vocabulary.shortlist_size,
            num_subwords=subwords.vocab_size,
            subword_pad_id=subwords.token_id(SPECIAL_WORDS[0]),
        )
        self._cache: dict[str, tuple[int, int, list[int]]] = {}
        self._bos = self._token("<bos>")
        self._eos = self._token("<eos>")

    @classmethod
    def fit(cls, word_counts: dict[str, int], cfg: DataConfig) -> "Preprocessor":
        """Build the artifact from the word counts of the anonymized TRAIN split.

        Args:
            word_counts: word -> count; entity tokens ``<unkN>`` and specials are skipped.
            cfg: vocab_size, gamma, bpe_merges and max_chains are used.

        Returns:
            The fitted preprocessor.
        """
        counts = {w: c for w, c in word_counts.items() if not is_entity_token(w) and w not in SPECIAL_WORDS}
        vocabulary = Vocabulary.from_counts(counts, cfg.vocab_size, cfg.gamma)
        specials = list(SPECIAL_WORDS) + [f"<unk{k}>" for k in range(1, cfg.max_chains + 1)]
        subwords = SubwordTokenizer.train(counts, cfg.bpe_merges, special_tokens=specials)
        return cls(vocabulary, subwords, cfg.max_chains)

    def with_gamma(self, gamma: float) -> "Preprocessor":
        """The same preprocessor with the short list of ``gamma``.

        Encoding does not change: word ids cover the whole vocabulary and the short list is
        applied in the model's input layer (``shortlist_input_ids``).
        """
        words = self.vocabulary.words
        vocabulary = Vocabulary(words, len(SPECIAL_WORDS) + shortlist_count(len(words), gamma))
        return Preprocessor(vocabulary, self.subwords, self.max_chains)

    # -- encoding -------------------------------------------------------------------------
    is_entity_token = staticmethod(is_entity_token)
    entity_index = staticmethod(entity_index)

    def _token(self, token: str) -> tuple[int, int, list[int]]:
        """(word id, entity id, subword ids) of one token, cached per token type."""
        cached = self._cache.get(token)
        if cached is None:
            entity = entity_index(token)
            if entity:
                if entity > self.max_chains:
                    raise ValueError(f"entity token {token!r} is beyond max_chains={self.max_chains}")
                cached = (self.spec.entity_word_id(entity), entity, self.subwords.encode_word(token))
            else:
                cached = (self.vocabulary.id(token), 0, self.subwords.encode_word(token))
            self._cache[token] = cached
        return cached

    def encode_document(self, sentences: list[list[str]], mentions: list | None = None) -> dict:
        """Encode anonymized sentences into the ENCODED_SCHEMA columns (minus doc_id/source_file).

        Args:
            sentences: lists of tokens; ``<unkN>`` tokens are entities.
            mentions: must be empty/None (anonymize first: mentions are already replaced).

        Returns:
            ``{"num_tokens", "sentence_lengths", "word_ids", "entity_ids", "subword_ids",
            "subword_lengths"}`` (python ints / lists of ints).
        """
        if mentions:
            raise ValueError("encode_document takes anonymized sentences; run anonymize() on documents with mentions")
        cache, lookup = self._cache, self._token
        items = []  # (word id, entity id, subword ids) per token, <bos>/<eos> included
        sentence_lengths: list[int] = []
        for tokens in sentences:
            sentence_lengths.append(len(tokens) + 2)
            items.append(self._bos)
            items.extend([cache.get(t) or lookup(t) for t in tokens])
            items.append(self._eos)
        word_ids = [item[0] for item in items]
        entity_ids = [item[1] for item in items]
        subword_lengths = [len(item[2]) for item in items]
        subword_ids = [i for item in items for i in item[2]]
        return {
            "num_tokens": len(word_ids),
            "sentence_lengths": sentence_lengths,
            "word_ids": word_ids,
            "entity_ids": entity_ids,
            "subword_ids": subword_ids,
            "subword_lengths": subword_lengths,
        }

    def encode_text(self, text: str | list[list[str]]) -> dict:
        """Encode raw text (one sentence per line, whitespace tokens) or pre-tokenized sentences.

        Tokens ``<unkN>`` are read as entity N. Empty lines are skipped.
        """
        if isinstance(text, str):
            sentences = [line.split() for line in text.splitlines() if line.strip()]
        else:
            sentences = [list(s) for s in text]
        return self.encode_document(sentences)

    def decode_word_ids(self, word_ids: list[int]) -> list[str]:
        """Tokens of word ids (entity ids -> ``<unkN>``), for inspection and tests."""
        out = []
        for i in word_ids:
            if i >= self.spec.num_words:
                out.append(f"<unk{i - self.spec.num_words + 1}>")
            else:
                out.append(self.vocabulary.itos[i])
        return out

    # -- serialization --------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "kind": KIND,
            "format_version": FORMAT_VERSION,
            "max_chains": self.max_chains,
            "spec": self.spec.to_dict(),
            "vocabulary": self.vocabulary.to_dict(),
            "bpe": json.loads(self.subwords.to_json()),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "Preprocessor":
        if data.get("kind") != KIND:
            raise ValueError(f"not a dynlm preprocessor artifact (kind={data.get('kind')!r})")
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"preprocessor format_version {data.get('format_version')!r} is not supported "
                f"(this dynlm reads version {FORMAT_VERSION}); prepare the data again"
            )
        result = cls(
            Vocabulary.from_dict(data["vocabulary"]),
            SubwordTokenizer.from_json(json.dumps(data["bpe"])),
            int(data["max_chains"]),
        )
        stored = VocabSpec.from_dict(data["spec"])
        if stored != result.spec:
            raise ValueError(f"preprocessor spec {stored} does not match its contents {result.spec}")
        return result

    @classmethod
    def from_json(cls, text: str) -> "Preprocessor":
        return cls.from_dict(json.loads(text))

    def save(self, path: str | Path) -> Path:
        """Write the artifact as one JSON file; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json(), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Preprocessor":
        return cls.from_json(Path(path).read_text(encoding="utf-8"))
