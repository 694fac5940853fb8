"""What every language model returns, and the sentence-list forward convention.

Every model in :mod:`dynlm.models` follows one stateful interface::

    state = model.init_state(batch_size, device)
    output, state = model(sentence_batch, state)        # output: LMOutput
    outputs, state = model([s1, s2, s3], state)         # list in -> list of LMOutput out
    state = model.detach_state(state)                   # truncated BPTT boundary
    state = model.reset_state(state, keep)              # keep [B] bool; False rows are zeroed

Passing a *list* of sentence batches runs them in order inside ONE ``forward`` call. The
training loop uses that so a DistributedDataParallel wrapper sees exactly one forward per
backward (required by ``DDP.join()`` for uneven inputs). :func:`accepts_sentence_lists` (decorator) or
:func:`forward_sentences` (function) give a model's ``forward`` that ability.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass
class LMOutput:
    """The output of one forward over a sentence batch.

    Attributes:
        logits: ``[B, L, V_out]`` unnormalised scores over words + entity identifiers.
        hidden: ``[B, L, H]`` the top recurrent layer (before output dropout).
        aux_loss: optional scalar extra training loss (already averaged), added by the
            training loop to the token NLL (e.g. an entity-prediction term).
        extras: anything else a loss or analysis needs (model specific, documented there).
    """

    logits: torch.Tensor
    hidden: torch.Tensor
    aux_loss: torch.Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)


def accepts_sentence_lists(forward: Callable) -> Callable:
    """Decorate a single-sentence ``forward(self, batch, state)`` so it also takes a list.

    With a list of ``SentenceBatch`` the wrapped forward runs them in order, threading the
    state, and returns ``(list[LMOutput], state)``. The training loop checks the marker
    attribute ``accepts_sentence_lists`` on ``type(model).forward`` and then makes ONE forward
    call per truncated-BPTT chunk (what ``DDP.join()`` needs).

    Example::

        class MyLM(nn.Module):
            @accepts_sentence_lists
            def forward(self, batch, state):
                ...
                return LMOutput(logits, hidden), state
    """

    @functools.wraps(forward)
    def wrapper(self, batch, state, *args, **kwargs):
        if isinstance(batch, (list, tuple)):
            outputs = []
            for sentence in batch:
                output, state = forward(self, sentence, state, *args, **kwargs)
                outputs.append(output)
            return outputs, state
        return forward(self, batch, state, *args, **kwargs)

    wrapper.accepts_sentence_lists = True
    return wrapper


def forward_sentences(
    step: Callable[[Any, Any], tuple[LMOutput, Any]], batch: Any, state: Any
) -> tuple[LMOutput | list[LMOutput], Any]:
    """Run ``step(sentence, state)`` over one sentence batch or a list of them.

    The function form of :func:`accepts_sentence_lists`, for a model whose ``forward`` is
    ``return forward_sentences(self.forward_sentence, batch, state)``.

    Args:
        step: the model's single-sentence forward ``(SentenceBatch, state) -> (LMOutput, state)``.
        batch: a ``SentenceBatch`` or a list/tuple of them (consecutive sentences, same documents).
        state: the recurrent state before the first sentence.

    Returns:
        ``(LMOutput, state)`` for a single batch, ``(list[LMOutput], state)`` for a list.
    """
    if isinstance(batch, (list, tuple)):
        outputs = []
        for sentence in batch:
            output, state = step(sentence, state)
            outputs.append(output)
        return outputs, state
    return step(batch, state)
