"""Coordinate-wise meta-learner g_phi of the dynamical LM (Wolf, Chaumond & Delangue, 2018),
parameterised so that its initial update IS dynamic evaluation (Krause et al., 2018).

Dynamic evaluation updates the fast part ``fast = theta - theta_0`` of a weight with::

    fast_new = (1 - lam * rate) * fast - eta * grad / denominator

where ``denominator = rms + eps`` and ``rate = rms / mean(rms)`` (clipped at ``1 / lam``) come
from the RMS gradient statistics of training data (:mod:`dynlm.dynamic_eval`). The meta-learner
keeps that rule and learns two multiplicative corrections per coordinate::

    step = grad / denominator                       # the RMS-normalised gradient
    input_gate, forget_gate = 2 * sigmoid(g_phi(features))          # each in (0, 2)
    fast_new = (1 - lam * rate * forget_gate) * fast - eta * input_gate * step

with ``features = [preprocess(step), fast, segment loss, log(denominator) / p]``. The last layer
of g_phi starts at exactly zero, so the gates start at exactly 1 and an untrained meta-learner
makes dynamic evaluation's update with the given ``eta`` and ``lam``; meta-training then learns
where to step more or less and where to forget faster.

Two forms of the gates (``gate_form``), both exactly 1 at a zero logit:

* ``"log_sigmoid"`` (default): the gradient preprocessing of Andrychowicz et al. (2016), ``s``
  becomes ``(log|s| / p, sign s)`` when ``|s| >= exp(-p)`` and ``(-1, exp(p) * s)`` otherwise,
  and a gate is ``2 * sigmoid(logit)``;
* ``"rational"``: the magnitude feature is ``|s| / (1 + |s|)`` (``s`` is RMS-normalised, so it is
  about 1 where the training gradients were), the sign feature the same ``clamp(exp(p) s, -1, 1)``,
  and a gate is ``1 + logit / (1 + |logit|)``. No logarithm or exponential per coordinate: at
  evaluation the update of a ``[B, V, H]`` output layer is bound by those (issue 17), and this form
  makes it about twice as fast (``benchmarks/results/dynamical_wikitext2.md``).

``log(denominator) / p`` is a constant of the statistics: callers may pass it precomputed
(:attr:`UpdatePrior.log_stat`) instead of a logarithm per coordinate and update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

NUM_FEATURES = 5  # step magnitude, step sign, fast value, segment loss, log statistic
PREPROCESS_P = 10.0
GATE_FORMS = ("log_sigmoid", "rational")
GateForm = Literal["log_sigmoid", "rational"]


def preprocess_gradient(grad: torch.Tensor, p: float = PREPROCESS_P) -> tuple[torch.Tensor, torch.Tensor]:
    """Andrychowicz et al. (2016) gradient preprocessing, element-wise.

    Args:
        grad: any shape.
        p: the threshold exponent; ``|g| < exp(-p)`` uses the linear branch.

    Returns:
        ``(magnitude, sign)`` tensors of ``grad``'s shape, both roughly in [-1, 1].
    """
    size = grad.abs()
    big = size >= math.exp(-p)
    magnitude = torch.where(big, size.clamp_min(math.exp(-p)).log_().div_(p), -1.0)
    sign = torch.where(big, torch.sign(grad), grad * math.exp(p))
    return magnitude, sign


def rational_features(step: torch.Tensor, p: float = PREPROCESS_P) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``"rational"`` gate form's ``(magnitude, sign)`` features of ``step``, element-wise:
    ``|s| / (1 + |s|)`` in [0, 1) and ``clamp(exp(p) s, -1, 1)`` (the sign, linear below exp(-p))."""
    size = step.abs()
    return size / (1.0 + size), (step * math.exp(p)).clamp(-1.0, 1.0)


def gate_of(logit: torch.Tensor, form: GateForm) -> torch.Tensor:
    """A gate in (0, 2) from its logit, exactly 1 at 0: ``2 sigmoid(x)`` or ``1 + x / (1 + |x|)``."""
    if form == "rational":
        return 1.0 + logit / (1.0 + logit.abs())
    return 2.0 * torch.sigmoid(logit)


@dataclass
class UpdatePrior:
    """Dynamic evaluation's per-coordinate statistics for one fast tensor (no batch dim).

    Attributes:
        denominator: ``[*shape]`` rms + eps; the gradient is divided by it.
        decay_rate: ``[*shape]`` rms / mean(rms), clipped at 1 / lam.
        log_stat: ``[*shape]`` ``log(denominator) / PREPROCESS_P``, the meta-learner's last feature,
            when the caller keeps it (None: computed at every update).
    """

    denominator: torch.Tensor
    decay_rate: torch.Tensor
    log_stat: torch.Tensor | None = None

    def log_statistic(self) -> torch.Tensor:
        """``log(denominator) / PREPROCESS_P`` ``[*shape]`` (the kept one when there is one)."""
        return self.log_stat if self.log_stat is not None else self.denominator.log() / PREPROCESS_P


