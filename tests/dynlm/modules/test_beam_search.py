"""Tests of dynlm.modules.beam_search on step functions with known probabilities."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dynlm.modules.beam_search import beam_search

PAD, END, X, Y = 0, 1, 2, 3


def fixed_step(probs: list[list[float]], calls: list[int] | None = None):
    """Next-token probabilities that ignore the prefix: row b of ``probs`` for batch row b."""
    table = torch.tensor(probs).log()  # [B, V]

    def step(prefixes: torch.Tensor) -> torch.Tensor:  # [B, W, t] -> [B, W, V]
        if calls is not None:
            calls.append(prefixes.shape[2])
        return table[:, None, :].expand(-1, prefixes.shape[1], -1)

    return step


def test_best_sequences_of_a_hand_computed_case():
    # p(END) = 0.5, p(x) = 0.3, p(y) = 0.2 at every step: x END = 0.15, y END = 0.10, x x END = 0.045,
    # x y END = y x END = 0.03; the empty name (END first) is not allowed (min_length 1)
    result = beam_search(fixed_step([[0.0, 0.5, 0.3, 0.2]]), 1, beam_size=4, max_length=3, num_results=3,
                         end_id=END, banned_ids=[PAD], pad_id=PAD)
    assert result.tokens.tolist() == [[[X, PAD, PAD], [Y, PAD, PAD], [X, X, PAD]]]
    assert result.lengths.tolist() == [[1, 1, 2]]
    assert result.scores.exp().tolist()[0] == pytest.approx([0.15, 0.10, 0.045])


def test_rows_are_searched_independently_and_banned_tokens_never_appear():
    # row 1: y is banned although it is the most probable token; only x-names remain
    result = beam_search(fixed_step([[0.0, 0.5, 0.3, 0.2], [0.0, 0.2, 0.1, 0.7]]), 2, beam_size=4, max_length=2,
                         num_results=3, end_id=END, banned_ids=[PAD, Y], pad_id=PAD)
    assert result.tokens[0].tolist() == [[X, PAD], [X, X], [PAD, PAD]]
    assert result.scores[0].exp().tolist() == pytest.approx([0.3 * 0.5, 0.09 * 0.5, 0.0])
    assert result.tokens[1].tolist() == [[X, PAD], [X, X], [PAD, PAD]]
    assert result.scores[1].exp().tolist() == pytest.approx([0.1 * 0.2, 0.01 * 0.2, 0.0])
    assert result.scores[:, 2].tolist() == [-math.inf, -math.inf]  # fewer than 3 names exist


def test_stops_once_no_live_prefix_can_win():
    calls: list[int] = []
    # after the second step x END (0.15) and y END (0.10) are the 2 best; the best live prefix, x x, is
    # at 0.09 already, so the search ends there instead of running to length 5
    beam_search(fixed_step([[0.0, 0.5, 0.3, 0.2]], calls), 1, beam_size=4, max_length=5, num_results=2, end_id=END,
                banned_ids=[PAD], pad_id=PAD)
    assert calls == [0, 1]


def test_a_wide_beam_equals_exhaustive_search_with_a_prefix_dependent_step():
    torch.manual_seed(0)
    bigram = torch.randn(2, 4, 4).log_softmax(-1)  # per row: log p(next | previous token), row 0 of it after START
    bigram[..., PAD] = -math.inf
    bigram = bigram.log_softmax(-1)

    def step(prefixes: torch.Tensor) -> torch.Tensor:
        previous = prefixes[..., -1] if prefixes.shape[2] else torch.zeros(prefixes.shape[:2], dtype=torch.long)
        return bigram.gather(1, previous[..., None].expand(-1, -1, 4))  # [B, W, V]

    result = beam_search(step, 2, beam_size=9, max_length=3, num_results=6, end_id=END, banned_ids=[PAD], pad_id=PAD)
    for row in range(2):
        scored = []
        for n in range(1, 4):
            for names in itertools.product([X, Y], repeat=n):
                path = (0, *names, END)
                scored.append((sum(bigram[row, a, b].item() for a, b in zip(path, path[1:])), names))
        scored.sort(reverse=True)
        found = [tuple(t[:n]) for t, n in zip(result.tokens[row].tolist(), result.lengths[row].tolist())]
        assert found == [names for _, names in scored[:6]]
        assert result.scores[row].tolist() == pytest.approx([s for s, _ in scored[:6]], abs=1e-5)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="min_length <= max_length"):
        beam_search(fixed_step([[0.0, 1.0, 0.0, 0.0]]), 1, beam_size=2, max_length=0, num_results=1, end_id=END,
                    banned_ids=[], pad_id=PAD)
