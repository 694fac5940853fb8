"""MetaLearner: gradient preprocessing, gate ranges, gates exactly 1 at init (= dynamic
evaluation's update), the corrected update formula, and eta / lambda settings, for both gate
forms (``log_sigmoid``, ``rational``)."""

import math

import pytest
import torch

from dynlm.modules.meta_learner import (
    GATE_FORMS,
    PREPROCESS_P,
    MetaLearner,
    UpdatePrior,
    gate_of,
    preprocess_gradient,
    rational_features,
)


def _prior(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return UpdatePrior(denominator=torch.rand(shape, generator=g) + 0.1,
                       decay_rate=torch.rand(shape, generator=g) * 2)


def test_preprocess_gradient_exact_values():
    grad = torch.tensor([1.0, -math.exp(-5.0), 0.0, 1e-6])
    magnitude, sign = preprocess_gradient(grad, p=10.0)
    torch.testing.assert_close(magnitude, torch.tensor([0.0, -0.5, -1.0, -1.0]))
    torch.testing.assert_close(sign, torch.tensor([1.0, -1.0, 0.0, 1e-6 * math.exp(10.0)]))


@pytest.mark.parametrize("gate_form", GATE_FORMS)
@pytest.mark.parametrize("hidden_dim", [0, 8])
def test_gates_in_open_interval_0_2_even_for_extreme_inputs(hidden_dim, gate_form):
    learner = MetaLearner(hidden_dim, init_scale=1.0, gate_form=gate_form)
    step = torch.randn(2, 5, 7) * 1e3
    fast = torch.randn(2, 5, 7) * 3
    gates = learner(step, fast, torch.tensor([0.5, 10.0]), _prior((5, 7)).denominator)
    for gate in (gates.input_gate, gates.forget_gate):
        assert gate.shape == (2, 5, 7)
        assert bool((gate > 0).all()) and bool((gate < 2).all())
        assert float(gate.detach().std()) > 0


@pytest.mark.parametrize("gate_form", GATE_FORMS)
@pytest.mark.parametrize("hidden_dim", [0, 4])
def test_initial_update_is_dynamic_evaluation(hidden_dim, gate_form):
    """Gates start at exactly 1: fast <- (1 - lam * rate) * fast - eta * grad / denominator."""
    learner = MetaLearner(hidden_dim, eta=0.03, lam=0.2, gate_form=gate_form)
    grad, fast, loss = torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.tensor([1.0, 2.0])
    prior = _prior((3, 4))
    new, gates = learner.update(fast, grad, loss, prior)
    assert bool((gates.input_gate == 1).all()) and bool((gates.forget_gate == 1).all())
    expected = (1 - 0.2 * prior.decay_rate) * fast - 0.03 * grad / prior.denominator
    torch.testing.assert_close(new, expected)


@pytest.mark.parametrize("gate_form", GATE_FORMS)
@pytest.mark.parametrize("hidden_dim", [0, 4])
def test_gates_correct_the_step_and_the_decay_multiplicatively(hidden_dim, gate_form):
    learner = MetaLearner(hidden_dim, eta=0.5, lam=0.1, init_scale=0.5, gate_form=gate_form)
    grad, fast, loss = torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.tensor([1.0, 2.0])
    prior = _prior((3, 4), seed=1)
    new, gates = learner.update(fast, grad, loss, prior)
    expected = ((1 - 0.1 * prior.decay_rate * gates.forget_gate) * fast
                - 0.5 * gates.input_gate * grad / prior.denominator)
    torch.testing.assert_close(new, expected)
    # each document's gates see only its own loss
    other = learner(grad / prior.denominator, fast, torch.tensor([1.0, 7.0]), prior.denominator)
    torch.testing.assert_close(other.input_gate[0], gates.input_gate[0])
    assert not torch.allclose(other.input_gate[1], gates.input_gate[1])


@pytest.mark.parametrize("gate_form", GATE_FORMS)
@pytest.mark.parametrize("hidden_dim", [0, 4])
def test_updated_alone_equals_the_update_and_skips_the_forget_gate_only_at_lambda_0(hidden_dim, gate_form):
    """Evaluation's ``updated`` gives ``update``'s new weights; ``decays=False`` (lam = 0) leaves
    the forget gate out, which changes nothing because the decay is then 0."""
    g = torch.Generator().manual_seed(3)
    grad, fast, loss = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g), torch.tensor([1.0, 2.0])
    prior = _prior((3, 4), seed=2)
    for lam, decays in [(0.1, True), (0.0, True), (0.0, False)]:
        torch.manual_seed(0)
        learner = MetaLearner(hidden_dim, eta=0.5, lam=lam, init_scale=0.5, gate_form=gate_form)
        expected, gates = learner.update(fast, grad, loss, prior)
        assert float((gates.forget_gate - 1).abs().max()) > 0.05  # a forget gate that is not 1
        torch.testing.assert_close(learner.updated(fast, grad, loss, prior, decays), expected, rtol=1e-6, atol=1e-7)
    with_decay = MetaLearner(hidden_dim, eta=0.5, lam=0.1, init_scale=0.5, gate_form=gate_form)
    assert not torch.allclose(with_decay.updated(fast, grad, loss, prior, decays=False),
                              with_decay.update(fast, grad, loss, prior)[0])  # decays=False drops the decay