@dataclass
class Gates:
    """The two multiplicative corrections of one update, each ``[B, *shape]``, values in (0, 2)."""

    input_gate: torch.Tensor  # scales the step eta * grad / denominator
    forget_gate: torch.Tensor  # scales the decay lam * rate


class MetaLearner(nn.Module):
    """g_phi: per-coordinate features -> (input gate, forget gate) around dynamic evaluation.

    Args:
        hidden_dim: width of the hidden layer; 0 makes the gate logits a linear function of
            the features (Ravi & Larochelle's form, the cheapest).
        eta: dynamic evaluation's step size the update starts from.
        lam: dynamic evaluation's decay towards theta the update starts from.
        init_scale: std of the last layer's initial weights (0: gates exactly 1 at init).
        gate_form: ``"log_sigmoid"`` or ``"rational"`` (module docstring).
    """

    def __init__(self, hidden_dim: int = 16, eta: float = 1e-3, lam: float = 0.0, init_scale: float = 0.0,
                 gate_form: GateForm = "log_sigmoid"):
        super().__init__()
        if hidden_dim < 0:
            raise ValueError(f"MetaLearner hidden_dim must be >= 0, got {hidden_dim}")
        if gate_form not in GATE_FORMS:
            raise ValueError(f"MetaLearner gate_form must be one of {GATE_FORMS}, got {gate_form!r}")
        self.hidden_dim = hidden_dim
        self.gate_form = gate_form
        if hidden_dim > 0:
            self.hidden = nn.Linear(NUM_FEATURES, hidden_dim)
            self.gates = nn.Linear(hidden_dim, 2)
        else:
            self.hidden = None
            self.gates = nn.Linear(NUM_FEATURES, 2)
        # eta and lam are buffers: set_rule() replaces them (e.g. with a grid's choice) and a
        # checkpoint keeps the values in use.
        self.register_buffer("eta", torch.tensor(float(eta)))
        self.register_buffer("lam", torch.tensor(float(lam)))
        with torch.no_grad():
            self.gates.weight.normal_(0.0, init_scale) if init_scale > 0 else self.gates.weight.zero_()
            self.gates.bias.zero_()

    def set_rule(self, eta: float, lam: float) -> None:
        """Set the dynamic-evaluation step size and decay that the gates correct."""
        if eta < 0 or lam < 0:
            raise ValueError(f"MetaLearner: need eta >= 0 and lam >= 0, got {eta}, {lam}")
        self.eta.fill_(float(eta))
        self.lam.fill_(float(lam))

    def forward(self, step: torch.Tensor, fast: torch.Tensor, loss: torch.Tensor,
                denominator: torch.Tensor, log_stat: torch.Tensor | None = None) -> Gates:
        """Gates for every coordinate of one fast tensor.

        Args:
            step: [B, *shape] RMS-normalised gradient (grad / denominator) of each document's segment loss.
            fast: [B, *shape] current fast weights.
            loss: [B] each document's mean segment loss (broadcast to every coordinate).
            denominator: [*shape] rms + eps of the tensor.
            log_stat: [*shape] ``log(denominator) / PREPROCESS_P`` if the caller keeps it.

        Returns:
            :class:`Gates` with two [B, *shape] tensors in (0, 2).
        """
        if log_stat is None:
            log_stat = denominator.log() / PREPROCESS_P
        pre_input, pre_forget = self._gate_logits(step, fast, loss, log_stat, gates=(0, 1))
        return Gates(input_gate=gate_of(pre_input, self.gate_form), forget_gate=gate_of(pre_forget, self.gate_form))

    def _gate_logits(self, step, fast, loss, log_stat, gates: tuple[int, ...]) -> list[torch.Tensor]:
        """The logits of the ``gates`` asked for (0: input, 1: forget), each [B, *shape]
        (``log_stat``: ``[*shape]`` log(denominator) / PREPROCESS_P)."""
        if step.shape != fast.shape:
            raise ValueError(f"grad shape {tuple(step.shape)} != fast shape {tuple(fast.shape)}")
        magnitude, sign = rational_features(step) if self.gate_form == "rational" else preprocess_gradient(step)
        loss = loss.reshape(loss.shape + (1,) * (step.dim() - 1))  # [B, 1, ..., 1]
        w, b = self.gates.weight, self.gates.bias  # [2, 5 or hidden_dim], [2]
        if self.hidden is None:
            # Linear gates written as weighted sums: no [B, *shape, 5] feature tensor.
            # addcmul chains: one pass over [B, *shape] per feature.
            return [torch.addcmul(torch.addcmul(torch.addcmul(log_stat * w[k, 4] + (loss * w[k, 3] + b[k]),
                                                              magnitude, w[k, 0]), sign, w[k, 1]), fast, w[k, 2])
                    for k in gates]
        features = torch.stack([magnitude, sign, fast, loss.expand_as(step), log_stat.expand_as(step)],
                               dim=-1)  # [B, *shape, 5]
        hidden = torch.tanh(self.hidden(features))  # [B, *shape, hidden_dim]
        rows = list(gates)
        pre = torch.nn.functional.linear(hidden, w[rows], b[rows])  # [B, *shape, len(gates)]
        return [pre[..., i] for i in range(len(rows))]

    def update(self, fast: torch.Tensor, grad: torch.Tensor, loss: torch.Tensor,
               prior: UpdatePrior) -> tuple[torch.Tensor, Gates]:
        """One step: ``(1 - lam * rate * forget) * fast - eta * input * grad / denominator``.

        Args:
            fast: [B, *shape] fast weights before the update.
            grad: [B, *shape] gradient of the mean segment loss w.r.t. ``fast``.
            loss: [B] mean segment loss per document.
            prior: the tensor's RMS statistics.

        Returns:
            ``([B, *shape] fast weights for the next segment, the gates used)``.
        """
        step = grad / prior.denominator
        gates = self(step, fast, loss, prior.denominator, prior.log_stat)
        keep = 1.0 - (self.lam * prior.decay_rate) * gates.forget_gate
        return keep * fast - (self.eta * gates.input_gate) * step, gates

    def updated(self, fast: torch.Tensor, grad: torch.Tensor, loss: torch.Tensor, prior: UpdatePrior,
                decays: bool = True) -> torch.Tensor:
        """The fast weights after :meth:`update`, without its gates (for evaluation).

        ``decays=False`` says that ``lam`` is 0: ``keep`` is then exactly 1 and the forget gate,
        which only scales the decay, is not computed (a pass over ``[B, *shape]`` saved).
        """
        if decays:
            return self.update(fast, grad, loss, prior)[0]
        step = grad / prior.denominator
        pre_input, = self._gate_logits(step, fast, loss, prior.log_statistic(), gates=(0,))
        return fast - (self.eta * gate_of(pre_input, self.gate_form)) * step

    def updated_into(self, grad: torch.Tensor, fast: torch.Tensor, loss: torch.Tensor, prior: UpdatePrior,
                     decays: bool = True, weights: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`updated` computed in ``grad``'s buffer, which it overwrites (evaluation, no autograd).

        Returns ``grad``'s buffer holding the new fast weights, or, with ``weights`` (the weights in
        use, ``static + fast``), ``weights`` plus the change. With linear gates and ``decays=False``
        it makes two ``[B, *shape]`` temporaries (the update of :meth:`updated` makes about ten: on
        a CPU, large temporaries cost page faults as well as passes), using ``|s| >= exp(-p)`` ->
        ``sign s = clamp(s exp(p), -1, 1)`` and ``log(max(|s|, exp(-p))) / p = -1`` below it
        (:func:`preprocess_gradient`'s values, up to float rounding).
        """
        if self.hidden is not None or decays:
            new = self.updated(fast, grad, loss, prior, decays)
            return grad.copy_(new if weights is None else weights + (new - fast))
        step = grad.div_(prior.denominator)  # [B, *shape], in place
        w, b = self.gates.weight, self.gates.bias
        if self.gate_form == "rational":
            size = step.abs()
            pre = size.div_(size + 1.0).mul_(w[0, 0])  # magnitude * w
        else:
            pre = step.abs().clamp_min_(math.exp(-PREPROCESS_P)).log_().mul_(w[0, 0] / PREPROCESS_P)  # magnitude * w
        pre.addcmul_(step.mul(math.exp(PREPROCESS_P)).clamp_(-1.0, 1.0), w[0, 1])  # + sign * w
        pre.addcmul_(fast, w[0, 2])
        pre.add_(prior.log_statistic() * w[0, 4])  # [*shape]
        pre.add_((loss * w[0, 3] + b[0]).reshape(loss.shape + (1,) * (step.dim() - 1)))  # [B, 1, ..., 1]
        if self.gate_form == "rational":  # the step eta * input_gate * grad / denominator
            step.mul_(pre.div_(pre.abs().add_(1.0)).add_(1.0)).mul_(self.eta)
        else:
            step.mul_(pre.sigmoid_()).mul_(2.0 * self.eta)
        return step.neg_().add_(fast if weights is None else weights)
