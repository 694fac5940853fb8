"""Tests of the mention cache (dynlm.modules.mention_cache)."""

from __future__ import annotations

import torch

from dynlm.modules.mention_cache import MentionCache


def _explicit(hidden, targets, weight, num_entities, cache=None):
    """s_k(t) = (w * h_t) . (c_k(before) + sum_{i < t, target_i = k} h_i), one position at a time."""
    batch, width, dim = hidden.shape
    cache = torch.zeros(batch, num_entities, dim) if cache is None else cache.clone()
    scores = torch.zeros(batch, width, num_entities)
    for t in range(width):
        scores[:, t] = torch.einsum("bh,bkh->bk", hidden[:, t] * weight, cache)
        for b in range(batch):
            if targets[b, t] > 0:
                cache[b, targets[b, t] - 1] += hidden[b, t]
    return scores, cache


def _seeded(hidden_dim: int, seed: int) -> MentionCache:
    """A cache with seeded nonzero weights (it starts at w = 0, which scores nothing)."""
    torch.manual_seed(seed)
    module = MentionCache(hidden_dim)
    with torch.no_grad():
        module.weight.normal_()
    return module


def test_scores_and_cache_are_the_sum_over_earlier_mentions():
    module = _seeded(4, seed=0)
    hidden = torch.randn(2, 6, 4)
    targets = torch.tensor([[0, 1, 0, 2, 1, 1], [2, 0, 0, 2, 0, 0]])
    carried = torch.randn(2, 3, 4)
    scores, cache = module(hidden, targets, None, carried)
    expected_scores, expected_cache = _explicit(hidden, targets, module.weight.detach(), 3, carried)
    torch.testing.assert_close(scores, expected_scores)
    torch.testing.assert_close(cache, expected_cache)
    # the first position reads only the carried cache; chain 3 is never a target: only its carried row
    torch.testing.assert_close(scores[:, 0], torch.einsum("bh,bkh->bk", hidden[:, 0] * module.weight, carried))
    torch.testing.assert_close(cache[:, 2], carried[:, 2])
    # seeded: row 0 at its last position (the explicit loop above is the definition; this pins the values)
    torch.testing.assert_close(scores[0, 5].detach(), torch.tensor([0.200070, 0.194269, -0.462334]), rtol=0, atol=1e-5)


def test_a_document_that_starts_inside_the_step_sees_only_its_own_mentions():
    module = _seeded(3, seed=1)
    hidden = torch.randn(1, 7, 3)
    targets = torch.tensor([[1, 1, 0, 2, 1, 0, 1]])
    start = torch.tensor([[False, False, False, True, False, False, False]])
    carried = torch.randn(1, 2, 3)
    scores, cache = module(hidden, targets, start, carried)
    first, _ = _explicit(hidden[:, :3], targets[:, :3], module.weight.detach(), 2, carried)
    second, second_cache = _explicit(hidden[:, 3:], targets[:, 3:], module.weight.detach(), 2)
    torch.testing.assert_close(scores, torch.cat([first, second], dim=1))
    torch.testing.assert_close(cache, second_cache)  # the carried cache belonged to the first document


def test_zero_weight_scores_nothing_and_the_weight_learns():
    module = MentionCache(5)
    hidden = torch.randn(2, 4, 5, requires_grad=True)
    targets = torch.tensor([[1, 0, 1, 0], [0, 2, 2, 1]])
    scores, _ = module(hidden, targets, None, torch.zeros(2, 2, 5))
    assert torch.equal(scores, torch.zeros_like(scores))
    scores[:, :, 0].sum().backward()
    assert module.weight.grad.abs().sum() > 0