def test_set_rule_and_checkpointed_eta_lambda():
    learner = MetaLearner(0, eta=1e-3, lam=0.0)
    learner.set_rule(0.02, 0.5)
    assert float(learner.eta) == pytest.approx(0.02) and float(learner.lam) == 0.5
    state = learner.state_dict()
    assert float(state["eta"]) == pytest.approx(0.02)  # buffers: a checkpoint keeps them
    assert sum(p.numel() for p in learner.parameters()) == 2 * 5 + 2  # eta, lam are not trained
    with pytest.raises(ValueError, match="eta >= 0"):
        learner.set_rule(-1.0, 0.0)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="grad shape"):
        MetaLearner(0)(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2), torch.ones(4))
    with pytest.raises(ValueError, match="hidden_dim"):
        MetaLearner(-1)


@pytest.mark.parametrize("gate_form", GATE_FORMS)
@pytest.mark.parametrize("hidden_dim", [0, 4])
@pytest.mark.parametrize("lam, decays", [(0.0, False), (0.1, True)])
def test_updated_into_writes_updated_into_the_gradient_buffer(hidden_dim, lam, decays, gate_form):
    """Evaluation's in-place update (the lean branch: linear gates, no decay) gives ``updated``'s
    weights, also for steps below exp(-p) (the linear branch of the preprocessing), and with
    ``weights = static + fast`` it gives ``static + updated``; the result is ``grad``'s buffer.
    In float64, and compared as changes to ``fast``, so that the tiny steps' changes count."""
    g = torch.Generator().manual_seed(5)
    grad, fast = torch.randn(2, 3, 4, generator=g).double(), torch.randn(2, 3, 4, generator=g).double()
    grad[0, 0] = torch.tensor([1e-7, -1e-6, 0.0, 3e-6])  # |grad / denominator| < exp(-10)
    loss, static = torch.tensor([1.0, 2.0]).double(), torch.randn(3, 4, generator=g).double()
    prior = _prior((3, 4), seed=6)
    prior = UpdatePrior(prior.denominator.double(), prior.decay_rate.double())
    torch.manual_seed(0)
    learner = MetaLearner(hidden_dim, eta=0.5, lam=lam, init_scale=0.5, gate_form=gate_form).double()
    expected = learner.updated(fast, grad, loss, prior, decays)
    buffer = grad.clone()
    with torch.no_grad():
        result = learner.updated_into(buffer, fast, loss, prior, decays)
    assert result.data_ptr() == buffer.data_ptr()
    torch.testing.assert_close(result - fast, expected - fast, rtol=1e-9, atol=1e-15)
    buffer = grad.clone()
    with torch.no_grad():
        in_use = learner.updated_into(buffer, fast, loss, prior, decays, weights=static + fast)
    torch.testing.assert_close(in_use - (static + fast), expected - fast, rtol=1e-9, atol=1e-14)


def test_rational_features_and_gates_exact_values():
    step = torch.tensor([1.0, -3.0, 0.0, 1e-6])
    magnitude, sign = rational_features(step, p=10.0)
    torch.testing.assert_close(magnitude, torch.tensor([0.5, 0.75, 0.0, 1e-6 / (1 + 1e-6)]))
    torch.testing.assert_close(sign, torch.tensor([1.0, -1.0, 0.0, 1e-6 * math.exp(10.0)]))
    logit = torch.tensor([0.0, 1.0, -3.0, 1e6])
    torch.testing.assert_close(gate_of(logit, "rational"), torch.tensor([1.0, 1.5, 0.25, 2.0 - 1 / (1 + 1e6)]))
    torch.testing.assert_close(gate_of(logit, "log_sigmoid"), 2 * torch.sigmoid(logit))
    with pytest.raises(ValueError, match="gate_form"):
        MetaLearner(0, gate_form="tanh")


@pytest.mark.parametrize("gate_form", GATE_FORMS)
def test_a_kept_log_statistic_gives_the_same_update(gate_form):
    """``UpdatePrior.log_stat`` (kept by the caller) is the feature computed otherwise."""
    g = torch.Generator().manual_seed(7)
    grad, fast, loss = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g), torch.tensor([1.0, 2.0])
    prior = _prior((3, 4), seed=8)
    kept = UpdatePrior(prior.denominator, prior.decay_rate, prior.denominator.log() / PREPROCESS_P)
    torch.manual_seed(0)
    learner = MetaLearner(0, eta=0.5, lam=0.0, init_scale=0.5, gate_form=gate_form)
    expected = learner.updated(fast, grad, loss, prior, decays=False)
    torch.testing.assert_close(learner.updated(fast, grad, loss, kept, decays=False), expected, rtol=0, atol=0)
    with torch.no_grad():
        into = learner.updated_into(grad.clone(), fast, loss, kept, decays=False)
    torch.testing.assert_close(into, expected, rtol=1e-6, atol=1e-7)
    shifted = UpdatePrior(prior.denominator, prior.decay_rate, kept.log_stat + 1.0)  # the kept one is what is read
    assert not torch.allclose(learner.updated(fast, grad, loss, shifted, decays=False), expected)
