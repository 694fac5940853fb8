"""Tests of the baseline RNN LM (dynlm.models.rnn_lm) and build_model."""

from __future__ import annotations

import pytest
import torch

from dynlm.data.batching import collate_documents
from dynlm.losses import token_nll
from dynlm.models import (
    RNNLM,
    build_model,
    rnn_lm_base,
    rnn_lm_small,
    rnn_lm_subword_small,
)

E1, E2 = 20, 21


def _model(spec, seed=0, **overrides) -> RNNLM:
    torch.manual_seed(seed)
    cfg = rnn_lm_small(**{"embed_dim": 8, "hidden_dim": 8, "dropout": 0.0, **overrides})
    return build_model(cfg, spec).eval()


def _doc_nll(model, rows, spec, doc_index: int) -> list[torch.Tensor]:
    """Per-token NLL of one document of the batch, one tensor per sentence it has."""
    batch = collate_documents(rows, spec)
    outputs, _ = model(batch.sentences, model.init_state(len(rows)))
    result = []
    for output, sentence in zip(outputs, batch.sentences):
        n = int(sentence.lengths[doc_index])
        if n:
            result.append(token_nll(output.logits, sentence.targets, sentence.mask, output.positions)[doc_index, :n])
    return result


def test_builders_and_dispatch(tiny_spec):
    assert isinstance(build_model(rnn_lm_small(), tiny_spec), RNNLM)
    assert rnn_lm_base().num_layers == 2 and rnn_lm_base().type == "rnn"
    assert rnn_lm_subword_small().embedding == "word+subword"
    assert rnn_lm_small(hidden_dim=32).hidden_dim == 32


@pytest.mark.parametrize("backbone", ["lstm", "gru"])
@pytest.mark.parametrize("embedding", ["word", "subword", "word+subword"])
def test_shapes_and_padding_zeroed(tiny_spec, make_row, backbone, embedding):
    model = _model(tiny_spec, backbone=backbone, embedding=embedding, num_layers=2)
    batch = collate_documents([make_row("a", [[5, 6, 7, 8]]), make_row("b", [[9]])], tiny_spec)
    output, state = model(batch.sentences[0], model.init_state(2))
    assert output.padded_logits().shape == (2, 5, tiny_spec.output_size)
    assert output.hidden.shape == (2, 5, 8)
    assert state.h.shape == (2, 2, 8)
    assert (state.c is None) == (backbone == "gru")
    assert torch.all(output.hidden[1, 2:] == 0)


def test_the_output_layer_scores_only_the_real_positions(tiny_spec, make_row):
    """Padding gets no output layer (it is the largest cost of a step): the scores at the real
    positions are the dense form's, and a batch without padding keeps the dense form."""
    model = _model(tiny_spec)
    batch = collate_documents([make_row("b", [[9]]), make_row("a", [[5, E1, 16, 7]])], tiny_spec)
    sentence = batch.sentences[0]
    with torch.no_grad():
        output, _ = model(sentence, model.init_state(2))
        dense = model.join_logits(*model.word_and_entity_logits(model.output_dropout(output.hidden)), sentence)
    assert output.positions.tolist() == [0, 1, 5, 6, 7, 8, 9]  # row b: 2 positions (of 5), row a: 5
    assert output.logits.shape == (7, tiny_spec.output_size)
    torch.testing.assert_close(output.padded_logits()[sentence.mask], dense[sentence.mask])
    unpadded = collate_documents([make_row("a", [[5, 6]]), make_row("b", [[9, 8]])], tiny_spec).sentences[0]
    assert model(unpadded, model.init_state(2))[0].positions is None


def test_seeded_golden_values_lstm(tiny_spec, make_row):
    rows = [make_row("a", [[5, E1, 16], [E1, E2, 7]]), make_row("b", [[6, 6]])]
    model = _model(tiny_spec)
    outputs, state = model(collate_documents(rows, tiny_spec).sentences, model.init_state(2))
    expected = torch.tensor([[-0.29737705, 0.00802783, 0.31958094], [-0.31122741, 0.05837764, 0.34804738],
                             [-0.35764384, 0.04318789, 0.44875860], [-0.40958828, 0.06946300, 0.41093811]])
    torch.testing.assert_close(outputs[0].padded_logits()[0, :, :3], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state.h[0, 0, :4], torch.tensor([-0.01851827, 0.26177230, -0.01454893, 0.17471932]),
                               rtol=1e-5, atol=1e-6)


