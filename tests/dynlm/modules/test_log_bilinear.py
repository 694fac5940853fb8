"""Tests of dynlm.modules.log_bilinear: the log-bilinear context vector."""

from __future__ import annotations

import pytest
import torch

from dynlm.modules.log_bilinear import LogBilinearContext, history_windows

START = 3


def test_history_windows_hold_the_previous_tokens_newest_first():
    tokens = torch.tensor([[7, 8, 9]])
    assert history_windows(tokens, 2, START).tolist() == [[[3, 3], [7, 3], [8, 7], [9, 8]]]
    assert history_windows(tokens, 0, START).shape == (1, 4, 0)
    assert history_windows(torch.zeros(2, 5, 0, dtype=torch.long), 3, START).tolist() == [[[[3, 3, 3]]] * 5] * 2


def test_context_vector_is_the_weighted_sum_by_hand():
    torch.manual_seed(0)
    module = LogBilinearContext(num_features=5, num_context_tokens=6, embed_dim=3, context_size=1,
                                num_history_tokens=6, history_size=2)
    with torch.no_grad():
        module.position_scale.copy_(torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]]))
        module.history_scale.copy_(torch.tensor([[2.0, 0.0, 1.0], [1.0, 1.0, 1.0]]))
    features = torch.tensor([[1, 4, 0]])
    context = torch.tensor([[5, 2, 3, 1]])  # K_max = 2: positions -2, -1, +1, +2; K = 1 uses 2 and 3
    r_f, r_t, r_s = module.feature_embed.weight, module.token_embed.weight, module.history_embed.weight
    expected = r_f[1] + r_f[4] + torch.tensor([1.0, 2.0, 3.0]) * r_t[2] + 0.5 * r_t[3]
    assert torch.allclose(module(features, context), expected[None])
    history = torch.tensor([[4, 0]])  # previous token 4, the slot before it padding
    assert torch.allclose(module.history(history), (torch.tensor([2.0, 0.0, 1.0]) * r_s[4])[None])
    assert module.feature_embed.weight[0].abs().sum() == 0  # padding is a zero vector


def test_context_must_reach_context_size():
    module = LogBilinearContext(5, 6, 3, context_size=2)
    with pytest.raises(ValueError, match="need 2 \\* K_max with K_max >= context_size 2"):
        module(torch.tensor([[1]]), torch.tensor([[1, 2]]))
    assert module.history(torch.zeros(4, 0, dtype=torch.long)).shape == (4, 3)  # no history: zeros
