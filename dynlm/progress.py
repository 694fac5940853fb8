"""What the terminal shows of a training: one progress bar per epoch, one line of metrics per epoch.

Ray-free: ``pipelines/console.py`` relays rank 0's events to the driver, where an
:class:`EpochBar` draws them. Events are tuples::

    ("step", epoch, steps, loss, tokens_per_s)   the bar of ``epoch`` moves to ``steps``
    ("epoch", record)                            the bar closes; :func:`format_epoch_line` of the record
    ("note", text)                               the bar closes; ``text`` as a line
"""

from __future__ import annotations

import math
import sys
from typing import Any, TextIO

VALID_DETAILS = (("first_mention", "first mention"), ("reappearing", "re-appearing"),
                 ("after_entity", "after entity"), ("oov", "OOV"))


def _number(value: float) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.2f}"


#: What an epoch line shows of a task whose objective is not perplexity (``objective_metric`` in
#: the record): the readable side of its objective, in percent. A perplexity of names (naming) or
#: of answers (cloze) tells a reader of those tasks little, so it is left to MLflow.
READABLE_METRICS = (("accuracy", "accuracy"), ("f1_at_1", "F1@1"), ("exact_at_1", "exact@1"))


def _is_lm(record: dict[str, Any]) -> bool:
    return record.get("objective_metric", "ppl") == "ppl"


def _valid_headline(record: dict[str, Any]) -> str:
    """``ppl 150.2``; a task whose objective is not perplexity: ``F1@1 39.2 %, exact@1 31.0 %``
    (or ``f1_error 0.6080`` when the record holds none of :data:`READABLE_METRICS`)."""
    if _is_lm(record):
        return f"ppl {_number(record['valid_ppl'])}" if "valid_ppl" in record else ""
    readable = [f"{label} {100 * record[f'valid_{key}']:.1f} %" for key, label in READABLE_METRICS
                if f"valid_{key}" in record and math.isfinite(record[f"valid_{key}"])]
    return ", ".join(readable) or f"{record['objective_metric']} {record['valid_objective']:.4f}"


def format_epoch_line(record: dict[str, Any], epochs: int) -> str:
    """One line of metrics for an epoch record of ``train_fn_per_worker``.

    Example (the LM): ``epoch 1/4  train loss 5.117 ppl 166.8 | valid ppl 150.2 (first mention
    310.4, re-appearing 80.1, after entity 95.0, OOV 700.2) | 1,234 tok/s, 25.6 s``; naming:
    ``epoch 2/3  train loss 3.210 | valid F1@1 39.2 %, exact@1 31.0 % | 1,530 examples/s, 4.1 s``.
    """
    lm = _is_lm(record)
    details = ", ".join(f"{label} {_number(record[f'valid_ppl_{key}'])}" for key, label in VALID_DETAILS
                        if f"valid_ppl_{key}" in record) if lm else ""
    line = (f"epoch {record['epoch']}/{epochs}  train loss {record['train_loss']:.3f}"
            + (f" ppl {_number(record['train_ppl'])}" if lm else "") + f" | valid {_valid_headline(record)}"
            + (f" ({details})" if details else "")
            + f" | {record['train_tokens_per_s']:,.0f} {'tok' if lm else 'examples'}/s, {record['train_seconds']:.1f} s")
    if record.get("stopped_early"):
        line += "  (early stop)"
    return line


class EpochBar:
    """Draws training events on ``stream``: a tqdm bar per epoch (only on a terminal) and lines.

    Args:
        epochs: ``train.epochs`` (for "epoch 2/4").
        steps_per_epoch: expected optimizer steps of an epoch (the bar's length; an estimate).
        stream: where to draw (default stderr, like Ray Data's bars).
    """

    def __init__(self, epochs: int, steps_per_epoch: int, stream: TextIO | None = None):
        self.epochs, self.steps_per_epoch = epochs, max(1, steps_per_epoch)
        self.stream = stream if stream is not None else sys.stderr
        self.bar = None

    def show(self, events: list[tuple]) -> None:
        """Draw ``events`` (the tuples of this module's docstring) in order."""
        for kind, *payload in events:
            if kind == "step":
                self.step(*payload)
            elif kind == "epoch":
                self.close()
                print(format_epoch_line(payload[0], self.epochs), file=self.stream, flush=True)
            else:
                self.close()
                print(payload[0], file=self.stream, flush=True)

    def step(self, epoch: int, steps: int, loss: float, tokens_per_s: float) -> None:
        from tqdm import tqdm  # lazy: only a training draws bars

        if self.bar is None:
            self.bar = tqdm(total=self.steps_per_epoch, desc=f"epoch {epoch}/{self.epochs}", file=self.stream,
                            bar_format="{desc} {bar} {n}/{total} steps [{elapsed}<{remaining}{postfix}]",
                            leave=False, dynamic_ncols=True, disable=None)  # disable=None: only on a terminal
        self.bar.n = min(steps, self.steps_per_epoch)
        self.bar.set_postfix_str(f"loss {loss:.3f}, {tokens_per_s:,.0f} tok/s", refresh=True)

    def close(self) -> None:
        """Remove the current bar (``leave=False``), if any."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
