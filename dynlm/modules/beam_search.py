"""Batched beam search over sequences that stop at an END token.

Each step extends every live hypothesis (a prefix) of every batch row by one token: the
``beam_size`` best extensions by total log-probability stay alive, and each prefix followed by
END becomes a finished sequence. The ``num_results`` best finished sequences per row are the
result, best first. All rows advance together (one model call per step for the whole batch).

The search stops early once, for every row, the ``num_results``-th best finished sequence scores
at least as high as the best live prefix: log-probabilities only fall as a prefix grows, so no
live hypothesis can overtake it. With a beam at least as wide as the number of possible prefixes
the search is exact (it returns what exhaustive enumeration would).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F


@dataclass
class BeamResult:
    """The best finished sequences of each row, best first.

    tokens:  [B, R, L]  long, the sequence without END, ``pad_id`` after its length
    lengths: [B, R]     long
    scores:  [B, R]     total log-probability including END; ``-inf`` where a row found fewer
                        than R sequences (those slots: all ``pad_id``, length 0)
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    scores: torch.Tensor


def beam_search(step_log_probs: Callable[[torch.Tensor], torch.Tensor], batch_size: int, *, beam_size: int,
                max_length: int, num_results: int, end_id: int, banned_ids: Sequence[int], pad_id: int,
                min_length: int = 1, device: torch.device | str = "cpu") -> BeamResult:
    """The ``num_results`` most probable END-terminated sequences of ``min_length`` to ``max_length`` tokens.

    Args:
        step_log_probs: ``prefixes [B, W, t] -> [B, W, V]`` log-probabilities of the next token
            after each prefix (``t`` = 0 at the first step, W = live hypotheses).
        batch_size: B.
        beam_size: live hypotheses kept per row.
        max_length: the longest sequence, END excluded.
        num_results: R, finished sequences returned per row.
        end_id: the token that finishes a sequence (not part of the returned tokens).
        banned_ids: tokens never emitted.
        pad_id: fills ``tokens`` after each sequence's length.
        min_length: the shortest sequence, END excluded (END is not taken before it).
        device: where the tensors live.

    Returns:
        A :class:`BeamResult`.
    """
    if beam_size < 1 or num_results < 1 or not 0 <= min_length <= max_length:
        raise ValueError(f"beam_search: need beam_size >= 1, num_results >= 1, 0 <= min_length <= max_length "
                         f"(got {beam_size}, {num_results}, {min_length}, {max_length})")
    prefixes = torch.zeros(batch_size, 1, 0, dtype=torch.long, device=device)  # [B, W, t]
    live = torch.zeros(batch_size, 1, device=device)  # [B, W] log-probability of each prefix
    best_tokens = torch.full((batch_size, num_results, max_length), pad_id, dtype=torch.long, device=device)
    best_lengths = torch.zeros(batch_size, num_results, dtype=torch.long, device=device)
    best_scores = torch.full((batch_size, num_results), float("-inf"), device=device)
    not_extended = torch.tensor(sorted({end_id, *banned_ids}), dtype=torch.long, device=device)
    for length in range(max_length + 1):
        log_probs = step_log_probs(prefixes)  # [B, W, V]
        vocab_size = log_probs.shape[-1]
        # the prefixes followed by END join the finished pool; keep its R best
        ended = live + log_probs[..., end_id] if length >= min_length else torch.full_like(live, float("-inf"))  # [B, W]
        pool_scores = torch.cat([best_scores, ended], dim=1)
        pool_tokens = torch.cat([best_tokens, F.pad(prefixes, (0, max_length - length), value=pad_id)], dim=1)
        pool_lengths = torch.cat([best_lengths, best_lengths.new_full(ended.shape, length)], dim=1)
        best_scores, keep = pool_scores.topk(num_results, dim=1)  # [B, R]
        best_tokens = pool_tokens.gather(1, keep[..., None].expand(-1, -1, max_length))
        best_lengths = pool_lengths.gather(1, keep)
        if length == max_length:
            break
        # extend every live prefix by every allowed token; keep the beam_size best
        extended = live[..., None] + log_probs.index_fill(-1, not_extended, float("-inf"))  # [B, W, V]
        flat = extended.reshape(batch_size, -1)
        live, chosen = flat.topk(min(beam_size, flat.shape[1]), dim=1)  # [B, W']
        origin, token = chosen // vocab_size, chosen % vocab_size
        prefixes = torch.cat([prefixes.gather(1, origin[..., None].expand(-1, -1, length)), token[..., None]], dim=2)
        if bool((best_scores[:, -1] >= live.max(dim=1).values).all()):
            break  # no live prefix can beat the R-th finished sequence of any row
    missing = best_scores == float("-inf")  # [B, R] slots no sequence filled
    best_tokens = best_tokens.masked_fill(missing[..., None], pad_id)
    return BeamResult(best_tokens, best_lengths.masked_fill(missing, 0), best_scores)
