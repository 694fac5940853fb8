"""Tests of the DNTM entity memory: each merge function on hand-checkable numbers."""

from __future__ import annotations

import math

import pytest
import torch

from dynlm.config import ConfigError
from dynlm.modules.entity_memory import (
    EntityMemoryState,
    EntityMerge,
    EntityMergeConfig,
    detach_memory,
    init_memory,
    mention_ranks,
    merge_mentions,
    reset_memory,
)


def _merge(merge_fn: str, dim: int = 2) -> EntityMerge:
    return EntityMerge(EntityMergeConfig(entity_dim=dim, merge_fn=merge_fn))


def _state(memory) -> EntityMemoryState:
    memory = torch.tensor(memory, dtype=torch.float32)
    return EntityMemoryState(memory, torch.full(memory.shape[:2], float("-inf")))


def _simple_gru(merge: EntityMerge) -> None:
    """GRU with r = z = sigmoid(0) = 1/2 and n = tanh(x): h' = tanh(x)/2 + h/2 (dim 1)."""
    cell = merge.cell
    for param in cell.parameters():
        param.data.zero_()
    cell.weight_ih.data[2, 0] = 1.0  # rows are (reset, update, new)


def test_init_reset_detach():
    state = init_memory(2, 3, 4)
    assert state.memory.shape == (2, 3, 4) and torch.all(state.memory == 0)
    assert state.score_lse.shape == (2, 3) and torch.all(torch.isinf(state.score_lse))
    filled = EntityMemoryState(torch.ones(2, 3, 4, requires_grad=True), torch.zeros(2, 3))
    reset = reset_memory(filled, torch.tensor([True, False]))
    assert torch.all(reset.memory[0] == 1) and torch.all(reset.memory[1] == 0)
    assert torch.all(reset.score_lse[0] == 0) and torch.all(torch.isinf(reset.score_lse[1]))
    assert not detach_memory(filled).memory.requires_grad


def test_max_and_latest_by_hand():
    state = _state([[[1.0, -1.0], [0.0, 0.0]]])
    context = torch.tensor([[[0.5, 2.0], [3.0, 4.0]]])
    update = torch.tensor([[True, False]])
    out = _merge("max")(state, context, update)
    assert out.memory.tolist() == [[[1.0, 2.0], [0.0, 0.0]]]
    out = _merge("latest")(state, context, update)
    assert out.memory.tolist() == [[[0.5, 2.0], [0.0, 0.0]]]


def test_gru_and_gru_relu_by_hand():
    state = _state([[[-2.0], [2.0], [5.0]]])
    context = torch.tensor([[[1.0], [1.0], [1.0]]])
    update = torch.tensor([[True, True, False]])
    gru = _merge("gru", dim=1)
    _simple_gru(gru)
    half_tanh = 0.5 * math.tanh(1.0)  # 0.380797
    out = gru(state, context, update)
    torch.testing.assert_close(out.memory, torch.tensor([[[half_tanh - 1.0], [half_tanh + 1.0], [5.0]]]))
    gru_relu = _merge("gru_relu", dim=1)
    _simple_gru(gru_relu)
    out = gru_relu(state, context, update)
    torch.testing.assert_close(out.memory, torch.tensor([[[0.0], [half_tanh + 1.0], [5.0]]]))


def test_attention_by_hand_and_against_softmax_over_the_bank():
    merge = _merge("attention")
    merge.score_proj.weight.data = torch.eye(2)
    merge.score_proj.bias.data.zero_()
    merge.score_vector.weight.data = torch.tensor([[1.0, 0.0]])  # s = tanh(first coordinate)
    state = init_memory(1, 1, 2)
    update = torch.tensor([[True]])
    first, second = torch.tensor([[[1.0, 0.0]]]), torch.tensor([[[0.0, 2.0]]])
    state = merge(state, first, update)
    assert state.memory.tolist() == [[[1.0, 0.0]]]  # one context: d = d'
    state = merge(state, second, update)
    w1 = math.exp(math.tanh(1.0)) / (math.exp(math.tanh(1.0)) + 1.0)  # 0.681354
    torch.testing.assert_close(state.memory, torch.tensor([[[w1, 2.0 * (1.0 - w1)]]]))
    torch.testing.assert_close(state.score_lse, torch.tensor([[math.log(math.exp(math.tanh(1.0)) + 1.0)]]))
    # Random weights, five contexts: the running form equals softmax over all of them.
    torch.manual_seed(0)
    merge = _merge("attention", dim=3)
    bank = torch.randn(5, 3)
    state = init_memory(1, 1, 3)
    for context in bank:
        state = merge(state, context.view(1, 1, 3), update)
    scores = merge.score_vector(torch.tanh(merge.score_proj(bank))).squeeze(-1)
    expected = (torch.softmax(scores, dim=0).unsqueeze(-1) * bank).sum(0)
    torch.testing.assert_close(state.memory[0, 0], expected)


