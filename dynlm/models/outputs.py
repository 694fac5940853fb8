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
        logits: unnormalised scores over words + entity identifiers: ``[B, L, V_out]``, or, when
            ``positions`` is set, ``[N, V_out]`` at the batch's N real positions only (the output
            layer is the largest cost of a step, and rows of whole-sentence chunks end unevenly).
        hidden: ``[B, L, H]`` the top recurrent layer (before output dropout).
        aux_loss: optional scalar extra training loss (already averaged), added by the
            training loop to the token NLL (e.g. an entity-prediction term).
        extras: anything else a loss or analysis needs (model specific, documented there).
        positions: ``[N]`` long, the flat position ``b * L + l`` of each row of ``logits``
            (:func:`real_positions`); None: ``logits`` is ``[B, L, V_out]``. Losses take it
            (:func:`dynlm.losses.token_nll`); :meth:`padded_logits` gives the ``[B, L, V_out]`` form.
    """

    logits: torch.Tensor
    hidden: torch.Tensor
    aux_loss: torch.Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    positions: torch.Tensor | None = None

    def padded_logits(self, fill: float = 0.0) -> torch.Tensor:
        """``[B, L, V_out]`` scores, ``fill`` at the padding (a copy when ``positions`` is set)."""
        if self.positions is None:
            return self.logits
        batch_size, width = self.hidden.shape[:2]
        out = self.logits.new_full((batch_size * width, self.logits.size(-1)), fill)
        return out.index_copy(0, self.positions, self.logits).view(batch_size, width, -1)


def real_positions(lengths: torch.Tensor, width: int, device: torch.device | str) -> torch.Tensor | None:
    """The flat positions ``b * width + l`` (``l < lengths[b]``) of a batch's real tokens, ``[N]``
    long on ``device``, from the CPU ``lengths [B]`` (no device synchronisation); None when no
    row is padded (then every position is real and the dense form is as cheap) or none is real
    (an inactive step: the dense form keeps every parameter in the graph, as DDP needs)."""
    if bool((lengths == width).all()) or not bool(lengths.any()):
        return None
    real = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)  # [B, L] on the CPU
    return real.view(-1).nonzero().squeeze(1).to(device, non_blocking=True)


def at_positions(values: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    """``values [B, L, *]`` at ``positions`` -> ``[N, *]`` (as is when ``positions`` is None)."""
    if positions is None:
        return values
    return values.flatten(0, 1).index_select(0, positions)


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
