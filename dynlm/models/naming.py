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

Every model built by :func:`build_naming_model` has

* ``forward(batch) -> NCEScores``: the training objective's inputs (give them to
  :func:`dynlm.modules.nce.nce_loss`);
* ``log_prob(batch) -> [B]``: the normalised log p(name | function);
* ``nll(batch) -> (nll_sum, count)``: the normalised NLL per prediction event (a name, or a
  subtoken or END), for the training perplexity;
* ``suggest(batch, top_k=None)``: per function the ranked ``(ids, log p)`` suggestions.

This file imports torch, the strict config base and two building blocks of
:mod:`dynlm.modules` (the context vector, the beam search). The data side that fills
:class:`NamingBatch` is :mod:`dynlm.tasks.naming`; the frequency baseline is
:mod:`dynlm.models.naming_baseline`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from dynlm.config import Config, ConfigError
from dynlm.modules.beam_search import beam_search
from dynlm.modules.log_bilinear import LogBilinearContext, history_windows

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


# ------------------------------------------------------------------------------------ models
def unigram_distribution(counts: list[int], size: int, excluded: tuple[int, ...]) -> torch.Tensor:
    """Add-one smoothed unigram distribution over ``size`` target ids, zero at ``excluded``.

    Args:
        counts: training count of each id (``[]``: all zero, so uniform); the count of an
            excluded id is ignored.
        size: the vocabulary size.
        excluded: ids that are never targets (PAD; START in the subtoken vocabulary).

    Returns:
        ``[size]`` float probabilities summing to 1.
    """
    if counts and len(counts) != size:
        raise ValueError(f"naming spec: {len(counts)} counts for a vocabulary of {size} ids")
    smoothed = torch.tensor(counts, dtype=torch.float64) + 1.0 if counts else torch.ones(size, dtype=torch.float64)
    smoothed[list(excluded)] = 0.0
    return (smoothed / smoothed.sum()).float()


class _LogBilinearNaming(nn.Module):
    """What both naming models share: the context vector, the targets' ``q_t`` and ``b_t``,
    the normalised softmax and the NCE scores.

    Buffers (rebuilt from the spec, not in the state_dict): ``noise_probs [V]`` (the unigram
    distribution NCE draws from, also exp of the initial ``b``), ``never_target [V]`` (ids the
    softmax leaves out, probability 0) and ``never_suggested [V]`` (ids suggestions skip).
    """

    def __init__(self, cfg: NamingModelConfig, spec: NamingSpec, *, num_targets: int, counts: list[int],
                 never_target: tuple[int, ...], never_suggested: tuple[int, ...], history_size: int = 0):
        super().__init__()
        self.cfg = cfg
        self.context = LogBilinearContext(spec.num_features, spec.num_context_tokens, cfg.embed_dim, cfg.context_size,
                                          num_history_tokens=num_targets if history_size else 0,
                                          history_size=history_size)
        self.target_embed = nn.Embedding(num_targets, cfg.embed_dim)  # q_t
        nn.init.normal_(self.target_embed.weight, 0.0, 0.1)
        noise_probs = unigram_distribution(counts, num_targets, never_target)
        # b_t: log unigram probability (0 where never a target: masked out anyway)
        self.target_bias = nn.Parameter(torch.where(noise_probs > 0, noise_probs.log(), torch.zeros_like(noise_probs)))
        masks = torch.zeros(2, num_targets, dtype=torch.bool)
        masks[0, list(never_target)] = True
        masks[1, list(set(never_target) | set(never_suggested))] = True
        self.register_buffer("noise_probs", noise_probs, persistent=False)
        self.register_buffer("never_target", masks[0], persistent=False)
        self.register_buffer("never_suggested", masks[1], persistent=False)

    def log_softmax(self, context: torch.Tensor) -> torch.Tensor:
        """``[..., D]`` context vectors -> ``[..., V]`` normalised log p(t | c) (-inf at non-targets)."""
        scores = context @ self.target_embed.weight.t() + self.target_bias  # s(t, c)
        return scores.masked_fill(self.never_target, float("-inf")).log_softmax(dim=-1)

    def nce_scores(self, context: torch.Tensor, targets: torch.Tensor) -> NCEScores:
        """NCE inputs of N events: ``context [N, D]``, ``targets [N]``; k noise ids per event
        drawn with ``torch.multinomial`` from ``noise_probs``."""
        num_events, num_noise = targets.shape[0], self.cfg.noise_samples
        if num_events:
            noise = torch.multinomial(self.noise_probs, num_events * num_noise, replacement=True).view(num_events, num_noise)
        else:  # an inactive batch (DDP lockstep): no events, an empty graph that still touches the parameters
            noise = targets.new_zeros(0, num_noise)
        target_scores = (context * self.target_embed(targets)).sum(-1) + self.target_bias[targets]  # [N]
        noise_scores = torch.einsum("nd,nkd->nk", context, self.target_embed(noise)) + self.target_bias[noise]  # [N, k]
        log_noise = self.noise_probs.clamp_min(1e-30).log()
        return NCEScores(target_scores, noise_scores, log_noise[targets], log_noise[noise])


