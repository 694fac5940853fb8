"""Coordinate-wise meta-learner g_phi of the dynamical LM (Wolf, Chaumond & Delangue, 2018).

One small network, shared by every coordinate of every fast-weight tensor, turns what a
coordinate sees after a segment into two gates in (0, 1)::

    features = [preprocess(grad), fast_value, loss of the document's segment]
    input_gate, forget_gate = sigmoid(g_phi(features))
    fast_new = forget_gate * fast - input_gate * grad

``input_gate`` is a learned per-coordinate learning rate and ``forget_gate`` a learned decay
towards the static weights (fast = 0). This is the gated update of Ravi & Larochelle (2017)
with the gradient preprocessing of Andrychowicz et al. (2016): a gradient ``g`` becomes the
pair ``(log|g| / p, sign g)`` when ``|g| >= exp(-p)`` and ``(-1, exp(p) * g)`` otherwise, so
gradients of very different scales reach the network with comparable magnitudes.

The gate biases start at ``input_gate_bias`` / ``forget_gate_bias`` (e.g. -5 and +5: a small
learning rate, almost no decay) and the last layer's weights start small, so an untrained
meta-learner behaves like plain SGD with learning rate ``sigmoid(input_gate_bias)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

NUM_FEATURES = 4  # grad magnitude, grad sign, fast value, segment loss


def preprocess_gradient(grad: torch.Tensor, p: float = 10.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Andrychowicz et al. (2016) gradient preprocessing, element-wise.

    Args:
        grad: any shape.
        p: the threshold exponent; ``|g| < exp(-p)`` uses the linear branch.

    Returns:
        ``(magnitude, sign)`` tensors of ``grad``'s shape, both roughly in [-1, 1].
    """
    big = grad.abs() >= math.exp(-p)
    magnitude = torch.where(big, grad.abs().clamp_min(math.exp(-p)).log() / p, torch.full_like(grad, -1.0))
    sign = torch.where(big, torch.sign(grad), grad * math.exp(p))
    return magnitude, sign


@dataclass
class Gates:
    """The two gates of one update, each of the fast tensor's shape, values in (0, 1)."""

    input_gate: torch.Tensor  # learned learning rate
    forget_gate: torch.Tensor  # learned keep rate (1 - decay)


class MetaLearner(nn.Module):
    """g_phi: per-coordinate features -> (input gate, forget gate).

    Args:
        hidden_dim: width of the hidden layer; 0 makes the gates a linear function of the
            features (Ravi & Larochelle's form, the cheapest).
        input_gate_bias: initial bias of the input gate (learning rate ~ sigmoid(bias)).
        forget_gate_bias: initial bias of the forget gate (keep rate ~ sigmoid(bias)).
        init_scale: std of the last layer's initial weights.
    """

    def __init__(self, hidden_dim: int = 16, input_gate_bias: float = -5.0,
                 forget_gate_bias: float = 5.0, init_scale: float = 0.01):
        super().__init__()
        if hidden_dim < 0:
            raise ValueError(f"MetaLearner hidden_dim must be >= 0, got {hidden_dim}")
        self.hidden_dim = hidden_dim
        if hidden_dim > 0:
            self.hidden = nn.Linear(NUM_FEATURES, hidden_dim)
            self.gates = nn.Linear(hidden_dim, 2)
        else:
            self.hidden = None
            self.gates = nn.Linear(NUM_FEATURES, 2)
        with torch.no_grad():
            self.gates.weight.normal_(0.0, init_scale)
            self.gates.bias.copy_(torch.tensor([input_gate_bias, forget_gate_bias]))

    def forward(self, grad: torch.Tensor, fast: torch.Tensor, loss: torch.Tensor) -> Gates:
        """Gates for every coordinate of one fast tensor.

        Args:
            grad: [B, *shape] gradient of each document's segment loss w.r.t. its fast weights.
            fast: [B, *shape] current fast weights.
            loss: [B] each document's mean segment loss (broadcast to every coordinate).

        Returns:
            :class:`Gates` with two [B, *shape] tensors in (0, 1).
        """
        if grad.shape != fast.shape:
            raise ValueError(f"grad shape {tuple(grad.shape)} != fast shape {tuple(fast.shape)}")
        magnitude, sign = preprocess_gradient(grad)
        loss = loss.reshape(loss.shape + (1,) * (grad.dim() - 1))  # [B, 1, ..., 1]
        if self.hidden is None:
            # Linear gates written as weighted sums: no [B, *shape, 4] feature tensor.
            weight, bias = self.gates.weight, self.gates.bias  # [2, 4], [2]
            pre_input = (magnitude * weight[0, 0] + sign * weight[0, 1] + fast * weight[0, 2]
                         + (loss * weight[0, 3] + bias[0]))
            pre_forget = (magnitude * weight[1, 0] + sign * weight[1, 1] + fast * weight[1, 2]
                          + (loss * weight[1, 3] + bias[1]))
        else:
            features = torch.stack([magnitude, sign, fast, loss.expand_as(grad)], dim=-1)  # [B, *shape, 4]
            pre = self.gates(torch.tanh(self.hidden(features)))  # [B, *shape, 2]
            pre_input, pre_forget = pre[..., 0], pre[..., 1]
        return Gates(input_gate=torch.sigmoid(pre_input), forget_gate=torch.sigmoid(pre_forget))

    def update(self, fast: torch.Tensor, grad: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        """One meta-learned step: ``forget * fast - input * grad``.

        Args:
            fast: [B, *shape] fast weights before the update.
            grad: [B, *shape] gradient of the segment loss w.r.t. ``fast``.
            loss: [B] mean segment loss per document.

        Returns:
            [B, *shape] fast weights for the next segment.
        """
        gates = self(grad, fast, loss)
        return gates.forget_gate * fast - gates.input_gate * grad
