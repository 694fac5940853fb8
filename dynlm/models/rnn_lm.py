"""Baseline recurrent language model: embedding -> LSTM/GRU -> output over words + entities.

The pieces are public so other models compose them (the DNTM adds entity embeddings between
:meth:`RNNLM.embed` and :meth:`RNNLM.run_rnn`, and entity scores after it)::

    x = model.input_dropout(model.embed(batch))              # [B, L, E]
    hidden, state = model.run_rnn(x, state, batch.lengths, batch)   # [B, L, H]
    positions = real_positions(batch.lengths, hidden.size(1), hidden.device)  # [N] (None: no padding)
    dropped = at_positions(model.output_dropout(hidden), positions)  # [N, H]
    words, entities = model.word_and_entity_logits(dropped)
    logits = model.join_logits(words, entities + extra, batch, positions, dropped)  # [N, V_out], entity mask applied

(``dropped``: the hidden state the parts were computed from, ``[N, H]``; the factored output of
``cfg.entity_class_output`` reads it.)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from dynlm.models.config import ModelConfig
from dynlm.models.outputs import LMOutput, accepts_sentence_lists, at_positions, real_positions
from dynlm.modules.entity_class import EntityClassOutput
from dynlm.modules.entity_mask import mask_unseen_entities
from dynlm.modules.locked_dropout import LockedDropout
from dynlm.modules.subword_embedding import SubwordAugmentedEmbedding
from dynlm.vocab_spec import VocabSpec


class RNNState(NamedTuple):
    """Recurrent state. ``h``: ``[num_layers, B, H]``; ``c``: same for LSTM, ``None`` for GRU."""

    h: torch.Tensor
    c: torch.Tensor | None


def rnn_lm_small(**overrides) -> ModelConfig:
    """A small LSTM LM for tests and smoke runs (64-dim, 1 layer)."""
    cfg = dict(type="rnn", backbone="lstm", embed_dim=64, hidden_dim=64, num_layers=1, dropout=0.1)
    return ModelConfig.from_dict({**cfg, **overrides})


def rnn_lm_base(**overrides) -> ModelConfig:
    """The baseline size used in reports (256-dim embeddings, 2 x 512 LSTM, dropout 0.3)."""
    cfg = dict(type="rnn", backbone="lstm", embed_dim=256, hidden_dim=512, num_layers=2, dropout=0.3)
    return ModelConfig.from_dict({**cfg, **overrides})


def rnn_lm_subword_small(**overrides) -> ModelConfig:
    """:func:`rnn_lm_small` with subword-augmented input embeddings (word ⋄ subword, concat)."""
    return rnn_lm_small(**{"embedding": "word+subword", "combine": "concat", "subword_dim": 32, **overrides})


class RNNLM(nn.Module):
    """Embedding -> locked dropout -> LSTM/GRU -> locked dropout -> linear over ``spec.output_size``.

    Args:
        cfg: the model config (``backbone``, ``embed_dim``, ``hidden_dim``, ``num_layers``,
            ``dropout``, ``tie_weights``, ``embedding``, ``combine``, ``subword_dim``).
        spec: vocabulary sizes and special ids.
    """

    needs_grad_at_eval = False
    needs_whole_sentences = False  # a sentence may be read in pieces (the state carries)
    supports_packed_documents = True  # a row may hold several documents (state reset at batch.doc_start)

    def __init__(self, cfg: ModelConfig, spec: VocabSpec):
        super().__init__()
        self.cfg = cfg
        self.spec = spec
        self.embedding = SubwordAugmentedEmbedding(
            spec, cfg.embed_dim, cfg.subword_dim, mode=cfg.embedding, combine=cfg.combine
        )
        self.input_dropout = LockedDropout(cfg.dropout)
        rnn_cls = nn.LSTM if cfg.backbone == "lstm" else nn.GRU
        self.rnn = rnn_cls(
            cfg.embed_dim,
            cfg.hidden_dim,
            num_layers=cfg.num_layers,
            dropout=cfg.dropout if cfg.num_layers > 1 else 0.0,
            batch_first=True,
        )
        self.output_dropout = LockedDropout(cfg.dropout)
        self.decoder = nn.Linear(cfg.hidden_dim, spec.output_size)
        self.entity_class = (EntityClassOutput(cfg.hidden_dim, spec.entity_offset, spec.num_entities)
                             if cfg.entity_class_output else None)
        if cfg.tie_weights:
            word = self.embedding.word
            if word is None or word.weight.size(1) != cfg.hidden_dim:
                raise ValueError(
                    "model.tie_weights needs a word embedding of hidden_dim units: use "
                    f"embedding='word' or combine='sum'/'mul' (got embedding={cfg.embedding!r}, "
                    f"combine={cfg.combine!r})"
                )
            self.decoder.weight = word.weight

    # ----- state -------------------------------------------------------------------------
    def init_state(self, batch_size: int, device: torch.device | str | None = None) -> RNNState:
        """Zero state for ``batch_size`` documents (on ``device``, default: the parameters')."""
        device = device if device is not None else self.decoder.weight.device
        shape = (self.cfg.num_layers, batch_size, self.cfg.hidden_dim)
        h = torch.zeros(shape, device=device)
        c = torch.zeros(shape, device=device) if self.cfg.backbone == "lstm" else None
        return RNNState(h, c)

    @staticmethod
    def detach_state(state: RNNState) -> RNNState:
        """Cut the autograd history (truncated BPTT boundary)."""
        return RNNState(state.h.detach(), None if state.c is None else state.c.detach())

    @staticmethod
    def reset_state(state: RNNState, keep: torch.Tensor) -> RNNState:
        """Zero the rows of documents that end / start.

        Args:
            state: current state.
            keep: ``[B]`` bool, False where the row's state is reset to zeros.
        """
        scale = keep.to(state.h.device, state.h.dtype).view(1, -1, 1)  # [1, B, 1]
        return RNNState(state.h * scale, None if state.c is None else state.c * scale)

    # ----- composable pieces -------------------------------------------------------------
    def embed(self, batch) -> torch.Tensor:
        """Input embeddings of ``batch.tokens`` (no dropout): ``[B, L, E]``."""
        return self.embedding(batch)

    def run_rnn(
        self, x: torch.Tensor, state: RNNState, lengths: torch.Tensor | None = None, batch=None
    ) -> tuple[torch.Tensor, RNNState]:
        """Run the recurrent layers over padded inputs.

        Args:
            x: ``[B, L, E]`` inputs; row b is real for its first ``lengths[b]`` positions.
            state: state before position 0.
            lengths: ``[B]`` int (CPU preferred), or None when no row is padded. Rows of
                length 0 (documents that already ended) keep their state unchanged.
            batch: the step's ``SentenceBatch``, when a document may start inside it: the pass
                is split at ``batch.reset_columns`` (CPU) and the state of the rows whose
                ``doc_start`` is set there is zeroed, so each document is read from a zero state.

        Returns:
            ``hidden [B, L, H]`` (zeros at padded positions) and the state after each row's
            last real position.
        """
        columns = [] if batch is None else batch.reset_columns.tolist()
        if not columns:
            return self._run_segment(x, state, lengths)
        parts, start = [], 0
        for end in [*columns, x.size(1)]:
            if end > start:
                seg_lengths = None if lengths is None else (lengths.to("cpu", torch.int64) - start).clamp(0, end - start)
                hidden, state = self._run_segment(x[:, start:end], state, seg_lengths)
                parts.append(hidden)
                start = end
            if end < x.size(1):
                state = self.reset_state(state, ~batch.doc_start[:, end])
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0], state

    def _run_segment(
        self, x: torch.Tensor, state: RNNState, lengths: torch.Tensor | None
    ) -> tuple[torch.Tensor, RNNState]:
        """One recurrent pass over rows of possibly different lengths; see :meth:`run_rnn`.

        Every row full: one fused call. Otherwise, on the CPU, one fused call per stretch of
        positions between two row lengths, over the rows still running there (at most one call
        per distinct length, no padding read): a packed sequence would run PyTorch's per-step CPU
        kernel, whose backward zero-fills a full-size gradient every time step (whole-sentence
        chunks of the DNTM, whose rows nearly never end together, ran at 0.6x the speed). On an
        accelerator the packed call (cuDNN's variable-length kernel) is used.
        """
        hx = state if state.c is not None else state.h
        if lengths is None:
            hidden, new = self.rnn(x, hx)
            return hidden, _as_state(new, state.h.dtype)
        lengths = lengths.to("cpu", torch.int64)
        if bool((lengths == x.size(1)).all()):
            hidden, new = self.rnn(x, hx)
            return hidden, _as_state(new, state.h.dtype)
        if x.device.type == "cpu":
            return self._run_stretches(x, state, lengths)
        packed = pack_padded_sequence(x, lengths.clamp(min=1), batch_first=True, enforce_sorted=False)
        out, new = self.rnn(packed, hx)
        hidden, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
        new = _as_state(new, state.h.dtype)
        if bool((lengths == 0).any()):
            active = (lengths > 0).to(x.device).view(1, -1, 1)  # [1, B, 1]
            new = RNNState(
                torch.where(active, new.h, state.h),
                None if new.c is None else torch.where(active, new.c, state.c),
            )
            hidden = hidden * active.view(-1, 1, 1).to(hidden.dtype)
        return hidden, new

    def _run_stretches(self, x: torch.Tensor, state: RNNState, lengths: torch.Tensor) -> tuple[torch.Tensor, RNNState]:
        """Rows of different ``lengths`` [B] (CPU) as fused calls between consecutive lengths."""
        batch_size, width, _ = x.shape
        h, c = state
        parts, start = [], 0
        for end in sorted({int(n) for n in lengths.tolist() if n > 0}):
            rows = (lengths >= end).nonzero().squeeze(1)  # [R] the rows that run through [start, end)
            hx = h.index_select(1, rows) if c is None else (h.index_select(1, rows), c.index_select(1, rows))
            out, new = self.rnn(x[:, start:end].index_select(0, rows), hx)  # [R, end - start, H]
            new = _as_state(new, state.h.dtype)
            h = h.index_copy(1, rows, new.h)
            c = None if c is None else c.index_copy(1, rows, new.c)
            parts.append(out.new_zeros(batch_size, end - start, out.size(-1)).index_copy(0, rows, out))
            start = end
        if start < width:  # padding after the longest row
            parts.append(x.new_zeros(batch_size, width - start, self.cfg.hidden_dim))
        return torch.cat(parts, dim=1), RNNState(h, c)

    def output_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output dropout + linear layer: ``[B, L, H] -> [B, L, V_out]``."""
        return self.decoder(self.output_dropout(hidden))

    def word_and_entity_logits(self, dropped: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The output layer in two parts, ``[..., entity_offset]`` word scores and ``[..., K]``
        entity scores (``dropped [..., H]``: ``[B, L, H]``, or ``[N, H]`` at the real positions),
        for a model that changes only the entity columns (the mask, the DNTM's dynamic scores):
        it works on the small part and :meth:`join_logits` concatenates once.
        Changing the entity columns of the whole ``[B, L, V]`` tensor instead costs a copy of it
        (out of place) or, in place, a full-size copy and zero fill in the backward (~20 % of a
        DNTM step on CPU)."""
        offset, weight, bias = self.spec.entity_offset, self.decoder.weight, self.decoder.bias
        return (F.linear(dropped, weight[:offset], bias[:offset]),
                F.linear(dropped, weight[offset:], bias[offset:]))

    def join_logits(self, word_logits: torch.Tensor, entity_logits: torch.Tensor, batch,
                    positions: torch.Tensor | None = None, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, L, V_out]`` (or ``[N, V_out]`` at ``positions``) from :meth:`word_and_entity_logits`'
        parts, the entity mask applied to the entity part (``cfg.mask_unseen_entities``).

        With ``cfg.entity_class_output`` the result is the factored output's log-probabilities
        (:mod:`dynlm.modules.entity_class`), read from ``hidden`` (``[B, L, H]`` or ``[N, H]``: what
        the parts were computed from; required then)."""
        if self.cfg.mask_unseen_entities:
            entity_logits = mask_unseen_entities(entity_logits, at_positions(batch.entities_seen, positions), 0)
        if self.entity_class is not None:
            if hidden is None:
                raise ValueError("RNNLM.join_logits: model.entity_class_output needs the hidden state")
            return self.entity_class(word_logits, entity_logits, hidden)
        return torch.cat([word_logits, entity_logits], dim=-1)

    def mask_entities(self, logits: torch.Tensor, batch) -> torch.Tensor:
        """-inf for the entity ids that cannot come next (``cfg.mask_unseen_entities``, else as is).

        ``logits [B, L, V_out]`` of ``batch`` (a ``SentenceBatch`` with ``entities_seen``); see
        :mod:`dynlm.modules.entity_mask`. Every LM-task model applies it to its final logits.
        """
        if not self.cfg.mask_unseen_entities:
            return logits
        return mask_unseen_entities(logits, batch.entities_seen, self.spec.entity_offset)

    # ----- forward -----------------------------------------------------------------------
    @accepts_sentence_lists
    def forward(self, batch, state: RNNState) -> tuple[LMOutput, RNNState]:
        """One sentence step (a list of steps -> list of outputs, see ``accepts_sentence_lists``).

        Args:
            batch: a ``SentenceBatch`` (tokens ``[B, L]``, lengths ``[B]``, subword tensors).
            state: the state before the sentence.

        Returns:
            ``LMOutput`` (logits ``[N, V_out]`` at the real positions, or ``[B, L, V_out]`` when
            no row is padded; hidden ``[B, L, H]``) and the new state.
        """
        x = self.input_dropout(self.embed(batch))  # [B, L, E]
        hidden, state = self.run_rnn(x, state, batch.lengths, batch)  # [B, L, H]
        positions = real_positions(batch.lengths, hidden.size(1), hidden.device)  # [N] or None
        dropped = at_positions(self.output_dropout(hidden), positions)  # [N, H]: no output layer on padding
        logits = self.join_logits(*self.word_and_entity_logits(dropped), batch, positions, dropped)  # [N, V_out]
        return LMOutput(logits=logits, hidden=hidden, positions=positions), state


def _as_state(new, dtype: torch.dtype) -> RNNState:
    """The RNN's returned state, in the carried state's dtype: under bf16 autocast the state
    carried from sentence to sentence stays in full precision."""
    if isinstance(new, tuple):
        return RNNState(new[0].to(dtype), new[1].to(dtype))
    return RNNState(new.to(dtype), None)
