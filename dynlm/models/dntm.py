"""Dynamic Neural Text Model (Kobayashi et al., 2017): an RNN LM with dynamic entity embeddings.

Every coreference chain e of a document (the anonymized identifier ``<unk{e}>``) keeps a
dynamic representation d_e, zero before its first context. The baseline :class:`RNNLM` is
reused as is (embedding, recurrent layers, output layer); the DNTM adds

* input dynamics:  x_e = W_dx d_e + b^x_e   (b^x_e: the static input embedding of ``<unk{e}>``)
* output dynamics: y_e = W_dy d_e + b^y_e   (b^y_e: the static output vector of ``<unk{e}>``),
  i.e. the logit of e gets ``h . W_dy d_e`` on top of the baseline logit;
* optionally (``new_entity_score``) a learned score for "a new chain comes next" on the one
  identifier a new chain can take (:mod:`dynlm.modules.new_entity_score`; with
  ``new_entity_replaces_static`` it is that identifier's whole logit), and
  (``gate_dynamic_scores``) a per-position gate on the dynamic scores (:mod:`dynlm.modules.score_gate`);
* optionally (beyond the paper) a per-document state of the entity output rows: a cache of
  the hidden states that predicted each chain's mentions (``mention_cache``,
  :mod:`dynlm.modules.mention_cache`), or the rows adapted after every sentence by a learned
  step on the model's own prediction errors (``adapt_entity_rows``,
  :mod:`dynlm.modules.entity_row_adaptation`: dynamic evaluation of ``<unk{k}>``, learned), and
  with ``entity_row_step="token"`` also after every position inside a sentence;
* after each sentence, a context encoder (:mod:`dynlm.modules.context_encoder`) gives a context
  vector d'_e for every mention, merged into d_e in sentence order
  (:mod:`dynlm.modules.entity_memory`).

Sentence i + 1 is therefore read with the representations merged from sentences 1..i. A
forward call must therefore get whole sentences (``needs_whole_sentences``): given the first
half of a sentence, the model would merge its mentions before the second half is read, from
contexts of the half alone, which is another model. With
d_e = 0 the model computes exactly what the baseline RNNLM with the same weights computes;
``dynamic="none"`` is the baseline itself.

The context encoder reads the vectors the LM reads (input embeddings of ``batch.tokens``, with
input dynamics and input dropout applied), i.e. ``<bos> w_1 ... w_n`` without ``<eos>``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from dynlm.models.config import ModelConfig
from dynlm.models.outputs import LMOutput, at_positions, forward_sentences, real_positions
from dynlm.models.rnn_lm import RNNLM, RNNState
from dynlm.modules.context_encoder import ContextEncoder, ContextEncoderConfig
from dynlm.modules.entity_mask import mask_unseen_entities
from dynlm.modules.entity_memory import (
    EntityMemoryState,
    EntityMerge,
    EntityMergeConfig,
    detach_memory,
    init_memory,
    merge_mentions,
    reset_memory,
    select_memory,
    update_memory,
)
from dynlm.modules.entity_row_adaptation import EntityRowAdaptation
from dynlm.modules.mention_cache import MentionCache
from dynlm.modules.new_entity_score import NewEntityScore
from dynlm.modules.score_gate import ScoreGate
from dynlm.vocab_spec import VocabSpec


class DNTMState(NamedTuple):
    """Recurrent state of the DNTM.

    Attributes:
        rnn: the LM's recurrent state (``h``/``c`` ``[num_layers, B, H]``).
        entities: the entity memory (``memory [B, K, D]``, ``score_lse [B, K]``).
        entity_rows: ``[B, K, H]`` the per-document state of the entity output rows (the mention
            cache, or the shift of the adapted rows), else None.
    """

    rnn: RNNState
    entities: EntityMemoryState
    entity_rows: torch.Tensor | None = None


#: The paper's DNTM (Kobayashi et al., 2017): dynamic=both, GRU merge, none of dynlm's additions
#: (the new-entity logit, per-document entity rows) that :class:`DNTMSettings`'s defaults switch on.
PAPER_DNTM = dict(dynamic="both", merge_fn="gru", new_entity_score=False, new_entity_replaces_static=False,
                  adapt_entity_rows=False, entity_row_step="sentence")


def _paper_dntm(cfg: dict, overrides: dict) -> ModelConfig:
    """``cfg`` with ``overrides``; ``overrides["dntm"]`` changes :data:`PAPER_DNTM` key by key."""
    settings = {**PAPER_DNTM, **overrides.get("dntm", {})}
    return ModelConfig.from_dict({**cfg, **overrides, "dntm": settings})


def dntm_small(**overrides) -> ModelConfig:
    """The paper's DNTM, small, for tests and smoke runs (64-dim, 1-layer LSTM, :data:`PAPER_DNTM`).

    ``overrides`` are top-level ModelConfig fields; pass ``dntm={"merge_fn": ...}`` to change
    DNTM settings (the others stay the paper's).
    """
    cfg = dict(type="dntm", backbone="lstm", embed_dim=64, hidden_dim=64, num_layers=1, dropout=0.1)
    return _paper_dntm(cfg, overrides)


def dntm_base(**overrides) -> ModelConfig:
    """The paper's DNTM (:data:`PAPER_DNTM`) at the report size: 256-dim embeddings, 2 x 512 LSTM,
    dropout 0.3 (as ``rnn_lm_base``)."""
    cfg = dict(type="dntm", backbone="lstm", embed_dim=256, hidden_dim=512, num_layers=2, dropout=0.3)
    return _paper_dntm(cfg, overrides)


class DNTM(nn.Module):
    """Baseline RNNLM + entity memory + dynamic input/output entity embeddings.

    Args:
        cfg: the model config; ``cfg.dntm`` holds ``dynamic``, ``merge_fn``, ``entity_dim``
            (0: ``embed_dim``) and ``context_hidden_dim`` (0: ``hidden_dim``).
        spec: vocabulary sizes; the memory holds ``spec.num_entities`` chains per document.

    Only the parts the chosen ``dynamic`` uses are created (so DDP sees no unused parameters):
    ``input_proj`` (W_dx) for input/both, ``output_proj`` (W_dy) for output/both, and the context
    encoder + merge for every value except ``none``.
    """

    needs_grad_at_eval = False
    # A forward call must get whole sentences: the memory merges a sentence's mentions after it,
    # from a bidirectional encoder over all of it (callers that cut segments, e.g. dynamic
    # evaluation, cut at sentence ends).
    needs_whole_sentences = True
    # A row may hold several documents: the LM state and the memory are reset where one starts.
    supports_packed_documents = True
    @property
    def dynamic_eval_static_params(self) -> tuple[str, ...]:
        """What dynamic evaluation leaves static unless told otherwise (dynlm.dynamic_eval): every
        weight outside the LM (``lm.*``: embedding, recurrent layers, output layer), i.e. W_dx, W_dy,
        the context encoder, the merge, the new-entity score and the rate of the adapted rows.

        Measured (issue 18, benchmarks/results/dntm_quality.md): W_dy (``h . W_dy d_e``: one step
        shifts every entity score at once) makes re-appearing entities worse than no adaptation and
        diverges at eta 1e-2; the other memory-side weights change every chain's dynamic embedding
        at once and cost re-appearing entities too. On the embedded default's model at the issue's
        size, adapting ``lm.*`` only has the lowest validation perplexity of the groups tried at
        both seeds, and is below ``rnn`` + dynamic evaluation on re-appearing entities at both.
        """
        return tuple(name for name, _ in self.named_parameters() if not name.startswith("lm."))

    def __init__(self, cfg: ModelConfig, spec: VocabSpec):
        super().__init__()
        if spec.num_entities < 1 and cfg.dntm.dynamic != "none":
            raise ValueError("DNTM: spec.num_entities must be >= 1 for dynamic entity embeddings")
        self.cfg = cfg
        self.spec = spec
        self.lm = RNNLM(cfg, spec)
        settings = cfg.dntm
        self.dynamic = settings.dynamic
        self.entity_dim = settings.entity_dim or cfg.embed_dim
        self.use_input = settings.dynamic in ("input", "both")
        self.use_output = settings.dynamic in ("output", "both")
        if self.use_input:
            self.input_proj = nn.Linear(self.entity_dim, cfg.embed_dim, bias=False)  # W_dx
        if self.use_output:
            self.output_proj = nn.Linear(self.entity_dim, cfg.hidden_dim, bias=False)  # W_dy
            if settings.gate_dynamic_scores:
                self.score_gate = ScoreGate(cfg.hidden_dim)
        if settings.mention_cache:
            self.mention_cache = MentionCache(cfg.hidden_dim)
        if settings.adapt_entity_rows:
            self.row_adaptation = EntityRowAdaptation(cfg.hidden_dim)
        if settings.new_entity_score:
            self.new_entity = NewEntityScore(cfg.hidden_dim, settings.new_entity_replaces_static, spec.num_entities)
        if settings.dynamic != "none":
            self.context_encoder = ContextEncoder(
                ContextEncoderConfig(
                    input_dim=cfg.embed_dim,
                    hidden_dim=settings.context_hidden_dim or cfg.hidden_dim,
                    output_dim=self.entity_dim,
                    cell=cfg.backbone,
                )
            )
            self.merge = EntityMerge(EntityMergeConfig(entity_dim=self.entity_dim, merge_fn=settings.merge_fn))

    # ----- state -------------------------------------------------------------------------
    def init_state(self, batch_size: int, device: torch.device | str | None = None) -> DNTMState:
        """Zero LM state and an empty entity memory for ``batch_size`` documents."""
        device = device if device is not None else self.lm.decoder.weight.device
        rows = None
        if self.cfg.dntm.mention_cache or self.cfg.dntm.adapt_entity_rows:
            rows = torch.zeros(batch_size, self.spec.num_entities, self.cfg.hidden_dim, device=device)
        return DNTMState(
            rnn=self.lm.init_state(batch_size, device),
            entities=init_memory(batch_size, self.spec.num_entities, self.entity_dim, device=device),
            entity_rows=rows,
        )

    @staticmethod
    def detach_state(state: DNTMState) -> DNTMState:
        """Cut the autograd history of the LM state, the memory and the entity rows (truncated BPTT)."""
        rows = None if state.entity_rows is None else state.entity_rows.detach()
        return DNTMState(RNNLM.detach_state(state.rnn), detach_memory(state.entities), rows)

    @staticmethod
    def reset_state(state: DNTMState, keep: torch.Tensor) -> DNTMState:
        """Zero the LM state, empty the memory and the entity rows of the rows where ``keep`` [B] is False."""
        keep = keep.to(state.entities.memory.device)
        rows = state.entity_rows
        if rows is not None:
            rows = rows * keep.view(-1, 1, 1).to(rows.dtype)
        return DNTMState(RNNLM.reset_state(state.rnn, keep), reset_memory(state.entities, keep), rows)

    # ----- forward -----------------------------------------------------------------------
    def _entity_vectors(self, memory: torch.Tensor, entity_ids: torch.Tensor) -> torch.Tensor:
        """d_e of each token: ``memory [B, K, D]``, ``entity_ids [B, L]`` -> ``[B, L, D]`` (0 for words)."""
        padded = torch.cat([memory.new_zeros(memory.size(0), 1, memory.size(2)), memory], dim=1)  # [B, 1+K, D]
        index = entity_ids.unsqueeze(-1).expand(-1, -1, memory.size(2))  # [B, L, D]
        return torch.gather(padded, 1, index)

    def forward_step(self, batch, state: DNTMState) -> tuple[LMOutput, DNTMState]:
        """One step: a sentence of every document, or a chunk of whole sentences of every document.

        The LM's recurrent state never feeds the memory, so the step runs in three parts:

        1. sentence by sentence (``s = 0 .. S-1``, batched across the rows that have a sentence
           s, cut to its longest length there: ``batch.step_sentence_lengths``): the input vectors
           of sentence s (static, + ``W_dx d_e`` from the memory merged up to sentence s - 1 with
           input dynamics; input dropout), the context encoder over them and the merge of the
           sentence's mentions; where a packed row starts a document (``batch.doc_start``) its
           memory is emptied before that sentence. (With ``dynamic="output"`` the encoder could
           read all sentences in one call, but over the step's widest sentence: slower on CPU.)
        2. ONE recurrent pass over the step's positions (a chunk is read like a plain LM reads it);
        3. the output layer at the real positions, with the entity scores of each position taken
           against the memory as it was before the position's sentence (a snapshot per sentence).

        Args:
            batch: a ``SentenceBatch`` whose rows hold whole sentences (``tokens``, ``mask``,
                ``lengths``, ``entity_ids``, ``sentence_id``, the CPU ``step_sentence_lengths`` and
                ``step_mention_repeats``).
            state: the state after the previous step of the same documents.

        Returns:
            ``LMOutput`` (``logits [N, V_out]`` at the real positions, ``LMOutput.positions``, or
            ``[B, L, V_out]`` when no row is padded; ``hidden [B, L, H]``) and the state after the
            step (memory updated with the mentions of all its sentences).
        """
        entity_ids = batch.entity_ids  # [B, L]; ids <= num_entities is checked when batches are built
        sentences = _SentenceIndex(batch)
        x_static = self.lm.embed(batch)  # [B, L, E], static b^x
        entities = state.entities
        # [B, S] bool: sentence s of the row starts a document (memory emptied before it); None: none does
        starts = sentences.at_first_positions(batch.doc_start) if len(batch.reset_columns) else None
        x, entities, snapshots = self._read_sentences(sentences, x_static, entity_ids, entities, starts)  # part 1
        hidden, rnn_state = self.lm.run_rnn(x, state.rnn, batch.lengths, batch)  # [B, L, H], one pass (split where a document starts)
        positions = real_positions(batch.lengths, hidden.size(1), hidden.device)  # [N] or None: no padding
        dropped = self.lm.output_dropout(hidden)  # [B, L, H]
        at_real = at_positions(dropped, positions)  # [N, H]: the output layer skips the padding
        word_logits, entity_logits = self.lm.word_and_entity_logits(at_real)  # [N, V_out - K], [N, K]: static b^y
        entity_rows = state.entity_rows
        if self.cfg.dntm.mention_cache:
            cache_scores, entity_rows = self.mention_cache(dropped, batch.target_entity_ids,
                                                           batch.doc_start if len(batch.reset_columns) else None,
                                                           entity_rows)
            entity_logits = entity_logits + at_positions(cache_scores, positions)  # [N, K]
        if self.use_output:
            # h . W_dy d_e = (h W_dy) . d_e: project the L positions, not the S x K memory snapshots
            queries = dropped @ self.output_proj.weight  # [B, L, D]
            entity_scores = sentences.scores_against(queries, torch.stack(snapshots, dim=1), batch.sentence_id)  # [B, L, K]
            entity_scores = at_positions(entity_scores, positions)  # [N, K]
            if self.cfg.dntm.gate_dynamic_scores:
                entity_scores = self.score_gate(at_real, entity_scores)
            entity_logits = entity_logits + entity_scores
        if self.cfg.dntm.new_entity_score:
            entity_logits = self.new_entity(entity_logits, at_real, at_positions(batch.entities_seen, positions), 0)
        if self.cfg.dntm.adapt_entity_rows:
            entity_logits, entity_rows = self._adapt_entity_rows(sentences, starts, batch, positions, dropped,
                                                                 word_logits, entity_logits, entity_rows)
        logits = self.lm.join_logits(word_logits, entity_logits, batch, positions, at_real)  # [N, V_out], the entity mask applied
        return LMOutput(logits=logits, hidden=hidden, positions=positions), DNTMState(rnn_state, entities, entity_rows)

    def _read_sentences(self, sentences: "_SentenceIndex", x_static: torch.Tensor, entity_ids: torch.Tensor,
                        entities: EntityMemoryState, starts: torch.Tensor | None,
                        ) -> tuple[torch.Tensor, EntityMemoryState, list[torch.Tensor]]:
        """Part 1 of ``forward_step``: the input vectors ``[B, L, E]`` sentence by sentence, the memory
        after the step's mentions, and the memory before each sentence (``[B, K, D]`` each; none when
        ``dynamic="none"``: the inputs are then the static vectors with input dropout)."""
        snapshots = []  # memory before each sentence, [B, K, D] each
        if self.dynamic == "none":
            return self.lm.input_dropout(x_static), entities, snapshots
        x_flat, ids_flat = sentences.padded(x_static), sentences.padded(entity_ids)  # [B * L + 1, E], [B * L + 1]
        parts, places = [], []  # per sentence s: its rows' input vectors [R * width, E] and flat positions
        for s in range(sentences.num_sentences):
            if starts is not None:
                entities = reset_memory(entities, ~starts[:, s])
            snapshots.append(entities.memory)
            # the rows that have a sentence s, its positions there [R, width] (padding: the spare slot) and
            # mask, and the most mentions of one chain in it
            rows, index, mask, repeats = sentences.sentence(s)
            if rows.numel() == 0:  # an inactive step (a DDP lockstep pad)
                continue
            ids = ids_flat[index]  # [R, width]
            present = select_memory(entities, rows)
            x_s = x_flat[index]  # [R, width, E] static b^x
            if self.use_input:
                x_s = x_s + self.input_proj(self._entity_vectors(present.memory, ids))
            x_s = self.lm.input_dropout(x_s)  # (a mask per document and sentence)
            entities = update_memory(entities, rows, self._merge_sentence(present, x_s, ids, mask, repeats))
            parts.append(x_s.flatten(0, 1))
            places.append(index.flatten())
        x = sentences.assemble(parts, places, x_static) if parts else torch.zeros_like(x_static)  # [B, L, E]
        return x, entities, snapshots

    def _adapt_entity_rows(self, sentences: "_SentenceIndex", starts: torch.Tensor | None, batch,
                           positions: torch.Tensor | None, dropped: torch.Tensor, word_logits: torch.Tensor,
                           entity_logits: torch.Tensor, shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The entity logits with ``h · Δb_k`` added, sentence by sentence, and Δb after the step.

        ``word_logits [N, V_out - K]`` / ``entity_logits [N, K]`` (``[B, L, *]`` when ``positions``
        is None) are the logits without the shift; ``dropped [B, L, H]``; ``shift [B, K, H]`` Δb
        before the step (:mod:`dynlm.modules.entity_row_adaptation`).
        """
        spare = sentences.spare

        def flat(values: torch.Tensor) -> torch.Tensor:  # at the real positions -> [B * L + 1, *]
            if positions is None:
                return sentences.padded(values)
            out = values.new_zeros(spare + 1, *values.shape[1:])
            return out.index_copy(0, positions, values)

        hidden, logits = sentences.padded(dropped), flat(entity_logits)  # [B * L + 1, H], [B * L + 1, K]
        word_log_norm = flat(torch.logsumexp(word_logits, dim=-1))  # [B * L + 1]
        targets, seen = sentences.padded(batch.target_entity_ids), sentences.padded(batch.entities_seen)
        # with the new-entity logit in place of <unk{n+1}>'s, that logit holds no row (entity_row_adaptation)
        replaces_row = self.cfg.dntm.new_entity_score and self.cfg.dntm.new_entity_replaces_static
        chain_ids = torch.arange(entity_logits.size(-1), device=entity_logits.device)  # [K] 0-based k
        parts, places = [], []
        for s in range(sentences.num_sentences):
            if starts is not None:  # a document starts at sentence s of the row: its rows start unshifted
                shift = shift * (~starts[:, s]).view(-1, 1, 1).to(shift.dtype)
            rows, index, mask, _ = sentences.sentence(s)
            if rows.numel() == 0:
                continue
            h_s = hidden[index]  # [R, width, H]
            shifted = logits[index] + self.row_adaptation.scores(h_s, shift[rows])  # [R, width, K]
            final = shifted
            if self.cfg.mask_unseen_entities:
                final = mask_unseen_entities(shifted, seen[index], 0)
            row_in_logit = None
            if replaces_row:  # chains seen before each target: their logits hold the row
                row_in_logit = chain_ids < seen[index].unsqueeze(-1)  # [R, width, K]
            error = self.row_adaptation.errors(final, word_log_norm[index], targets[index], mask, row_in_logit)
            shift = shift.index_add(0, rows, self.row_adaptation.change(h_s, error))  # + [R, K, H]
            if self.cfg.dntm.entity_row_step == "token":  # the sentence's earlier positions count at once
                shifted = shifted + self.row_adaptation.within_sentence_scores(h_s, error)
            parts.append(shifted.flatten(0, 1))
            places.append(index.flatten())
        if not parts:
            return entity_logits, shift
        like = dropped[..., :1]  # [B, L, 1]: the layout to assemble into
        assembled = sentences.assemble(parts, places, like)  # [B, L, K]
        return at_positions(assembled, positions), shift

    def _merge_sentence(self, entities, x_s: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, repeats: int):
        """The memory after one sentence: ``x_s [B, P, E]`` its input vectors, ``ids`` / ``mask`` ``[B, P]``,
        ``repeats`` the most mentions of one chain in it (from the CPU batch)."""
        return merge_mentions(self.merge, entities, self.context_encoder(x_s, mask), ids, mask, num_ranks=repeats)

    def forward(self, batch, state: DNTMState):
        """``SentenceBatch`` -> ``(LMOutput, state)``; a list of them -> ``(list[LMOutput], state)``."""
        return forward_sentences(self.forward_step, batch, state)


class _SentenceIndex:
    """Where each sentence of a step's rows lies among the step's flat positions ``b * L + l``.

    Built from the CPU tensors ``step_sentence_lengths`` / ``step_mention_repeats`` (no device
    synchronisation). A row's sentences follow each other from column 0 (whole-sentence steps).
    Per sentence s the model reads ``[R, width]`` positions of the R rows that have one, padded to
    their longest; padding reads and writes one spare slot ``B * L`` (:meth:`padded`). Nothing
    is laid out as a ``[B, S, P]`` grid: with ragged sentences that grid is mostly padding.
    """

    def __init__(self, batch):
        self.lengths = batch.step_sentence_lengths  # [B, S] on the CPU
        self.repeats = batch.step_mention_repeats  # [B, S] on the CPU
        self.batch_size, self.width = batch.tokens.shape
        self.num_sentences = self.lengths.size(1)
        self.spare = self.batch_size * self.width
        self.first = self.lengths.cumsum(dim=1) - self.lengths  # [B, S] column of each sentence's first position
        self.device = batch.tokens.device

    def padded(self, values: torch.Tensor) -> torch.Tensor:
        """``[B, L, *]`` -> ``[B * L + 1, *]`` with a zero spare slot at the end."""
        flat = values.flatten(0, 1)
        return torch.cat([flat, flat.new_zeros(1, *flat.shape[1:])])

    def sentence(self, s: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """Sentence ``s``: the rows that have one ``[R]``, their positions ``[R, width]`` and mask
        (on the batch's device), and the most mentions of one chain in it."""
        lengths = self.lengths[:, s]
        rows = lengths.gt(0).nonzero().squeeze(1)  # [R] on the CPU
        width = max(1, int(lengths.max()))
        offsets = torch.arange(width)
        mask = offsets < lengths[rows].unsqueeze(1)  # [R, width]
        index = torch.where(mask, rows.unsqueeze(1) * self.width + self.first[rows, s].unsqueeze(1) + offsets,
                            torch.full_like(mask, self.spare, dtype=torch.long))
        return (rows.to(self.device, non_blocking=True), index.to(self.device, non_blocking=True),
                mask.to(self.device, non_blocking=True), int(self.repeats[:, s].max()))

    def at_first_positions(self, values: torch.Tensor) -> torch.Tensor:
        """``values [B, L]`` at the first position of each row's sentence s -> ``[B, S]`` (zero /
        False where the row has no sentence s)."""
        rows = torch.arange(self.batch_size).unsqueeze(1)
        index = torch.where(self.lengths > 0, rows * self.width + self.first, torch.full_like(self.first, self.spare))
        return self.padded(values)[index.to(self.device, non_blocking=True)]

    def assemble(self, parts: list[torch.Tensor], places: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """``[B, L, *]`` (like ``like``) with ``parts[i] [n_i, *]`` at the flat positions ``places[i] [n_i]``,
        zeros elsewhere (what lands on the spare slot is dropped)."""
        values = torch.cat(parts) if len(parts) > 1 else parts[0]
        index = torch.cat(places) if len(places) > 1 else places[0]
        out = values.new_zeros(self.spare + 1, *values.shape[1:]).index_copy(0, index, values)
        return out[:-1].view(*like.shape[:2], *values.shape[1:])

    @staticmethod
    def scores_against(queries: torch.Tensor, snapshots: torch.Tensor, sentence_id: torch.Tensor) -> torch.Tensor:
        """``queries [B, L, D]`` · the memory before each position's sentence: ``snapshots
        [B, S, K, D]``, ``sentence_id [B, L]`` -> ``[B, L, K]``. One batched product against every
        snapshot of the row, then each position's sentence is picked."""
        batch_size, num_sentences, num_entities, dim = snapshots.shape
        width = queries.size(1)
        every = torch.bmm(queries, snapshots.reshape(batch_size, num_sentences * num_entities, dim).transpose(1, 2))
        every = every.view(batch_size, width, num_sentences, num_entities)  # [B, L, S, K]
        pick = sentence_id.clamp(max=num_sentences - 1).view(batch_size, width, 1, 1).expand(-1, -1, 1, num_entities)
        return every.gather(2, pick).squeeze(2)
