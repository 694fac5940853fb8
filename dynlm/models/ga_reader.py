"""Gated-attention reader (Dhingra et al., 2017) with subword-augmented embeddings (Zhang et al., 2018).

Cloze reading comprehension: given a document and a query with one blank, point at the answer
among the candidates (the CBT list, or every word type of the document for CMRC-2017)::

    X⁰ = AE(document),  Y = AE(query)                 AE: word | subword | word ⋄ subword (SAW)
    for k = 1 .. K-1:   D = BiGRU_D^k(X^{k-1}),  Q = BiGRU_Q^k(Y),  X^k = GA(D, Q)   (gated_attention)
    hop K:              D = BiGRU_D^K([X^{K-1}; f]),  q = [→GRU_Q^K(Y) last; ←GRU_Q^K(Y) first]
                        s = softmax_i(q · D_i),   P(c) = Σ_{i: d_i = c} s_i               (attention_sum)

``f`` is the token-in-query feature (Dhingra et al.'s ``qe-comm``): an embedding of whether the
document token occurs in the query. The loss is ``-log P(answer)``. This file imports torch, the
strict config base and :mod:`dynlm.modules` only; the task that fills :class:`ReaderBatch` is
:mod:`dynlm.tasks.cloze`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from dynlm.config import Config, ConfigError
from dynlm.modules.attention_sum import attention_sum
from dynlm.modules.gated_attention import gated_attention
from dynlm.modules.subword_embedding import SubwordAugmentedEmbedding
from dynlm.vocab_spec import VocabSpec


@dataclass
class GAReaderConfig(Config):
    """The cloze task's ``model:`` section."""

    embedding: Literal["word", "subword", "word+subword"] = "word+subword"
    combine: Literal["concat", "sum", "mul"] = "concat"  # word ⋄ subword (embedding word+subword only)
    embed_dim: int = 64  # AE output size
    subword_dim: int = 32  # subword embedding / subword BiGRU size
    hidden_size: int = 64  # per direction of every document / query BiGRU
    num_hops: int = 3  # K
    feature_dim: int = 4  # token-in-query feature embedding (0: no feature)
    dropout: float = 0.1  # on the embeddings and between hops

    def validate(self) -> None:
        for name in ("embed_dim", "subword_dim", "hidden_size", "num_hops"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.feature_dim < 0 or not 0.0 <= self.dropout < 1.0:
            raise ConfigError("model.feature_dim must be >= 0 and model.dropout in [0, 1)")


@dataclass
class TokenInputs:
    """One side (document or query) of a batch, as :class:`SubwordAugmentedEmbedding` reads it.

    Attributes:
        tokens: ``[B, L]`` word ids (``spec.pad_id`` at padding).
        mask: ``[B, L]`` bool, True at real positions (a prefix of each row, at least one).
        lengths: ``[B]`` long real positions per row; kept on CPU.
        subword_ids: ``[U, S]`` BPE ids of the unique words of this side, padded.
        subword_lengths: ``[U]`` subwords per unique word (>= 1); kept on CPU.
        token_to_unique: ``[B, L]`` index into the unique words (0 at padding).
    """

    tokens: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    subword_ids: torch.Tensor
    subword_lengths: torch.Tensor
    token_to_unique: torch.Tensor

    def to(self, device) -> "TokenInputs":
        return TokenInputs(**{f.name: getattr(self, f.name) if f.name in ("lengths", "subword_lengths")
                              else getattr(self, f.name).to(device) for f in fields(self)})


@dataclass
class ReaderBatch:
    """B cloze questions.

    Attributes:
        document / query: the two token sides.
        in_query: ``[B, Ld]`` long, 1 where the document token occurs in the query.
        candidate_of_token: ``[B, Ld]`` long candidate index of each document token, -1 where none.
        candidate_mask: ``[B, C]`` bool, True for the real candidates.
        answer: ``[B]`` long index of the true answer among the candidates (-1: unknown or an
            inactive row, which adds nothing to the loss).
    """

    document: TokenInputs
    query: TokenInputs
    in_query: torch.Tensor
    candidate_of_token: torch.Tensor
    candidate_mask: torch.Tensor
    answer: torch.Tensor

    def to(self, device) -> "ReaderBatch":
        return ReaderBatch(self.document.to(device), self.query.to(device), self.in_query.to(device),
                           self.candidate_of_token.to(device), self.candidate_mask.to(device), self.answer.to(device))

    @property
    def size(self) -> int:
        return int(self.answer.shape[0])


def _bigru(input_size: int, hidden_size: int) -> nn.GRU:
    return nn.GRU(input_size, hidden_size, batch_first=True, bidirectional=True)


def _run(gru: nn.GRU, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs ``[B, L, 2H]`` (0 at padding) and final states ``[2, B, H]`` of a BiGRU over padded rows."""
    packed = pack_padded_sequence(x, lengths.clamp_min(1), batch_first=True, enforce_sorted=False)
    out, final = gru(packed)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return out, final


class GAReader(nn.Module):
    """The gated-attention reader of the module docstring.

    Args:
        cfg: the model config.
        spec: the preprocessor's vocabulary spec (word short list, subword vocabulary).
    """

    def __init__(self, cfg: GAReaderConfig, spec: VocabSpec):
        super().__init__()
        cfg.validate()
        self.cfg, self.spec = cfg, spec
        self.embedding = SubwordAugmentedEmbedding(spec, cfg.embed_dim, cfg.subword_dim, mode=cfg.embedding,
                                                   combine=cfg.combine)
        self.drop = nn.Dropout(cfg.dropout)
        hidden = cfg.hidden_size
        self.doc_grus = nn.ModuleList(
            [_bigru(cfg.embed_dim if k == 0 else 2 * hidden, hidden) for k in range(cfg.num_hops - 1)]
            + [_bigru((cfg.embed_dim if cfg.num_hops == 1 else 2 * hidden) + cfg.feature_dim, hidden)])
        self.query_grus = nn.ModuleList([_bigru(cfg.embed_dim, hidden) for _ in range(cfg.num_hops)])
        self.feature = nn.Embedding(2, cfg.feature_dim) if cfg.feature_dim else None

    def attention(self, batch: ReaderBatch) -> torch.Tensor:
        """``[B, Ld]`` the final attention ``s`` over the document positions (0 at padding)."""
        doc, query = batch.document, batch.query
        x = self.drop(self.embedding(doc))  # [B, Ld, E]
        y = self.drop(self.embedding(query))  # [B, Lq, E]
        for k in range(self.cfg.num_hops - 1):
            d, _ = _run(self.doc_grus[k], x, doc.lengths)  # [B, Ld, 2H]
            q, _ = _run(self.query_grus[k], y, query.lengths)  # [B, Lq, 2H]
            x = self.drop(gated_attention(d, q, query.mask))  # [B, Ld, 2H]
        if self.feature is not None:
            x = torch.cat([x, self.feature(batch.in_query)], dim=-1)
        d, _ = _run(self.doc_grus[-1], x, doc.lengths)  # [B, Ld, 2H]
        _, final = _run(self.query_grus[-1], y, query.lengths)  # [2, B, H]
        q = torch.cat([final[0], final[1]], dim=-1)  # [B, 2H]
        scores = torch.bmm(d, q[:, :, None]).squeeze(-1)  # [B, Ld]
        return torch.softmax(scores.masked_fill(~doc.mask, float("-inf")), dim=-1)

    def forward(self, batch: ReaderBatch) -> torch.Tensor:
        """``[B, C]`` log P(candidate) (attention-sum; ``-inf`` at padded candidates)."""
        return attention_sum(self.attention(batch), batch.candidate_of_token, batch.candidate_mask)


def answer_nll(log_probs: torch.Tensor, answer: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(Σ -log P(answer), questions)`` over the rows with a known answer (``answer >= 0``)."""
    known = answer >= 0
    picked = log_probs.gather(1, answer.clamp_min(0)[:, None]).squeeze(1)  # [B]
    return -torch.where(known, picked, torch.zeros_like(picked)).sum(), int(known.sum())


__all__ = ["GAReader", "GAReaderConfig", "ReaderBatch", "TokenInputs", "answer_nll"]
