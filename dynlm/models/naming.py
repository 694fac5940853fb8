"""Log-bilinear models that suggest a method's name from its body (Allamanis et al., 2015).

Two models share one context vector (the paper's log-bilinear context model):

    r̂_c = Σ_{f ∈ features} r_f + Σ_{0<|k|≤K} C_k ⊙ r_{t_{i+k}}          (C_k diagonal: a D-vector)
    s(t, c) = r̂_c · q_t + b_t,    b_t initialised to the unigram log-probability of t

* ``type: name``: t is a whole name (one of the training names kept in the vocabulary);
* ``type: subtoken``: the name is generated subtoken by subtoken, the previous M subtokens
  (``subtoken_history``) entering the context with their own diagonal matrices; beam search
  gives names that never occurred in training (neologisms). The name ends with an END subtoken.

Both are trained with noise-contrastive estimation (``noise_samples`` draws from the unigram
distribution of the targets, :mod:`dynlm.modules.nce`) and scored with the normalised softmax
at evaluation.

This file imports only torch (plus the strict config base). The data side that fills
:class:`NamingBatch` is :mod:`dynlm.tasks.naming`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from dynlm.config import Config, ConfigError

# Ids every naming vocabulary shares (names, subtokens, features, context tokens).
PAD, UNK = 0, 1
# Subtoken vocabulary only: END closes a name; START fills the history before its first subtoken.
END, START = 2, 3


@dataclass
class NamingModelConfig(Config):
    """The ``model:`` section of the naming task (tune keys ``model.embed_dim`` etc.)."""

    type: Literal["name", "subtoken"] = "subtoken"  # whole-name LBL, or subtoken LBL (can invent names)
    embed_dim: int = 64  # D: size of r, q and the diagonal position matrices
    context_size: int = 4  # K: tokens each side of the name in the definition's token stream (≤ spec.max_context_size)
    subtoken_history: int = 3  # M: previous subtokens in the subtoken model's context
    noise_samples: int = 16  # k: NCE noise draws per target
    top_k: int = 5  # suggestions per function (evaluation, serving)
    beam_size: int = 8  # subtoken model's beam width (≥ top_k)
    max_subtokens: int = 6  # longest generated name, END excluded

    def validate(self, spec: "NamingSpec | None" = None) -> None:
        for name in ("embed_dim", "noise_samples", "top_k", "max_subtokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.context_size < 0 or self.subtoken_history < 0:
            raise ConfigError("model.context_size and model.subtoken_history must be >= 0")
        if self.beam_size < self.top_k:
            raise ConfigError(f"model.beam_size ({self.beam_size}) must be >= model.top_k ({self.top_k})")
        if spec is not None and self.context_size > spec.max_context_size:
            raise ConfigError(f"model.context_size {self.context_size} exceeds the prepared data's "
                              f"max_context_size {spec.max_context_size} (prepare with a larger data.max_context_size)")


@dataclass
class NamingSpec(Config):
    """What a naming model is built from besides its config (the preprocessor's ``spec``).

    Vocabulary sizes include the special ids above. ``name_counts[i]`` / ``subtoken_counts[i]``
    are the training counts of target id i (0 for PAD; END counted once per name): the unigram
    distribution that initialises b_t and that NCE draws its noise from.
    """

    num_names: int
    num_subtokens: int
    num_features: int
    num_context_tokens: int
    max_context_size: int  # K_max: context tokens kept each side in the prepared rows
    name_counts: list[int] = field(default_factory=list)
    subtoken_counts: list[int] = field(default_factory=list)


@dataclass
class NamingBatch:
    """One batch of functions (B of them), every tensor long, PAD = 0 where absent.

    features:  [B, F]            feature ids of each function (identifiers of the body, annotations,
                                  callers, class name ...), a set: no id twice in a row
    context:   [B, 2 * K_max]    context-token ids at positions -K_max..-1 then +1..+K_max around
                                  the name in the definition's token stream
    names:     [B]               whole-name id (UNK when the name is not in the vocabulary)
    subtokens: [B, S]            subtoken ids of the name followed by END, PAD after
    """

    features: torch.Tensor
    context: torch.Tensor
    names: torch.Tensor
    subtokens: torch.Tensor

    def to(self, device) -> "NamingBatch":
        return NamingBatch(self.features.to(device), self.context.to(device), self.names.to(device),
                           self.subtokens.to(device))

    @property
    def size(self) -> int:
        return self.names.shape[0]


@dataclass
class NCEScores:
    """What the NCE loss needs for N prediction events (B names, or every subtoken incl. END).

    target_scores:     [N]     s(t, c) of the true target
    noise_scores:      [N, k]  s(t', c) of the k noise draws
    target_log_noise:  [N]     log q(t) of the true target under the noise distribution
    noise_log_noise:   [N, k]  log q(t') of the noise draws
    """

    target_scores: torch.Tensor
    noise_scores: torch.Tensor
    target_log_noise: torch.Tensor
    noise_log_noise: torch.Tensor
