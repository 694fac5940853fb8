"""The gate on the dynamic entity scores: one sigmoid per position, shared by the chains."""

import math

import torch

from dynlm.modules.score_gate import INITIAL_BIAS, ScoreGate


def test_the_gate_scales_every_chain_of_a_position_alike():
    gate = ScoreGate(hidden_dim=2)
    with torch.no_grad():
        gate.gate.weight.copy_(torch.tensor([[1.0, 0.0]]))
        gate.gate.bias.zero_()
    hidden = torch.tensor([[[0.0, 5.0], [math.log(3.0), 0.0]]])  # g = 0.5, 0.75
    scores = torch.tensor([[[2.0, -4.0], [4.0, 8.0]]])
    torch.testing.assert_close(gate(hidden, scores), torch.tensor([[[1.0, -2.0], [3.0, 6.0]]]))


def test_it_starts_nearly_open():
    gate = ScoreGate(hidden_dim=3)
    scores = torch.ones(1, 2, 4)
    out = gate(torch.randn(1, 2, 3), scores)
    torch.testing.assert_close(out, scores * torch.sigmoid(torch.tensor(INITIAL_BIAS)))
