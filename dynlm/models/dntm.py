"""Dynamic Neural Text Model (Kobayashi et al., 2017): an RNN LM with dynamic entity embeddings.

Every coreference chain e of a document (the anonymized identifier ``<unk{e}>``) keeps a
dynamic representation d_e, zero before its first context. The baseline :class:`RNNLM` is
reused as is (embedding, recurrent layers, output layer); the DNTM adds

* input dynamics:  x_e = W_dx d_e + b^x_e   (b^x_e: the static input embedding of ``<unk{e}>``)
* output dynamics: y_e = W_dy d_e + b^y_e   (b^y_e: the static output vector of ``<unk{e}>``),
  i.e. the logit of e gets ``h . W_dy d_e`` on top of the baseline logit;
* optionally (``new_entity_score``) a learned score for "a new chain comes next" on the one
  identifier a new chain can take (:mod:`dynlm.modules.new_entity_score`), and
  (``gate_dynamic_scores``) a per-position gate on the dynamic scores (:mod:`dynlm.modules.score_gate`);
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
from dynlm.models.outputs import LMOutput, forward_sentences
from dynlm.models.rnn_lm import RNNLM, RNNState
from dynlm.modules.context_encoder import ContextEncoder, ContextEncoderConfig
from dynlm.modules.entity_memory import (
    EntityMemoryState,
    EntityMerge,
    EntityMergeConfig,
    detach_memory,
    init_memory,
    merge_mentions,
    reset_memory,
)
from dynlm.modules.new_entity_score import NewEntityScore
from dynlm.modules.score_gate import ScoreGate
from dynlm.vocab_spec import VocabSpec


class DNTMState(NamedTuple):
    """Recurrent state of the DNTM.

    Attributes:
        rnn: the LM's recurrent state (``h``/``c`` ``[num_layers, B, H]``).
        entities: the entity memory (``memory [B, K, D]``, ``score_lse [B, K]``).
    """

    rnn: RNNState
    entities: EntityMemoryState


def dntm_small(**overrides) -> ModelConfig:
    """A small DNTM for tests and smoke runs (64-dim, 1-layer LSTM, dynamic=both, GRU merge).

    ``overrides`` are top-level ModelConfig fields; pass ``dntm={"merge_fn": ...}`` for the
    DNTM settings.
    """
    cfg = dict(type="dntm", backbone="lstm", embed_dim=64, hidden_dim=64, num_layers=1, dropout=0.1,
               dntm=dict(dynamic="both", merge_fn="gru"))
    return ModelConfig.from_dict({**cfg, **overrides})


def dntm_base(**overrides) -> ModelConfig:
    """The report size: 256-dim embeddings, 2 x 512 LSTM, dropout 0.3 (as ``rnn_lm_base``)."""
    cfg = dict(type="dntm", backbone="lstm", embed_dim=256, hidden_dim=512, num_layers=2, dropout=0.3,
               dntm=dict(dynamic="both", merge_fn="gru"))
    return ModelConfig.from_dict({**cfg, **overrides})


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
        if settings.new_entity_score:
            self.new_entity = NewEntityScore(cfg.hidden_dim)
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
        return DNTMState(
            rnn=self.lm.init_state(batch_size, device),
            entities=init_memory(batch_size, self.spec.num_entities, self.entity_dim, device=device),
        )

    @staticmethod
    def detach_state(state: DNTMState) -> DNTMState:
        """Cut the autograd history of the LM state and the memory (truncated BPTT)."""
        return DNTMState(RNNLM.detach_state(state.rnn), detach_memory(state.entities))

    @staticmethod
    def reset_state(state: DNTMState, keep: torch.Tensor) -> DNTMState:
        """Zero the LM state and empty the memory of the rows where ``keep`` [B] is False."""
        keep = keep.to(state.entities.memory.device)
        return DNTMState(RNNLM.reset_state(state.rnn, keep), reset_memory(state.entities, keep))

    # ----- forward -----------------------------------------------------------------------
    def _entity_vectors(self, memory: torch.Tensor, entity_ids: torch.Tensor) -> torch.Tensor:
        """d_e of each token: ``memory [B, K, D]``, ``entity_ids [B, L]`` -> ``[B, L, D]`` (0 for words)."""
        padded = torch.cat([memory.new_zeros(memory.size(0), 1, memory.size(2)), memory], dim=1)  # [B, 1+K, D]
        index = entity_ids.unsqueeze(-1).expand(-1, -1, memory.size(2))  # [B, L, D]
        return torch.gather(padded, 1, index)

    def forward_sentence(self, batch, state: DNTMState) -> tuple[LMOutput, DNTMState]:
        """One sentence step.

        Args:
            batch: a ``SentenceBatch`` (``tokens``, ``mask``, ``lengths``, ``entity_ids`` [B, L]).
            state: the state after the previous sentence of the same documents.

        Returns:
            ``LMOutput`` (``logits [B, L, V_out]``, ``hidden [B, L, H]``) and the state after the
            sentence (memory updated with the sentence's mentions).
        """
        entity_ids = batch.entity_ids
        if entity_ids.numel() and int(entity_ids.max()) > self.spec.num_entities:
            raise ValueError(
                f"DNTM: entity id {int(entity_ids.max())} exceeds spec.num_entities={self.spec.num_entities}"
            )
        memory = state.entities.memory  # [B, K, D], merged from the previous sentences
        x = self.lm.embed(batch)  # [B, L, E], static b^x
        if self.use_input:
            x = x + self.input_proj(self._entity_vectors(memory, entity_ids))  # + W_dx d_e at mentions
        x = self.lm.input_dropout(x)
        hidden, rnn_state = self.lm.run_rnn(x, state.rnn, batch.lengths)  # [B, L, H]
        dropped = self.lm.output_dropout(hidden)
        logits = self.lm.decoder(dropped)  # [B, L, V_out], static b^y
        if self.use_output:
            entity_scores = torch.einsum("blh,bkh->blk", dropped, self.output_proj(memory))  # h . W_dy d_e
            if self.cfg.dntm.gate_dynamic_scores:
                entity_scores = self.score_gate(dropped, entity_scores)
            offset = self.spec.entity_offset
            logits = torch.cat([logits[..., :offset], logits[..., offset:] + entity_scores], dim=-1)
        if self.cfg.dntm.new_entity_score:
            logits = self.new_entity(logits, dropped, batch.entities_seen, self.spec.entity_offset)
        logits = self.lm.mask_entities(logits, batch)
        entities = state.entities
        if self.dynamic != "none":
            contexts = self.context_encoder(x, batch.mask)  # [B, L, D]
            entities = merge_mentions(self.merge, entities, contexts, entity_ids, batch.mask)
        return LMOutput(logits=logits, hidden=hidden), DNTMState(rnn_state, entities)

    def forward(self, batch, state: DNTMState):
        """``SentenceBatch`` -> ``(LMOutput, state)``; a list of them -> ``(list[LMOutput], state)``."""
        return forward_sentences(self.forward_sentence, batch, state)
