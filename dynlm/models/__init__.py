"""Language models; :func:`build_model` picks one from ``ModelConfig.type``."""

from __future__ import annotations

from torch import nn

from dynlm.models.config import DNTMSettings, DynamicalSettings, ModelConfig
from dynlm.models.outputs import LMOutput, accepts_sentence_lists, forward_sentences
from dynlm.models.rnn_lm import RNNLM, RNNState, rnn_lm_base, rnn_lm_small, rnn_lm_subword_small
from dynlm.vocab_spec import VocabSpec


def build_model(cfg: ModelConfig, spec: VocabSpec) -> nn.Module:
    """Build the model named by ``cfg.type`` ("rnn", "dntm" or "dynamical").

    Args:
        cfg: the model config.
        spec: vocabulary sizes from the preprocessing artifact.

    Returns:
        An ``nn.Module`` with the stateful LM interface (see :mod:`dynlm.models.outputs`).
    """
    if cfg.type == "rnn":
        return RNNLM(cfg, spec)
    if cfg.type == "dntm":
        from dynlm.models.dntm import DNTM  # lazy: optional file

        return DNTM(cfg, spec)
    if cfg.type == "dynamical":
        from dynlm.models.dynamical_lm import DynamicalLM  # lazy: optional file

        return DynamicalLM(cfg, spec)
    raise ValueError(f"build_model: unknown model.type {cfg.type!r} (expected rnn, dntm or dynamical)")


def needs_whole_sentences(cfg: ModelConfig) -> bool:
    """Whether ``cfg``'s model must get whole sentences per forward call (its class's
    ``needs_whole_sentences``: the DNTM merges a sentence's mentions after reading all of it)."""
    if cfg.type == "dntm":
        from dynlm.models.dntm import DNTM

        return DNTM.needs_whole_sentences
    if cfg.type == "dynamical":
        from dynlm.models.dynamical_lm import DynamicalLM

        return bool(getattr(DynamicalLM, "needs_whole_sentences", False))
    return RNNLM.needs_whole_sentences


def supports_packed_documents(cfg: ModelConfig) -> bool:
    """Whether ``cfg``'s model resets its state where a document starts inside a row
    (``batch.doc_start``), so that a row may hold several documents
    (:attr:`dynlm.data.batching.ChunkLayout.pack_documents`)."""
    if cfg.type == "dntm":
        from dynlm.models.dntm import DNTM

        return DNTM.supports_packed_documents
    if cfg.type == "dynamical":
        from dynlm.models.dynamical_lm import DynamicalLM

        return bool(getattr(DynamicalLM, "supports_packed_documents", False))
    return RNNLM.supports_packed_documents


__all__ = [
    "DNTMSettings", "DynamicalSettings", "LMOutput", "ModelConfig", "RNNLM", "RNNState",
    "accepts_sentence_lists", "build_model", "forward_sentences", "needs_whole_sentences", "rnn_lm_base", "supports_packed_documents", "rnn_lm_small", "rnn_lm_subword_small",
]