def test_seeded_golden_values_gru_subword(tiny_spec, make_row):
    rows = [make_row("a", [[5, E1, 16], [E1, E2, 7]]), make_row("b", [[6, 6]])]
    torch.manual_seed(0)
    cfg = rnn_lm_subword_small(embed_dim=8, hidden_dim=8, subword_dim=4, dropout=0.0, backbone="gru")
    model = build_model(cfg, tiny_spec).eval()
    outputs, state = model(collate_documents(rows, tiny_spec).sentences, model.init_state(2))
    torch.testing.assert_close(outputs[1].padded_logits()[0, -1, :3], torch.tensor([-0.57835805, 0.29138041, -0.19834185]),
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state.h[0, 1, :3], torch.tensor([0.08921855, -0.11421215, -0.00288375]),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backbone, embedding", [("lstm", "word"), ("gru", "word+subword"), ("lstm", "subword")])
def test_padding_does_not_change_results(tiny_spec, make_row, backbone, embedding):
    """A short document alone vs batched with a longer one (longer sentences, more sentences)."""
    model = _model(tiny_spec, backbone=backbone, embedding=embedding, num_layers=2)
    short = make_row("short", [[5, E1], [E1, 7, 8]])
    long = make_row("long", [[9, 10, 11, 12, 13, 14], [4, 5, 6, 7, 8, 9, 10], [11, 16, 17]])
    alone = _doc_nll(model, [short], tiny_spec, 0)
    batched = _doc_nll(model, [long, short], tiny_spec, 1)
    assert len(alone) == len(batched) == 2
    for a, b in zip(alone, batched):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_inactive_documents_keep_their_state(tiny_spec, make_row):
    model = _model(tiny_spec)
    batch = collate_documents([make_row("a", [[5], [6]]), make_row("b", [[7]])], tiny_spec)
    _, after_first = model(batch.sentences[0], model.init_state(2))
    _, after_second = model(batch.sentences[1], after_first)
    assert torch.equal(after_second.h[:, 1], after_first.h[:, 1])
    assert not torch.equal(after_second.h[:, 0], after_first.h[:, 0])


def test_list_forward_equals_sentence_by_sentence(tiny_spec, random_rows):
    model = _model(tiny_spec, embedding="word+subword")
    batch = collate_documents(random_rows(3), tiny_spec)
    outputs, state_list = model(batch.sentences, model.init_state(3))
    state = model.init_state(3)
    for output, sentence in zip(outputs, batch.sentences):
        single, state = model(sentence, state)
        torch.testing.assert_close(single.padded_logits(), output.padded_logits())
    torch.testing.assert_close(state.h, state_list.h)


def test_reset_and_detach_state(tiny_spec, make_row):
    model = _model(tiny_spec)
    model.train()
    batch = collate_documents([make_row("a", [[5, 6]]), make_row("b", [[7, 8]])], tiny_spec)
    _, state = model(batch.sentences[0], model.init_state(2))
    assert state.h.requires_grad
    detached = model.detach_state(state)
    assert not detached.h.requires_grad and torch.equal(detached.h, state.h)
    reset = model.reset_state(detached, torch.tensor([True, False]))
    assert torch.equal(reset.h[:, 0], detached.h[:, 0]) and torch.equal(reset.c[:, 0], detached.c[:, 0])
    assert torch.all(reset.h[:, 1] == 0) and torch.all(reset.c[:, 1] == 0)


def test_tie_weights(tiny_spec):
    model = _model(tiny_spec, tie_weights=True)
    assert model.decoder.weight is model.embedding.word.weight
    summed = _model(tiny_spec, tie_weights=True, embedding="word+subword", combine="sum")
    assert summed.decoder.weight is summed.embedding.word.weight
    with pytest.raises(ValueError, match="tie_weights"):
        _model(tiny_spec, tie_weights=True, embedding="word+subword", combine="concat")


def test_locked_dropout_active_in_train_mode_only(tiny_spec, make_row):
    model = _model(tiny_spec, dropout=0.5)
    sentence = collate_documents([make_row("a", [[5, 6, 7]])], tiny_spec).sentences[0]
    eval_a, _ = model(sentence, model.init_state(1))
    eval_b, _ = model(sentence, model.init_state(1))
    torch.testing.assert_close(eval_a.logits, eval_b.logits)
    model.train()
    train_a, _ = model(sentence, model.init_state(1))
    assert not torch.allclose(train_a.logits, eval_a.logits)
