"""One strict config for every model type; the vocabulary sizes come from :class:`VocabSpec`.

Tune keys address fields by dotted path, e.g. ``model.dntm.merge_fn`` or
``model.dynamical.eta``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dynlm.config import Config, ConfigError


@dataclass
class DNTMSettings(Config):
    """Dynamic Neural Text Model (Kobayashi et al., 2017).

    The defaults are the best settings measured here (``benchmarks/results/dntm_quality.md``: the
    new-entity logit and per-document entity rows stepped at every token), not the paper's model:
    the paper's is ``new_entity_score: false, adapt_entity_rows: false``. A saved model keeps the
    settings it was trained with (its checkpoint holds the whole config).
    """

    dynamic: Literal["none", "input", "output", "both"] = "both"
    merge_fn: Literal["max", "gru", "gru_relu", "latest", "attention"] = "gru"
    entity_dim: int = 0  # 0: same as embed_dim (needed for input dynamics to add to embeddings)
    context_hidden_dim: int = 0  # BiRNN context encoder size; 0: same as hidden_dim
    # a learned score for "a new chain comes next", on <unk{n+1}> only (dynlm.modules.new_entity_score)
    new_entity_score: bool = True
    # with new_entity_score: the logit of <unk{n+1}> is the score plus a learned bias per n alone,
    # without the static output vector of <unk{n+1}> (which then scores only re-mentions of its chain).
    # No effect without new_entity_score (so `new_entity_score: false` alone gives the paper's output)
    new_entity_replaces_static: bool = True
    # sigmoid(w . h + b) scaling the dynamic entity scores per position (dynlm.modules.score_gate;
    # output dynamics only)
    gate_dynamic_scores: bool = False
    # a cache of the hidden states that predicted each chain's mentions, scored against the current
    # hidden state and added to the chain's logit (dynlm.modules.mention_cache; beyond the paper)
    mention_cache: bool = False
    # the entity output rows adapted per document after every sentence by a learned step on the
    # model's own prediction errors (dynlm.modules.entity_row_adaptation; beyond the paper)
    adapt_entity_rows: bool = True
    # with adapt_entity_rows: "token" also moves the shift after every position inside a sentence
    # (a chain mentioned earlier in the same sentence counts at once; the per-sentence step at its
    # end). No effect without adapt_entity_rows, so that a search can switch the rows on and off.
    entity_row_step: Literal["sentence", "token"] = "token"


@dataclass
class DynamicalSettings(Config):
    """Meta-learned dynamical LM (Wolf et al., 2018)."""

    fast_params: list[str] = field(default_factory=lambda: ["output"])  # output | embedding | recurrent
    # The meta-learner starts as dynamic evaluation with these (DynamicalLM.init_from_dynamic_eval
    # replaces them and the RMS statistics, e.g. with choose_dynamic_eval's pick):
    eta: float = 1e-3  # step size on grad / (rms + eps)
    decay: float = 0.0  # lambda, pull of theta_hat back to 0 (theta + theta_hat back to theta)
    eps: float = 1e-3  # added to the RMS statistics
    meta_hidden_dim: int = 16
    # the gates' form (dynlm.modules.meta_learner): "log_sigmoid" (Andrychowicz et al.'s log
    # preprocessing, 2 * sigmoid) or "rational" (|s| / (1 + |s|), 1 + x / (1 + |x|): no log or exp
    # per coordinate, about twice as fast an update at evaluation); both start at dynamic evaluation
    gate_form: Literal["log_sigmoid", "rational"] = "log_sigmoid"
    meta_lr: float = 1e-3  # outer learning rate of phi
    unroll_steps: int = 4  # K
    segment_len: int = 32  # T tokens
    first_order: bool = False
    checkpoint_unroll: bool = False
    # evaluation only: run the meta-learner's element-wise update (and, with a fast output layer
    # only, the softmax gradient) as torch.compile'd kernels (compiled on first use, ~10-40 s on a
    # CPU, needs a C++ compiler; evaluation ~1.4-1.5x faster than eager, see
    # benchmarks/results/dynamical_wikitext2.md). `dynlm evaluate` and validation read the model in
    # chunks of segment_len positions (LMTask.evaluation_layout): each segment is then one product.
    compile_update: bool = False


@dataclass
class ModelConfig(Config):
    type: Literal["rnn", "dntm", "dynamical"] = "dntm"
    backbone: Literal["lstm", "gru"] = "lstm"
    embed_dim: int = 128
    hidden_dim: int = 128
    num_layers: int = 1
    dropout: float = 0.2
    tie_weights: bool = False
    embedding: Literal["word", "subword", "word+subword"] = "word"
    combine: Literal["concat", "sum", "mul"] = "concat"  # word ⋄ subword
    subword_dim: int = 64
    dntm: DNTMSettings = field(default_factory=DNTMSettings)
    dynamical: DynamicalSettings = field(default_factory=DynamicalSettings)
    # -inf logits for <unk{n+2}> and above after n chains (ids follow first appearance; exact):
    # dynlm.modules.entity_mask
    mask_unseen_entities: bool = True
    # p(entity id) = P(an entity comes next | h) * softmax over the entity ids, the class from its
    # own logit, so that the scale of the entity scores cannot move the entity mass
    # (dynlm.modules.entity_class; rnn and dntm). Measured at the issue-18 size it is worse
    # overall than the joint softmax (benchmarks/results/dntm_quality.md): off by default
    entity_class_output: bool = False

    def validate(self) -> None:
        for name in ("embed_dim", "hidden_dim", "num_layers", "subword_dim"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.tie_weights and self.hidden_dim != self.embed_dim:
            raise ConfigError("model.tie_weights needs hidden_dim == embed_dim")
        dyn = self.dynamical
        if dyn.eta < 0 or dyn.decay < 0 or dyn.eps <= 0:
            raise ConfigError(f"model.dynamical: need eta >= 0, decay >= 0, eps > 0 (got {dyn.eta}, "
                              f"{dyn.decay}, {dyn.eps})")
        if self.type == "dntm":  # the other models ignore model.dntm
            self._validate_dntm()
        if self.entity_class_output and self.type == "dynamical":
            raise ConfigError("model.entity_class_output is for rnn and dntm models: the dynamical LM's "
                              "fast output layer assumes one softmax over h W^T + b")
        bad = set(self.dynamical.fast_params) - {"output", "embedding", "recurrent"}
        if bad:
            raise ConfigError(f"model.dynamical.fast_params: unknown {sorted(bad)}")

    def _validate_dntm(self) -> None:
        if self.dntm.gate_dynamic_scores and self.dntm.dynamic not in ("output", "both"):
            raise ConfigError(f"model.dntm.gate_dynamic_scores gates the output dynamics; "
                              f"model.dntm.dynamic is {self.dntm.dynamic!r}")
        if self.dntm.mention_cache and self.dntm.adapt_entity_rows:
            raise ConfigError("model.dntm.mention_cache and model.dntm.adapt_entity_rows (on by default): choose one "
                              "(set model.dntm.adapt_entity_rows: false for the mention cache)")
        if self.dntm.adapt_entity_rows and self.entity_class_output:
            raise ConfigError("model.dntm.adapt_entity_rows (on by default) steps on the joint softmax's errors; "
                              "model.entity_class_output factors it (set model.dntm.adapt_entity_rows: false)")
