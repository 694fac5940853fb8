"""MetaLearner: gradient preprocessing, gate ranges and initial values, the gated update."""

import math

import pytest
import torch

from dynlm.modules.meta_learner import MetaLearner, preprocess_gradient


def test_preprocess_gradient_exact_values():
    grad = torch.tensor([1.0, -math.exp(-5.0), 0.0, 1e-6])
    magnitude, sign = preprocess_gradient(grad, p=10.0)
    torch.testing.assert_close(magnitude, torch.tensor([0.0, -0.5, -1.0, -1.0]))
    torch.testing.assert_close(sign, torch.tensor([1.0, -1.0, 0.0, 1e-6 * math.exp(10.0)]))


@pytest.mark.parametrize("hidden_dim", [0, 8])
def test_gates_in_open_unit_interval_even_for_extreme_inputs(hidden_dim):
    learner = MetaLearner(hidden_dim, input_gate_bias=-3.0, forget_gate_bias=3.0, init_scale=1.0)
    grad = torch.randn(2, 5, 7) * 1e3
    fast = torch.randn(2, 5, 7) * 3
    gates = learner(grad, fast, torch.tensor([0.5, 10.0]))
    for gate in (gates.input_gate, gates.forget_gate):
        assert gate.shape == (2, 5, 7)
        assert bool((gate > 0).all()) and bool((gate < 1).all())


def test_initial_gates_follow_the_biases():
    learner = MetaLearner(0, input_gate_bias=-5.0, forget_gate_bias=5.0)
    gates = learner(torch.randn(3, 4), torch.zeros(3, 4), torch.full((3,), 4.0))
    # last-layer weights start at std 0.01, so gates ~ sigmoid(bias)
    assert abs(gates.input_gate.mean().item() - torch.sigmoid(torch.tensor(-5.0)).item()) < 1e-3
    assert abs(gates.forget_gate.mean().item() - torch.sigmoid(torch.tensor(5.0)).item()) < 1e-3


@pytest.mark.parametrize("hidden_dim", [0, 4])
def test_update_is_forget_times_fast_minus_input_times_grad(hidden_dim):
    learner = MetaLearner(hidden_dim, init_scale=0.5)
    grad, fast, loss = torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.tensor([1.0, 2.0])
    gates = learner(grad, fast, loss)
    expected = gates.forget_gate * fast - gates.input_gate * grad
    torch.testing.assert_close(learner.update(fast, grad, loss), expected)
    # each document's gates see only its own loss
    other = learner(grad, fast, torch.tensor([1.0, 7.0]))
    torch.testing.assert_close(other.input_gate[0], gates.input_gate[0])
    assert not torch.allclose(other.input_gate[1], gates.input_gate[1])


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="grad shape"):
        MetaLearner(0)(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2))
    with pytest.raises(ValueError, match="hidden_dim"):
        MetaLearner(-1)
