"""Entity memory of the Dynamic Neural Text Model (Kobayashi et al., 2017, Sec. 3.2).

Every coreference chain e of a document keeps a dynamic representation d_e (zero before its
first context). After a sentence, the context vector d'_e of each mention (see
:mod:`dynlm.modules.context_encoder`) is merged into d_e with a merge function:

    max        d_e <- max(d_e, d'_e)                    (elementwise)
    gru        d_e <- GRU(d'_e, d_e)                    (input d'_e, hidden d_e)
    gru_relu   d_e <- ReLU(GRU(d'_e, d_e))
    latest     d_e <- d'_e
    attention  d_e  = sum_i softmax(s)_i d'_i over all past contexts i of e, s_i = v . tanh(W d'_i)

Attention is kept incrementally (no unbounded bank of past contexts): with the running
log-sum-exp m of the scores and the current average d_e,

    m'  = logaddexp(m, s)
    d_e <- exp(m - m') d_e + exp(s - m') d'_e

which is exactly the softmax average over all contexts seen so far (m = -inf before the first).

The memory is one tensor [B, K, D] (B documents, K = max chains, D = entity size). Updates are
vectorized over documents and entities; :func:`merge_mentions` loops only over the occurrence
rank of a mention inside one sentence (tiny), so several mentions of one entity in a sentence
are merged in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from dynlm.config import Config, ConfigError

MERGE_FUNCTIONS = ("max", "gru", "gru_relu", "latest", "attention")


class EntityMemoryState(NamedTuple):
    """Dynamic entity representations of a batch of documents.

    Attributes:
        memory: [B, K, D] d_e of chain e = k + 1 (row k); zero before its first context.
        score_lse: [B, K] running log-sum-exp of attention scores (-inf before the first context;
            used only by ``merge_fn="attention"``, carried for every merge function).
    """

    memory: torch.Tensor
    score_lse: torch.Tensor


@dataclass
class EntityMergeConfig(Config):
    """Attributes:
    entity_dim: size D of d_e and of the context vectors d'_e.
    merge_fn: how a new context is merged into d_e (see module docstring).
    """

    entity_dim: int
    merge_fn: Literal["max", "gru", "gru_relu", "latest", "attention"] = "gru"

    def validate(self) -> None:
        if self.entity_dim <= 0:
            raise ConfigError(f"entity_merge.entity_dim must be positive, got {self.entity_dim}")


def init_memory(batch_size: int, num_entities: int, entity_dim: int, device=None, dtype=None) -> EntityMemoryState:
    """An empty memory: d_e = 0 and no attention scores for every chain of every document."""
    return EntityMemoryState(
        memory=torch.zeros(batch_size, num_entities, entity_dim, device=device, dtype=dtype),
        score_lse=torch.full((batch_size, num_entities), float("-inf"), device=device, dtype=dtype),
    )


def reset_memory(state: EntityMemoryState, keep: torch.Tensor) -> EntityMemoryState:
    """Empty the memory of the documents where ``keep`` [B] is False (new/finished documents)."""
    keep = keep.to(torch.bool)
    return EntityMemoryState(
        memory=state.memory * keep[:, None, None].to(state.memory.dtype),
        score_lse=torch.where(keep[:, None], state.score_lse, torch.full_like(state.score_lse, float("-inf"))),
    )


def select_memory(state: EntityMemoryState, rows: torch.Tensor) -> EntityMemoryState:
    """The memory of the documents ``rows`` ``[R]`` (a copy): ``[R, K, D]`` / ``[R, K]``."""
    return EntityMemoryState(state.memory.index_select(0, rows), state.score_lse.index_select(0, rows))


def update_memory(state: EntityMemoryState, rows: torch.Tensor, part: EntityMemoryState) -> EntityMemoryState:
    """``state`` with the documents ``rows`` ``[R]`` replaced by ``part`` (out of place)."""
    return EntityMemoryState(state.memory.index_copy(0, rows, part.memory),
                             state.score_lse.index_copy(0, rows, part.score_lse))


def detach_memory(state: EntityMemoryState) -> EntityMemoryState:
    return EntityMemoryState(state.memory.detach(), state.score_lse.detach())


class EntityMerge(nn.Module):
    """One merge step d_e <- merge(d_e, d'_e) for the entities selected by ``update``."""

    def __init__(self, cfg: EntityMergeConfig):
        super().__init__()
        self.cfg = cfg
        dim = cfg.entity_dim
        if cfg.merge_fn in ("gru", "gru_relu"):
            self.cell = nn.GRUCell(dim, dim)
        elif cfg.merge_fn == "attention":
            self.score_proj = nn.Linear(dim, dim)  # W (with bias)
            self.score_vector = nn.Linear(dim, 1, bias=False)  # v

    compact_on_cpu = True  # merge only the updated rows on the CPU (False: the dense form everywhere)

    def forward(self, state: EntityMemoryState, context: torch.Tensor, update: torch.Tensor) -> EntityMemoryState:
        """Merge one context vector per (document, entity).

        Args:
            state: memory [B, K, D] and score_lse [B, K].
            context: [B, K, D] the new context vector d'_e of each entity (any value where not updated).
            update: [B, K] bool, which entities get this context.

        Returns:
            The new state; entities with ``update`` False are unchanged (exactly).
        """
        memory, score_lse = state.memory, state.score_lse
        if context.shape != memory.shape:
            raise ValueError(f"EntityMerge: context {tuple(context.shape)} != memory {tuple(memory.shape)}")
        if update.shape != memory.shape[:2]:
            raise ValueError(f"EntityMerge: update {tuple(update.shape)} != [B, K] {tuple(memory.shape[:2])}")
        if memory.device.type == "cpu" and self.compact_on_cpu:
            # Only the updated (document, entity) rows: a sentence mentions a few of the B x K
            # chains, and finding them is free on the CPU (on an accelerator it would be a host
            # synchronisation, so there the dense form below runs instead).
            dim = memory.size(-1)
            rows = update.reshape(-1).nonzero().squeeze(1)  # [M]
            flat_memory, flat_lse = memory.reshape(-1, dim), score_lse.reshape(-1)
            merged, merged_lse = self._merge(flat_memory[rows], context.reshape(-1, dim)[rows], flat_lse[rows])
            return EntityMemoryState(flat_memory.index_copy(0, rows, merged).view_as(memory),
                                     flat_lse.index_copy(0, rows, merged_lse).view_as(score_lse))
        merged, merged_lse = self._merge(memory, context, score_lse)
        new_memory = torch.where(update.unsqueeze(-1), merged, memory)
        return EntityMemoryState(new_memory, torch.where(update, merged_lse, score_lse))

    def _merge(self, memory: torch.Tensor, context: torch.Tensor,
               score_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The merged representation and running score of every row: ``memory``/``context``
        ``[..., D]``, ``score_lse [...]`` -> same shapes (``score_lse`` as is but for attention)."""
        merge_fn = self.cfg.merge_fn
        if merge_fn == "max":
            return torch.maximum(memory, context), score_lse
        if merge_fn == "latest":
            return context, score_lse
        if merge_fn in ("gru", "gru_relu"):
            dim = memory.size(-1)
            merged = self.cell(context.reshape(-1, dim), memory.reshape(-1, dim)).view_as(memory)
            return (F.relu(merged) if merge_fn == "gru_relu" else merged), score_lse
        # attention
        score = self.score_vector(torch.tanh(self.score_proj(context))).squeeze(-1)  # [...]
        merged_lse = torch.logaddexp(score_lse, score)  # [...]
        old_weight = torch.exp(score_lse - merged_lse).unsqueeze(-1)  # 0 before the first context
        new_weight = torch.exp(score - merged_lse).unsqueeze(-1)
        return old_weight * memory + new_weight * context, merged_lse


def mention_ranks(entity_ids: torch.Tensor, mask: torch.Tensor, num_entities: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One-hot mentions and the occurrence rank of each mention within its sentence.

    Args:
        entity_ids: [B, L] chain index 1..K of each token, 0 for other tokens.
        mask: [B, L] bool, real tokens.
        num_entities: K.

    Returns:
        mentions: [B, L, K] bool, token l of document b is a mention of chain k + 1.
        rank: [B, L, K] long, 0 for the first mention of that chain in the row, 1 for the second...

    Ids are range-checked here only on the CPU: on an accelerator the check would synchronise
    with the host every sentence, so there the data path checks them (``collate_documents``).
    """
    checkable = entity_ids.device.type == "cpu" and entity_ids.numel()
    if checkable and (int(entity_ids.min()) < 0 or int(entity_ids.max()) > num_entities):
        raise ValueError(
            f"entity_ids must be in [0, {num_entities}] (0 = not an entity), got "
            f"[{int(entity_ids.min())}, {int(entity_ids.max())}]"
        )
    chains = torch.arange(1, num_entities + 1, device=entity_ids.device)  # [K]
    mentions = (entity_ids.unsqueeze(-1) == chains) & mask.unsqueeze(-1)  # [B, L, K]
    rank = mentions.long().cumsum(dim=1) - 1  # [B, L, K]
    return mentions, rank


def merge_mentions(
    merge: EntityMerge,
    state: EntityMemoryState,
    contexts: torch.Tensor,
    entity_ids: torch.Tensor,
    mask: torch.Tensor,
    num_ranks: int | None = None,
) -> EntityMemoryState:
    """Merge the context vector of every mention of a sentence, in sentence order.

    Args:
        merge: the merge step.
        state: memory [B, K, D] before the sentence.
        contexts: [B, L, D] context vector of every position (from the context encoder).
        entity_ids: [B, L] chain index 1..K of each token, 0 otherwise.
        mask: [B, L] bool; masked positions never update the memory.
        num_ranks: at least the most mentions of one chain in a row (a batch knows it on the CPU:
            ``SentenceBatch.step_mention_repeats``); None: counted here, which on an accelerator
            synchronises with the host. Extra ranks merge nothing.

    Returns:
        The memory after all mentions of the sentence were merged.
    """
    num_entities = state.memory.shape[1]
    mentions, rank = mention_ranks(entity_ids, mask, num_entities)
    if num_ranks is None:
        num_ranks = int(mentions.sum(dim=1).max()) if mentions.numel() else 0  # most mentions of one chain
    for r in range(num_ranks):
        selected = mentions & (rank == r)  # [B, L, K], at most one position per (b, k)
        context = torch.einsum("blk,bld->bkd", selected.to(contexts.dtype), contexts)  # [B, K, D]
        state = merge(state, context, selected.any(dim=1))
    return state
