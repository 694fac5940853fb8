"""The anonymization-aware entity mask: exact -inf pattern, words untouched, and the
``entities_seen`` counts the batches carry."""

import torch

from dynlm.data.batching import collate_documents
from dynlm.modules.entity_mask import mask_unseen_entities


def test_ids_above_the_next_new_chain_get_minus_inf():
    logits = torch.arange(2 * 3 * 6, dtype=torch.float32).view(2, 3, 6)  # 2 words + 4 entities
    seen = torch.tensor([[0, 1, 3], [4, 2, 0]])
    masked = mask_unseen_entities(logits, seen, entity_offset=2)
    allowed = masked[..., 2:].isfinite()  # [B, L, 4]
    expected = torch.tensor([[[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]],
                             [[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]]], dtype=torch.bool)
    assert torch.equal(allowed, expected)
    assert torch.equal(masked[..., :2], logits[..., :2])
    assert torch.equal(masked[masked.isfinite()], logits[masked.isfinite()])


def test_batches_carry_the_chains_seen_up_to_each_input(tiny_spec, make_row):
    e1, e2 = tiny_spec.num_words, tiny_spec.num_words + 1
    row = make_row("a", [[5, e1, 6], [e1, e2, 7]])
    batch = collate_documents([row], tiny_spec)
    # inputs: <bos> 5 <unk1> 6 | <bos> <unk1> <unk2> 7
    assert batch.sentences[0].entities_seen.tolist() == [[0, 0, 1, 1]]
    assert batch.sentences[1].entities_seen.tolist() == [[1, 1, 2, 2]]
