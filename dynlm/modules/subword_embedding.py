"""Subword-augmented word embeddings (Zhang et al., 2018).

``SE(w)``: the BPE units of ``w`` -> subword embedding -> bidirectional GRU -> the two final
states concatenated -> linear. ``AE(w) = WE(w) ⋄ SE(w)`` with ``⋄`` one of concat / sum / mul.

Words off the short list (``spec.shortlist_size <= id < spec.num_words``) share the ``<unk>``
word embedding but keep their own subwords, so ``SE`` tells them apart. Subwords are encoded
once per *unique* (word, segmentation) of a sentence batch (``SentenceBatch.unique_words``,
``subword_ids``, ``subword_lengths``), then gathered per token with ``token_to_unique``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from dynlm.vocab_spec import VocabSpec


def shortlist_input_ids(tokens: torch.Tensor, spec: VocabSpec) -> torch.Tensor:
    """Map input ids off the short list to ``<unk>`` (entity ids and short-list words unchanged).

    Args:
        tokens: ``[...]`` ids in the word/output space.
        spec: the vocabulary spec.

    Returns:
        ``[...]`` ids whose own word embedding is used on the input side.
    """
    off_list = (tokens >= spec.shortlist_size) & (tokens < spec.num_words)
    return torch.where(off_list, torch.full_like(tokens, spec.unk_id), tokens)


class WordEmbedding(nn.Embedding):
    """``WE(w)``: a lookup table over the whole output space, read through the short list.

    The table has ``spec.output_size`` rows so it can be tied to the output layer; rows of
    off-short-list words are only used on the output side.

    Args:
        spec: vocabulary spec.
        embed_dim: embedding size.
    """

    def __init__(self, spec: VocabSpec, embed_dim: int):
        super().__init__(spec.output_size, embed_dim, padding_idx=spec.pad_id)
        self.spec = spec

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Args: tokens ``[B, L]``. Returns: ``[B, L, embed_dim]``."""
        return super().forward(shortlist_input_ids(tokens, self.spec))


class SubwordEncoder(nn.Module):
    """``SE``: BiGRU over the BPE units of each word, final states concatenated, then linear.

    Args:
        num_subwords: BPE vocabulary size (``spec.num_subwords``).
        subword_dim: subword embedding size, also the GRU hidden size per direction.
        out_dim: output size.
        pad_id: the subword padding id.
    """

    def __init__(self, num_subwords: int, subword_dim: int, out_dim: int, pad_id: int = 0):
        super().__init__()
        self.embedding = nn.Embedding(num_subwords, subword_dim, padding_idx=pad_id)
        self.gru = nn.GRU(subword_dim, subword_dim, batch_first=True, bidirectional=True)
        self.proj = nn.Linear(2 * subword_dim, out_dim)

    def forward(self, subword_ids: torch.Tensor, subword_lengths: torch.Tensor) -> torch.Tensor:
        """Encode each word from its subwords; padding after ``subword_lengths`` is ignored.

        Args:
            subword_ids: ``[U, S]`` padded BPE ids of U words.
            subword_lengths: ``[U]`` number of real subwords (>= 1), any device.

        Returns:
            ``[U, out_dim]``.
        """
        if subword_ids.numel() == 0:
            return self.proj.weight.new_zeros(subword_ids.size(0), self.proj.out_features)
        lengths = subword_lengths.detach().to("cpu", torch.int64)
        if int(lengths.min()) < 1:
            raise ValueError("SubwordEncoder: every word needs at least one subword")
        embedded = self.embedding(subword_ids)  # [U, S, D]
        packed = pack_padded_sequence(embedded, lengths, batch_first=True, enforce_sorted=False)
        _, final = self.gru(packed)  # final [2, U, D] (forward, backward)
        return self.proj(torch.cat([final[0], final[1]], dim=-1))  # [U, out_dim]


class SubwordAugmentedEmbedding(nn.Module):
    """Input embedding ``WE ⋄ SE``, ``SE`` alone, or (for symmetry) ``WE`` alone.

    Sizes: with ``combine="concat"`` the word part has ``embed_dim - embed_dim // 2`` units
    and the subword part ``embed_dim // 2``; with ``sum``/``mul`` both have ``embed_dim``.
    The result is always ``embed_dim`` wide.

    Args:
        spec: vocabulary spec.
        embed_dim: output size.
        subword_dim: subword embedding / GRU size.
        mode: ``"word"``, ``"subword"`` or ``"word+subword"``.
        combine: ``"concat"``, ``"sum"`` or ``"mul"`` (only for ``word+subword``).
    """

    def __init__(
        self,
        spec: VocabSpec,
        embed_dim: int,
        subword_dim: int,
        mode: Literal["word", "subword", "word+subword"] = "word+subword",
        combine: Literal["concat", "sum", "mul"] = "concat",
    ):
        super().__init__()
        if mode not in ("word", "subword", "word+subword"):
            raise ValueError(f"SubwordAugmentedEmbedding: unknown mode {mode!r}")
        if combine not in ("concat", "sum", "mul"):
            raise ValueError(f"SubwordAugmentedEmbedding: unknown combine {combine!r}")
        if mode == "word+subword" and combine == "concat" and embed_dim < 2:
            raise ValueError("SubwordAugmentedEmbedding: concat needs embed_dim >= 2")
        self.mode = mode
        self.combine = combine
        self.embed_dim = embed_dim
        concat = mode == "word+subword" and combine == "concat"
        subword_out = embed_dim // 2 if concat else embed_dim
        word_dim = embed_dim - subword_out if concat else embed_dim
        self.word = WordEmbedding(spec, word_dim) if mode != "subword" else None
        self.subword = (
            SubwordEncoder(spec.num_subwords, subword_dim, subword_out, spec.subword_pad_id)
            if mode != "word"
            else None
        )

    @property
    def word_dim(self) -> int:
        return 0 if self.word is None else self.word.weight.size(1)

    def encode_subwords(self, batch) -> torch.Tensor:
        """``SE`` of the unique words of ``batch`` gathered per token: ``[B, L, D_se]``."""
        unique = self.subword(batch.subword_ids, batch.subword_lengths)  # [U, D_se]
        return unique[batch.token_to_unique]  # [B, L, D_se]

    def forward(self, batch) -> torch.Tensor:
        """Args: batch a ``SentenceBatch``. Returns: ``[B, L, embed_dim]``."""
        if self.subword is None:
            return self.word(batch.tokens)
        se = self.encode_subwords(batch)
        if self.word is None:
            return se
        we = self.word(batch.tokens)
        if self.combine == "concat":
            return torch.cat([we, se], dim=-1)
        if self.combine == "sum":
            return we + se
        return we * se
