"""Tests of subword-augmented embeddings (dynlm.modules.subword_embedding)."""

from __future__ import annotations

import pytest
import torch

from dynlm.data.batching import collate_documents
from dynlm.modules.subword_embedding import (
    SubwordAugmentedEmbedding,
    SubwordEncoder,
    shortlist_input_ids,
)


def test_shortlist_ids(tiny_spec):
    tokens = torch.tensor([2, 14, 15, 19, 20, 22])
    assert shortlist_input_ids(tokens, tiny_spec).tolist() == [2, 14, 1, 1, 20, 22]


def test_encoder_ignores_padding():
    torch.manual_seed(0)
    encoder = SubwordEncoder(num_subwords=10, subword_dim=4, out_dim=6)
    short = encoder(torch.tensor([[3, 4]]), torch.tensor([2]))
    padded = encoder(torch.tensor([[3, 4, 0, 0, 0], [5, 6, 7, 8, 9]]), torch.tensor([2, 5]))
    torch.testing.assert_close(padded[0], short[0], rtol=1e-5, atol=1e-6)
    assert padded.shape == (2, 6)


def test_seeded_golden_encoder_values():
    torch.manual_seed(0)
    encoder = SubwordEncoder(num_subwords=10, subword_dim=4, out_dim=3)
    out = encoder(torch.tensor([[3, 4, 5]]), torch.tensor([3]))
    torch.testing.assert_close(out[0], torch.tensor([0.25250888, 0.13219406, -0.40445948]), rtol=1e-5, atol=1e-6)


def test_encoded_once_per_unique_word(tiny_spec, make_row):
    torch.manual_seed(0)
    embedding = SubwordAugmentedEmbedding(tiny_spec, 8, 4, mode="word+subword", combine="sum")
    sentence = collate_documents([make_row("a", [[5, 5, 6, 5]]), make_row("b", [[6, 6, 5]])], tiny_spec).sentences[0]
    seen = []
    embedding.subword.gru.register_forward_hook(lambda mod, args, out: seen.append(int(args[0].batch_sizes[0])))
    out = embedding(sentence)
    assert seen == [3]  # <bos>, 5, 6 -- not the 9 real tokens
    assert out.shape == (2, 5, 8)
    # the same as encoding each token on its own
    for b in range(2):
        for i in range(int(sentence.lengths[b])):
            u = sentence.token_to_unique[b, i]
            alone = embedding.subword(sentence.subword_ids[u : u + 1], sentence.subword_lengths[u : u + 1])[0]
            expected = embedding.word(sentence.tokens[b, i : i + 1])[0] + alone
            torch.testing.assert_close(out[b, i], expected)


def test_off_shortlist_words_share_unk_embedding_but_not_subwords(tiny_spec, make_row):
    torch.manual_seed(0)
    embedding = SubwordAugmentedEmbedding(tiny_spec, 8, 4, mode="word+subword", combine="concat")
    sentence = collate_documents([make_row("a", [[16, 17, 5]])], tiny_spec).sentences[0]
    out = embedding(sentence)  # positions 1, 2 are words 16, 17 (off the short list)
    word_dim = embedding.word_dim
    assert word_dim == 4
    unk = embedding.word.weight[tiny_spec.unk_id]
    torch.testing.assert_close(out[0, 1, :word_dim], unk)
    torch.testing.assert_close(out[0, 2, :word_dim], unk)
    assert not torch.allclose(out[0, 1, word_dim:], out[0, 2, word_dim:])


@pytest.mark.parametrize("combine", ["concat", "sum", "mul"])
def test_combine_modes(tiny_spec, make_row, combine):
    torch.manual_seed(0)
    embedding = SubwordAugmentedEmbedding(tiny_spec, 8, 4, mode="word+subword", combine=combine)
    sentence = collate_documents([make_row("a", [[5, 6]])], tiny_spec).sentences[0]
    out = embedding(sentence)
    we, se = embedding.word(sentence.tokens), embedding.encode_subwords(sentence)
    expected = {"concat": torch.cat([we, se], -1), "sum": we + se, "mul": we * se}[combine]
    assert out.shape == (1, 3, 8)
    torch.testing.assert_close(out, expected)
