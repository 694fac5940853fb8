"""Loss functions as pure functions of model outputs and batches (no state, no modules)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_nll(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
              positions: torch.Tensor | None = None) -> torch.Tensor:
    """Negative log-likelihood of every target, zero at padding.

    Args:
        logits: ``[B, L, V]`` scores, or ``[N, V]`` at ``positions``.
        targets: ``[B, L]`` long target ids.
        mask: ``[B, L]`` bool, True at real positions.
        positions: ``[N]`` the flat positions ``b * L + l`` of ``logits``' rows (``LMOutput.positions``:
            exactly the real ones); None: ``logits`` is ``[B, L, V]``.

    Returns:
        ``[B, L]`` float NLL in nats (0 where ``mask`` is False).
    """
    if positions is not None:
        picked = targets.reshape(-1).index_select(0, positions)
        nll = F.cross_entropy(logits.float(), picked, reduction="none")  # [N]
        return nll.new_zeros(targets.numel()).index_copy(0, positions, nll).view_as(targets)
    nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), reduction="none")
    return nll.view_as(targets).masked_fill(~mask, 0.0)


def lm_loss_sum(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL over real positions and the number of real positions (``positions`` as in
    :func:`token_nll`).

    Returns:
        ``(nll_sum, count)``: a differentiable scalar and a long scalar.
    """
    if positions is not None:
        nll = F.cross_entropy(logits.float(), targets.reshape(-1).index_select(0, positions), reduction="sum")
        return nll, mask.sum()
    return token_nll(logits, targets, mask).sum(), mask.sum()


def chunk_loss(outputs, sentences) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training objective over consecutive sentence steps (one truncated-BPTT chunk).

    ``loss = (sum of token NLL) / (number of tokens) + mean over steps of LMOutput.aux_loss``.

    Args:
        outputs: list of ``LMOutput`` (one per sentence step).
        sentences: the matching list of ``SentenceBatch``.

    Returns:
        ``(loss, nll_sum, count)``; ``nll_sum`` and ``count`` are detached.
    """
    nll_sum = torch.zeros((), device=outputs[0].logits.device)
    count = torch.zeros((), dtype=torch.long, device=outputs[0].logits.device)
    aux = []
    for output, sentence in zip(outputs, sentences):
        part_sum, part_count = lm_loss_sum(output.logits, sentence.targets, sentence.mask, output.positions)
        nll_sum = nll_sum + part_sum
        count = count + part_count
        if output.aux_loss is not None:
            aux.append(output.aux_loss)
    loss = nll_sum / count.clamp(min=1)
    if aux:
        loss = loss + torch.stack(aux).mean()
    return loss, nll_sum.detach(), count
