"""dynlm.data.sequences: the unit vocabulary and next-unit batches of sequence tasks."""

from __future__ import annotations

import torch

from dynlm.data.sequences import EOS, PAD, UNK, NextUnitBatch, UnitVocabulary


def test_the_vocabulary_keeps_the_most_frequent_units_in_a_fixed_order():
    vocab = UnitVocabulary.fit({"a": 3, "b": 5, "c": 3, "d": 1}, max_units=3)
    assert vocab.units == ["b", "a", "c"] and vocab.spec.num_units == 6  # ties by the unit
    assert vocab.encode("abd") == [4, 3, UNK, EOS]
    assert UnitVocabulary.from_json(vocab.to_json()).ids == vocab.ids


def test_a_batch_reads_each_sequence_after_eos_and_pads_the_rest():
    batch = NextUnitBatch.collate([[5, 6, EOS], [7, EOS]])
    assert batch.targets.tolist() == [[5, 6, EOS], [7, EOS, PAD]]
    assert batch.inputs.tolist() == [[EOS, 5, 6], [EOS, 7, EOS]]
    assert batch.mask.sum(1).tolist() == [3, 2] and batch.num_documents == 2 and batch.num_padded == 1
    inactive = NextUnitBatch.collate([])  # a DDP rank without data: no target, no document
    assert inactive.targets.shape == (1, 1) and not inactive.mask.any() and inactive.num_documents == 0
    assert torch.equal(batch.to("cpu").targets, batch.targets)
