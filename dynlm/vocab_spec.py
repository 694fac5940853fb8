"""The sizes and special ids a model needs from the preprocessing artifact.

Id layout of the word/output space (one space for inputs and targets)::

    [0, num_words)                       specials (<pad>=0, <unk>=1, <bos>=2, <eos>=3), then words by frequency
    [num_words, num_words+num_entities)  entity identifiers <unk1> ... <unkK> (K = num_entities)

On the input side only ids below ``shortlist_size`` (and the entity ids) keep their own word
embedding; other words are embedded as ``<unk>`` (the SAW short list, fraction gamma of the
word types) but keep their subword segmentation. Targets always use the full space.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynlm.config import Config

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
SPECIAL_WORDS = ("<pad>", "<unk>", "<bos>", "<eos>")


@dataclass
class VocabSpec(Config):
    num_words: int
    num_entities: int
    shortlist_size: int
    num_subwords: int
    pad_id: int = PAD_ID
    unk_id: int = UNK_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    subword_pad_id: int = 0

    @property
    def output_size(self) -> int:
        return self.num_words + self.num_entities

    @property
    def entity_offset(self) -> int:
        return self.num_words

    def entity_word_id(self, chain: int) -> int:
        """Word id of ``<unk{chain}>`` (chain is 1-based)."""
        return self.num_words + chain - 1
