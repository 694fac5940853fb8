"""Anonymization-aware entity output: an entity identifier that cannot come next gets probability 0.

Anonymization (:mod:`dynlm.data.anonymize`) numbers the coreference chains of a document in
order of first appearance. So after n chains have appeared, the next token can be a word, one
of the seen ``<unk1>`` ... ``<unk{n}>``, or the new chain ``<unk{n+1}>``, never ``<unk{n+2}>``
or above. Setting those logits to -inf is exact (the softmax renormalizes over what can occur)
and costs one comparison per logit. ``SentenceBatch.entities_seen [B, L]`` gives n at every
input position (:mod:`dynlm.data.batching`).
"""

from __future__ import annotations

import torch


def mask_unseen_entities(logits: torch.Tensor, entities_seen: torch.Tensor, entity_offset: int) -> torch.Tensor:
    """``logits`` with -inf for every entity identifier above ``<unk{n+1}>``.

    Args:
        logits: ``[B, L, V_out]``; columns ``entity_offset + k - 1`` score ``<unk{k}>`` (k = 1..K).
        entities_seen: ``[B, L]`` long n, chains seen up to and including each input position.
        entity_offset: the column of ``<unk1>``.

    Returns:
        ``[B, L, V_out]``, the word columns unchanged.
    """
    num_entities = logits.size(-1) - entity_offset
    if num_entities <= 0:
        return logits
    chain = torch.arange(1, num_entities + 1, device=logits.device)  # [K]
    impossible = chain > (entities_seen.to(logits.device).unsqueeze(-1) + 1)  # [B, L, K]
    entity_logits = logits[..., entity_offset:].masked_fill(impossible, float("-inf"))
    return torch.cat([logits[..., :entity_offset], entity_logits], dim=-1)