class LogBilinearNameModel(_LogBilinearNaming):
    """Whole-name log-bilinear model: ``p(name | features, context)`` over the name vocabulary.

    UNK is a real target class (the names outside the vocabulary: training reaches them, the
    noise draws them with their count, ``log_prob`` scores them); PAD is never a target (a PAD
    name marks an inactive row: no event). Suggestions skip PAD and UNK.
    """

    def __init__(self, cfg: NamingModelConfig, spec: NamingSpec):
        super().__init__(cfg, spec, num_targets=spec.num_names, counts=spec.name_counts, never_target=(PAD,),
                         never_suggested=(UNK,))

    def _events(self, batch: NamingBatch) -> tuple[torch.Tensor, torch.Tensor]:
        active = batch.names != PAD  # [B]
        return self.context(batch.features[active], batch.context[active]), batch.names[active]  # [N, D], [N]

    def forward(self, batch: NamingBatch) -> NCEScores:
        """NCE scores of every function with a name (N = functions, PAD names skipped)."""
        return self.nce_scores(*self._events(batch))

    def log_prob(self, batch: NamingBatch) -> torch.Tensor:
        """``[B]`` log p(name | function), the normalised softmax at the name id (-inf for PAD)."""
        log_probs = self.log_softmax(self.context(batch.features, batch.context))  # [B, V]
        return log_probs.gather(1, batch.names[:, None]).squeeze(1)

    def nll(self, batch: NamingBatch) -> tuple[torch.Tensor, int]:
        """``(Σ −log p(name | function), number of functions with a name)``."""
        context, names = self._events(batch)
        return -self.log_softmax(context).gather(1, names[:, None]).sum(), int(names.shape[0])

    @torch.no_grad()
    def suggest(self, batch: NamingBatch, top_k: int | None = None) -> list[list[tuple[tuple[int, ...], float]]]:
        """Per function the ``top_k`` (default ``cfg.top_k``) most probable names, as
        ``((name_id,), log p)``, best first; never PAD or UNK."""
        top_k = self.cfg.top_k if top_k is None else top_k
        log_probs = self.log_softmax(self.context(batch.features, batch.context))
        log_probs = log_probs.masked_fill(self.never_suggested, float("-inf"))
        allowed = int((~self.never_suggested).sum())
        values, ids = log_probs.topk(min(top_k, allowed), dim=1)
        return [[((i,), v) for i, v in zip(row_ids, row_values)] for row_ids, row_values in zip(ids.tolist(), values.tolist())]


