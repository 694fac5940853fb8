"""Fast layers: vmap + functional_call equals a plain loop over documents, leaves the module's
parameters alone, keeps the pad row static, and supports second-order gradients."""

import pytest
import torch
from torch import nn
from torch.func import functional_call

from dynlm.modules.fast_weights import fast_embedding, fast_linear, per_document_call


def _linear_case(seed=0, bias=True):
    torch.manual_seed(seed)
    linear = nn.Linear(5, 7, bias=bias).double()
    x = torch.randn(3, 4, 5, dtype=torch.float64)  # [B, L, H]
    delta_weight = 0.1 * torch.randn(3, 7, 5, dtype=torch.float64)  # [B, V, H]
    delta_bias = 0.1 * torch.randn(3, 7, dtype=torch.float64) if bias else None  # [B, V]
    return linear, x, delta_weight, delta_bias


@pytest.mark.parametrize("bias", [True, False])
def test_fast_linear_equals_a_loop_over_documents(bias):
    linear, x, delta_weight, delta_bias = _linear_case(bias=bias)
    out = fast_linear(linear, x, delta_weight, delta_bias)  # [B, L, V]
    for b in range(x.shape[0]):
        weights = {"weight": linear.weight + delta_weight[b]}
        if bias:
            weights["bias"] = linear.bias + delta_bias[b]
        torch.testing.assert_close(out[b], functional_call(linear, weights, (x[b],)), rtol=0, atol=1e-12)
        manual = x[b] @ (linear.weight + delta_weight[b]).T + (linear.bias + delta_bias[b] if bias else 0)
        torch.testing.assert_close(out[b], manual, rtol=0, atol=1e-12)


def test_zero_delta_is_the_static_module_and_parameters_are_untouched():
    linear, x, delta_weight, delta_bias = _linear_case()
    params_before = {n: (p, p.detach().clone()) for n, p in linear.named_parameters()}
    out = fast_linear(linear, x, torch.zeros_like(delta_weight), torch.zeros_like(delta_bias))
    torch.testing.assert_close(out, linear(x), rtol=0, atol=1e-12)  # batched vs. plain matmul kernel
    fast_linear(linear, x, delta_weight, delta_bias)
    for name, param in linear.named_parameters():  # same Parameter objects, same values
        assert param is params_before[name][0] and torch.equal(param, params_before[name][1])


def test_fast_embedding_equals_a_loop_and_keeps_the_pad_row_static():
    torch.manual_seed(1)
    embedding = nn.Embedding(9, 4, padding_idx=0).double()
    tokens = torch.tensor([[3, 0, 5, 3], [0, 8, 1, 2]])  # [B, L], 0 is padding
    delta = torch.randn(2, 9, 4, dtype=torch.float64)  # [B, V, E]; pad row non-zero on purpose
    out = fast_embedding(embedding, tokens, delta)
    for b in range(2):
        expected = functional_call(embedding, {"weight": embedding.weight + delta[b]}, (tokens[b],))
        pad = tokens[b] == 0
        torch.testing.assert_close(out[b][~pad], expected[~pad], rtol=0, atol=0)
        torch.testing.assert_close(out[b][pad], embedding.weight[0].expand(int(pad.sum()), 4), rtol=0, atol=0)
    # the same with a zero pad row (the case DynamicalLM hits): the plain loop, exactly
    delta[:, 0] = 0
    out = fast_embedding(embedding, tokens, delta)
    for b in range(2):
        expected = functional_call(embedding, {"weight": embedding.weight + delta[b]}, (tokens[b],))
        assert torch.equal(out[b], expected)


def test_pad_rows_get_no_gradient_in_any_document():
    """torch 2.13's vmap rule for the embedding backward honours padding_idx only for document 0."""
    torch.manual_seed(3)
    embedding = nn.Embedding(6, 3, padding_idx=0)
    tokens = torch.tensor([[0, 1, 2], [0, 0, 5], [4, 0, 0]])  # pads in every document
    delta = (0.1 * torch.randn(3, 6, 3)).requires_grad_(True)
    out = fast_embedding(embedding, tokens, delta)
    grad_delta, grad_weight = torch.autograd.grad(out.pow(2).sum() + out.sum(), [delta, embedding.weight])
    assert float(grad_delta[:, 0].abs().max()) == 0.0 and float(grad_delta[:, 1:].abs().sum()) > 0
    assert float(grad_weight[0].abs().max()) == 0.0
    looped = torch.stack([functional_call(embedding, {"weight": embedding.weight + delta[b]}, (tokens[b],))
                          for b in range(3)])
    loop_grads = torch.autograd.grad(looped.pow(2).sum() + looped.sum(), [delta, embedding.weight])
    torch.testing.assert_close(grad_delta, loop_grads[0])  # the plain loop gives the pad rows none
    torch.testing.assert_close(grad_weight, loop_grads[1])


def test_second_order_gradients_through_vmap_and_functional_call():
    """d/dW of a loss after one inner step on the delta, against the same through a plain loop."""
    linear, x, delta_weight, _ = _linear_case(seed=2)
    delta = delta_weight.clone().requires_grad_(True)

    def meta_grad(apply):
        inner, = torch.autograd.grad(apply(delta).pow(2).sum(), delta, create_graph=True)
        outer = apply(delta - 0.1 * inner).sin().sum()
        return torch.autograd.grad(outer, linear.weight)[0]

    looped = lambda d: torch.stack([functional_call(linear, {"weight": linear.weight + d[b]}, (x[b],))
                                    for b in range(x.shape[0])])
    batched = lambda d: per_document_call(linear, {"weight": d}, x)
    torch.testing.assert_close(meta_grad(batched), meta_grad(looped), rtol=1e-10, atol=1e-12)
