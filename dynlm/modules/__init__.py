"""Building blocks, one technique per file."""

from dynlm.modules.locked_dropout import LockedDropout
from dynlm.modules.subword_embedding import SubwordAugmentedEmbedding, SubwordEncoder, WordEmbedding

__all__ = ["LockedDropout", "SubwordAugmentedEmbedding", "SubwordEncoder", "WordEmbedding"]
