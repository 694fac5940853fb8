"""DDP helpers that stay Ray-free (used by the Ray Train workers and scripts/device_check.py)."""

from __future__ import annotations

import dataclasses

import torch


class EveryParameterUsed(torch.nn.Module):
    """Wrap an LM so every forward touches every parameter (with a zero-valued term).

    DDP's reducer needs the same set of parameters to receive gradients on every rank at
    every step. A DNTM chunk without entity mentions (or an inactive padding chunk) leaves the
    entity modules out of the graph; when that happens on one rank only, DDP's collectives
    go out of step and the ranks hang or crash (even with ``find_unused_parameters=True``,
    since DDP cannot see the tensors inside the ``LMOutput`` dataclass).
    Adding ``0 * sum(first element of each parameter)`` to the first output's logits puts
    every parameter in every graph at a negligible cost, so plain DDP
    (``find_unused_parameters=False``) works. The state methods pass through to ``lm``.
    """

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    @property
    def needs_grad_at_eval(self) -> bool:
        return bool(getattr(self.lm, "needs_grad_at_eval", False))

    def init_state(self, batch_size: int, device=None):
        return self.lm.init_state(batch_size, device)

    def detach_state(self, state):
        return self.lm.detach_state(state)

    def reset_state(self, state, keep):
        return self.lm.reset_state(state, keep)

    def forward(self, batch, state):
        outputs, state = self.lm(batch, state)
        anchor = sum(p.reshape(-1)[:1].sum() for p in self.lm.parameters() if p.requires_grad) * 0.0
        first = outputs[0] if isinstance(outputs, list) else outputs
        touched = dataclasses.replace(first, logits=first.logits + anchor.to(first.logits.dtype))
        if isinstance(outputs, list):
            return [touched] + outputs[1:], state
        return touched, state
