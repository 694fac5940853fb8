"""A factored output: "is the next token an entity?" first, then "which entity?".

With one softmax over words and entity identifiers, the probability that the next token is
*some* entity is ``sum_k exp(s_k) / Z``: it moves with the scale of every entity score. In the
DNTM those scores are ``b^y_k . h + h . W_dy d_k`` summed over up to K chains, so a small shared
change (the norm of ``W_dy``, of the memory vectors) moves the whole entity mass. Measured on
LitBank at a constant learning rate, that mass at ordinary word targets went from 3 % to 25 % and
back between epochs, and the re-appearing-entity perplexity swung 9x with it, while "which
entity" moved little (``benchmarks/dntm_swing.py``, ``benchmarks/results/dntm_quality.md``).

Here the class probability is one learned logit of the hidden state, ``a = u . h + c``::

    p(word w)   = sigmoid(-a) * softmax over the words   (w)
    p(<unk_k>)  = sigmoid( a) * softmax over the entities (k)   (masked ids stay at 0)

so the entity scores only decide between entities (the mechanism of Ji et al., 2017's EntityNLM
and Yang et al., 2017's reference-aware LM: a binary "entity or not" variable). The output is a
vector of log-probabilities, a valid ``logits`` tensor: its log-softmax is itself. ``u`` starts
at 0 and ``c`` at ``log(K / V_words)``, the entity share a uniform softmax gives.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class EntityClassOutput(nn.Module):
    """``(word_logits [..., V_w], entity_logits [..., K], hidden [..., H]) -> log-probs [..., V_w + K]``.

    Args:
        hidden_dim: H.
        num_words: V_w, the word columns (for the initial class bias).
        num_entities: K, the entity identifiers.
    """

    def __init__(self, hidden_dim: int, num_words: int, num_entities: int):
        super().__init__()
        if num_words < 1 or num_entities < 1:
            raise ValueError(f"EntityClassOutput needs words and entities, got {num_words} and {num_entities}")
        self.score = nn.Linear(hidden_dim, 1)  # a = u . h + c
        nn.init.zeros_(self.score.weight)
        nn.init.constant_(self.score.bias, math.log(num_entities / num_words))

    def forward(self, word_logits: torch.Tensor, entity_logits: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        class_logit = _at_least_float32(self.score(hidden))  # [..., 1]
        words = F.log_softmax(_at_least_float32(word_logits), dim=-1) + F.logsigmoid(-class_logit)  # [..., V_w]
        entities = F.log_softmax(_at_least_float32(entity_logits), dim=-1) + F.logsigmoid(class_logit)  # [..., K]
        return torch.cat([words, entities], dim=-1)


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """float32 for half types (log-probabilities under autocast), float64 kept (gradient checks)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()