@pytest.mark.parametrize("merge_fn", ["max", "gru", "gru_relu", "latest", "attention"])
def test_not_updated_entities_are_unchanged_and_gradients_flow(merge_fn):
    torch.manual_seed(0)
    merge = _merge(merge_fn, dim=3)
    state = EntityMemoryState(torch.randn(2, 4, 3), torch.randn(2, 4))
    context = torch.rand(2, 4, 3, requires_grad=True)
    update = torch.tensor([[True, False, True, False], [False, False, False, True]])
    out = merge(state, context, update)
    keep = ~update
    assert torch.equal(out.memory[keep], state.memory[keep])
    assert torch.equal(out.score_lse[keep], state.score_lse[keep])
    out.memory.sum().backward()
    assert context.grad[update].abs().sum() > 0 and torch.all(context.grad[keep] == 0)
    for name, param in merge.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_mention_ranks():
    entity_ids = torch.tensor([[0, 1, 2, 1, 1, 2]])
    mask = torch.tensor([[True, True, True, True, True, False]])
    mentions, rank = mention_ranks(entity_ids, mask, num_entities=2)
    assert mentions[0, :, 0].tolist() == [False, True, False, True, True, False]
    assert mentions[0, :, 1].tolist() == [False, False, True, False, False, False]  # last one masked
    assert rank[0, [1, 3, 4], 0].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match=r"entity_ids must be in \[0, 2\]"):
        mention_ranks(torch.tensor([[0, 3]]), torch.ones(1, 2, dtype=torch.bool), num_entities=2)


def test_merge_mentions_in_sentence_order_and_masking():
    contexts = torch.tensor(
        [
            [[9.0, 9.0], [1.0, 0.0], [0.0, 5.0], [0.0, 3.0], [7.0, 7.0]],
            [[2.0, 2.0], [4.0, 1.0], [8.0, 8.0], [8.0, 8.0], [8.0, 8.0]],
        ]
    )  # [B=2, L=5, D=2]
    entity_ids = torch.tensor([[0, 1, 2, 1, 2], [2, 2, 1, 1, 1]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)  # position 4 of row 0 is padding
    latest = merge_mentions(_merge("latest"), init_memory(2, 3, 2), contexts, entity_ids, mask)
    assert latest.memory.tolist() == [
        [[0.0, 3.0], [0.0, 5.0], [0.0, 0.0]],
        [[0.0, 0.0], [4.0, 1.0], [0.0, 0.0]],
    ]
    maxed = merge_mentions(_merge("max"), init_memory(2, 3, 2), contexts, entity_ids, mask)
    assert maxed.memory[0, 0].tolist() == [1.0, 3.0] and maxed.memory[1, 1].tolist() == [4.0, 2.0]
    # GRU is order dependent: merging e1's two contexts in sentence order, by hand.
    gru = _merge("gru")
    torch.manual_seed(0)
    state = merge_mentions(gru, init_memory(2, 3, 2), contexts, entity_ids, mask)
    h = gru.cell(contexts[0, 1:2], torch.zeros(1, 2))
    h = gru.cell(contexts[0, 3:4], h)
    torch.testing.assert_close(state.memory[0, 0], h[0])
    # No mention at all: the memory is untouched.
    empty = merge_mentions(gru, state, contexts, torch.zeros(2, 5, dtype=torch.long), mask)
    assert torch.equal(empty.memory, state.memory)
    # The rank count given by the batch (an upper bound: extra ranks merge nothing).
    for num_ranks in (2, 4):
        given = merge_mentions(gru, init_memory(2, 3, 2), contexts, entity_ids, mask, num_ranks=num_ranks)
        assert torch.equal(given.memory, state.memory)


def test_bad_config_and_shapes():
    with pytest.raises(ConfigError, match="merge_fn"):
        EntityMergeConfig.from_dict({"entity_dim": 2, "merge_fn": "mean"})
    with pytest.raises(ValueError, match="context"):
        _merge("max")(init_memory(1, 2, 2), torch.zeros(1, 3, 2), torch.ones(1, 2, dtype=torch.bool))


@pytest.mark.parametrize("merge_fn", ["max", "gru", "gru_relu", "latest", "attention"])
def test_the_compact_cpu_merge_equals_the_dense_form(merge_fn):
    """On the CPU only the updated rows are merged; the dense form (what runs on an accelerator)
    gives the same memory, scores and gradients, and leaves the other rows exactly as they were."""
    torch.manual_seed(3)
    merge = _merge(merge_fn, dim=4)
    entity_ids = torch.tensor([[1, 0, 3, 1, 2], [0, 2, 2, 0, 0], [0, 0, 0, 0, 0]])  # doc 2 mentions nothing
    mask = torch.ones(3, 5, dtype=torch.bool)
    results = []
    for compact in (True, False):
        merge.compact_on_cpu = compact
        contexts = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
        state = EntityMemoryState(torch.randn(3, 3, 4, generator=torch.Generator().manual_seed(2)),
                                  torch.tensor([[0.5, float("-inf"), 1.0]] * 3))
        out = merge_mentions(merge, state, contexts, entity_ids, mask)
        out.memory.sum().backward()
        results.append((out, contexts.grad, [p.grad.clone() for p in merge.parameters()]))
        merge.zero_grad()
    (compact, compact_grad, compact_params), (dense, dense_grad, dense_params) = results
    assert torch.allclose(compact.memory, dense.memory, atol=1e-6)
    assert torch.equal(compact.score_lse.isinf(), dense.score_lse.isinf())
    finite = dense.score_lse.isfinite()
    assert torch.allclose(compact.score_lse[finite], dense.score_lse[finite], atol=1e-6)
    assert torch.allclose(compact_grad, dense_grad, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(compact_params, dense_params))
    state_memory = torch.randn(3, 3, 4, generator=torch.Generator().manual_seed(2))
    assert torch.equal(compact.memory[2], state_memory[2])  # no mention: untouched, bit for bit
