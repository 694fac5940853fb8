"""Noise-contrastive estimation (Gutmann & Hyvärinen, 2010; Mnih & Teh, 2012).

A model with an unnormalised score ``s(t, c)`` per target ``t`` in context ``c`` is trained to
tell the true target from ``k`` draws of a known noise distribution ``q`` (here the unigram
distribution of the targets). With the model's normaliser fixed to 1 (``exp s`` read as a
probability, "self-normalised"), the posterior that a target came from the data is

    P(D=1 | t, c) = σ(Δ(t, c)),    Δ(t, c) = s(t, c) − log(k · q(t))

and the per-event loss is the negative log-likelihood of that binary classification:

    loss = −log σ(Δ(t, c)) − Σ_{j=1..k} log(1 − σ(Δ(t'_j, c)))
         = softplus(−Δ(t, c)) + Σ_j softplus(Δ(t'_j, c))

(``1 − σ(x) = σ(−x)`` and ``−log σ(x) = softplus(−x)``). Its gradient approaches that of the
softmax log-likelihood as k grows, without ever summing over the vocabulary; evaluation scores
with the normalised softmax instead.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # the annotation only: modules do not import models
    from dynlm.models.naming import NCEScores


def nce_loss(scores: "NCEScores") -> torch.Tensor:
    """The NCE loss of each prediction event (see the module docstring for the formula).

    Args:
        scores: ``target_scores [N]``, ``noise_scores [N, k]`` and their log noise
            probabilities ``target_log_noise [N]``, ``noise_log_noise [N, k]``.

    Returns:
        ``[N]`` loss per event (nats); average or sum it for the training objective.
    """
    num_noise = scores.noise_scores.shape[-1]
    if num_noise < 1:
        raise ValueError("nce_loss: at least one noise sample per event is needed (noise_scores is [N, 0])")
    log_k = math.log(num_noise)
    target_delta = scores.target_scores - (log_k + scores.target_log_noise)  # [N]
    noise_delta = scores.noise_scores - (log_k + scores.noise_log_noise)  # [N, k]
    return F.softplus(-target_delta) + F.softplus(noise_delta).sum(dim=-1)