class SubtokenNameModel(_LogBilinearNaming):
    """Subtoken log-bilinear model: a name is generated one subtoken at a time, then END.

    ``p(s_1 .. s_n END | c) = Π_i p(s_i | c, s_{i-1} .. s_{i-M})``: the context vector adds the
    previous M subtokens (START before the first), each slot with its own diagonal matrix. Beam
    search composes names never seen in training (neologisms). PAD and START are never targets;
    UNK is (a name's out-of-vocabulary subtoken) but is never suggested.
    """

    def __init__(self, cfg: NamingModelConfig, spec: NamingSpec):
        super().__init__(cfg, spec, num_targets=spec.num_subtokens, counts=spec.subtoken_counts,
                         never_target=(PAD, START), never_suggested=(UNK,), history_size=cfg.subtoken_history)

    def _step_contexts(self, batch: NamingBatch) -> torch.Tensor:
        """``[B, S, D]``: the context vector before each subtoken of ``batch.subtokens`` (teacher forcing)."""
        history = history_windows(batch.subtokens, self.cfg.subtoken_history, START)[:, :-1]  # [B, S, M]
        return self.context(batch.features, batch.context)[:, None, :] + self.context.history(history)

    def forward(self, batch: NamingBatch) -> NCEScores:
        """NCE scores of every subtoken and END of every name (N = non-PAD subtoken slots)."""
        active = batch.subtokens != PAD  # [B, S]
        return self.nce_scores(self._step_contexts(batch)[active], batch.subtokens[active])

    def _target_log_probs(self, batch: NamingBatch) -> torch.Tensor:
        """``[B, S]`` log p of each subtoken (0 at PAD slots)."""
        log_probs = self.log_softmax(self._step_contexts(batch))  # [B, S, V]
        target = log_probs.gather(2, batch.subtokens[..., None]).squeeze(2)
        return target.masked_fill(batch.subtokens == PAD, 0.0)

    def log_prob(self, batch: NamingBatch) -> torch.Tensor:
        """``[B]`` log p(name | function): the sum over its subtokens and END."""
        return self._target_log_probs(batch).sum(dim=1)

    def nll(self, batch: NamingBatch) -> tuple[torch.Tensor, int]:
        """``(Σ −log p over every subtoken and END, number of them)``."""
        return -self._target_log_probs(batch).sum(), int((batch.subtokens != PAD).sum())

    @torch.no_grad()
    def suggest(self, batch: NamingBatch, top_k: int | None = None) -> list[list[tuple[tuple[int, ...], float]]]:
        """Per function the ``top_k`` (default ``cfg.top_k``) most probable names found by beam
        search (``cfg.beam_size``, 1 to ``cfg.max_subtokens`` subtokens), as (subtoken ids
        without END, log p including END), best first; never PAD, UNK or START, never empty."""
        top_k = self.cfg.top_k if top_k is None else top_k
        base = self.context(batch.features, batch.context)  # [B, D]

        def step_log_probs(prefixes: torch.Tensor) -> torch.Tensor:  # [B, W, t] -> [B, W, V]
            history = history_windows(prefixes, self.cfg.subtoken_history, START)[:, :, -1]  # [B, W, M]
            return self.log_softmax(base[:, None, :] + self.context.history(history))

        result = beam_search(step_log_probs, batch.size, beam_size=max(self.cfg.beam_size, top_k),
                             max_length=self.cfg.max_subtokens, num_results=top_k, end_id=END,
                             banned_ids=self.never_suggested.nonzero().flatten().tolist(), pad_id=PAD,
                             device=base.device)
        suggestions = []
        for tokens, lengths, scores in zip(result.tokens.tolist(), result.lengths.tolist(), result.scores.tolist()):
            suggestions.append([(tuple(t[:n]), s) for t, n, s in zip(tokens, lengths, scores) if s > float("-inf")])
        return suggestions


def build_naming_model(cfg: NamingModelConfig, spec: NamingSpec) -> nn.Module:
    """The naming model of ``cfg.type`` ("name" or "subtoken"), after checking cfg against spec.

    Raises:
        ConfigError: a config value the spec cannot serve (context_size > max_context_size, a
            vocabulary without anything to suggest, counts of the wrong length).
    """
    cfg.validate(spec)
    if cfg.type == "name":
        if spec.num_names <= UNK + 1:
            raise ConfigError(f"naming spec: num_names {spec.num_names} leaves no name to suggest (PAD and UNK only)")
        if spec.name_counts and len(spec.name_counts) != spec.num_names:
            raise ConfigError(f"naming spec: {len(spec.name_counts)} name_counts for num_names {spec.num_names}")
        return LogBilinearNameModel(cfg, spec)
    if spec.num_subtokens <= START + 1:
        raise ConfigError(f"naming spec: num_subtokens {spec.num_subtokens} leaves no subtoken to suggest (specials only)")
    if spec.subtoken_counts and len(spec.subtoken_counts) != spec.num_subtokens:
        raise ConfigError(f"naming spec: {len(spec.subtoken_counts)} subtoken_counts for num_subtokens {spec.num_subtokens}")
    return SubtokenNameModel(cfg, spec)
