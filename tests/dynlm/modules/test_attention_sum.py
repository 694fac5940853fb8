"""Attention-sum on a hand-computed case, and gated attention against its formula."""

from __future__ import annotations

import math

import torch

from dynlm.modules.attention_sum import attention_sum
from dynlm.modules.gated_attention import gated_attention


def test_attention_sum_adds_the_attention_of_every_occurrence():
    # document "a b a c <pad>": candidates [a, b, c] (row 0); row 1 "b b x": candidates [b, (pad)]
    attention = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.0], [0.25, 0.5, 0.25, 0.0, 0.0]])
    candidate_of_token = torch.tensor([[0, 1, 0, 2, -1], [0, 0, -1, -1, -1]])
    candidate_mask = torch.tensor([[True, True, True], [True, False, False]])
    log_p = attention_sum(attention, candidate_of_token, candidate_mask)
    assert torch.allclose(log_p[0].exp(), torch.tensor([0.4, 0.2, 0.4]))  # a: 0.1 + 0.3
    assert math.isclose(log_p[1, 0].exp().item(), 0.75, rel_tol=1e-6)  # "x" is no candidate: 0.25 is lost
    assert log_p[1, 1:].tolist() == [float("-inf")] * 2


def test_attention_sum_gradient_reaches_only_the_answer_positions():
    scores = torch.tensor([[1.0, 2.0, 0.5]], requires_grad=True)
    attention = torch.softmax(scores, dim=-1)
    log_p = attention_sum(attention, torch.tensor([[0, 1, 0]]), torch.tensor([[True, True]]))
    log_p[0, 0].backward()
    s = torch.softmax(scores.detach(), -1)[0]
    p0 = s[0] + s[2]
    # d log(s0 + s2) / d score_j = (s_j [j in {0,2}] - s_j * p0) / p0
    expected = torch.tensor([(s[0] - s[0] * p0) / p0, -s[1], (s[2] - s[2] * p0) / p0])
    assert torch.allclose(scores.grad[0], expected, atol=1e-6)


def test_gated_attention_is_the_document_times_its_attended_query():
    document = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])  # [1, 2, 2]
    query = torch.tensor([[[1.0, 1.0], [3.0, -1.0], [9.0, 9.0]]])  # third position is padding
    mask = torch.tensor([[True, True, False]])
    out = gated_attention(document, query, mask)
    # token 0: scores (1, 3) -> alpha = softmax; token 1: scores (2, -2)
    a0 = torch.softmax(torch.tensor([1.0, 3.0]), 0)
    a1 = torch.softmax(torch.tensor([2.0, -2.0]), 0)
    q0 = a0[0] * query[0, 0] + a0[1] * query[0, 1]
    q1 = a1[0] * query[0, 0] + a1[1] * query[0, 1]
    assert torch.allclose(out[0, 0], document[0, 0] * q0) and torch.allclose(out[0, 1], document[0, 1] * q1)
