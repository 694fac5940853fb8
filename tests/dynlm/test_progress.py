"""The training progress on the terminal: epoch lines, and the events an EpochBar draws."""

from __future__ import annotations

import io

from dynlm.progress import EpochBar, format_epoch_line

RECORD = {"epoch": 2, "train_loss": 1.23456, "train_ppl": 3.4367, "valid_ppl": 2.95,
          "valid_ppl_first_mention": 5.44, "valid_ppl_reappearing": 2.91, "valid_ppl_after_entity": float("nan"),
          "valid_ppl_oov": float("inf"), "train_tokens_per_s": 1587.6, "train_seconds": 22.71,
          "stopped_early": 0.0}


def test_format_epoch_line():
    assert format_epoch_line(RECORD, 4) == (
        "epoch 2/4  train loss 1.235 ppl 3.44 | valid ppl 2.95 (first mention 5.44, re-appearing 2.91, "
        "after entity n/a, OOV n/a) | 1,588 tok/s, 22.7 s")
    minimal = {k: RECORD[k] for k in ("epoch", "train_loss", "train_ppl", "valid_ppl", "train_tokens_per_s",
                                      "train_seconds")}
    assert format_epoch_line({**minimal, "stopped_early": 1.0}, 2) == (
        "epoch 2/2  train loss 1.235 ppl 3.44 | valid ppl 2.95 | 1,588 tok/s, 22.7 s  (early stop)")


class Terminal(io.StringIO):
    def isatty(self) -> bool:  # tqdm draws only on a terminal
        return True


def test_epoch_bar_draws_steps_then_lines():
    stream = Terminal()
    bar = EpochBar(epochs=4, steps_per_epoch=10, stream=stream)
    bar.show([("step", 2, 3, 2.5, 1234.0), ("step", 2, 25, 2.4, 1300.0)])
    assert bar.bar.n == 10  # at most the estimated length
    assert "epoch 2/4" in stream.getvalue() and "loss 2.400, 1,300 tok/s" in stream.getvalue()
    bar.show([("epoch", RECORD), ("note", "[train] a note")])
    assert bar.bar is None
    assert stream.getvalue().splitlines()[-2:] == [format_epoch_line(RECORD, 4), "[train] a note"]


def test_epoch_bar_off_a_terminal_prints_only_lines():
    stream = io.StringIO()
    bar = EpochBar(epochs=1, steps_per_epoch=0, stream=stream)
    bar.show([("step", 1, 1, 2.5, 10.0), ("note", "done")])
    bar.close()
    assert stream.getvalue() == "done\n"


def test_a_task_that_is_not_an_lm_shows_its_own_metrics():
    """Naming and cloze: the readable side of their objective, no perplexity of names or answers."""
    common = {"epoch": 2, "train_loss": 3.2104, "train_ppl": 24.8, "valid_ppl": 298115.0, "train_tokens_per_s": 1530.2,
              "train_seconds": 4.12}
    naming = {**common, "objective_metric": "f1_error", "valid_objective": 0.608, "valid_f1_at_1": 0.392,
              "valid_exact_at_1": 0.31}
    assert format_epoch_line(naming, 3) == (
        "epoch 2/3  train loss 3.210 | valid F1@1 39.2 %, exact@1 31.0 % | 1,530 examples/s, 4.1 s")
    cloze = {**common, "objective_metric": "error", "valid_objective": 0.25, "valid_accuracy": 0.75}
    assert format_epoch_line(cloze, 2) == "epoch 2/2  train loss 3.210 | valid accuracy 75.0 % | 1,530 examples/s, 4.1 s"
    other = {**common, "objective_metric": "bits", "valid_objective": 1.5}  # a task of its own: the objective
    assert format_epoch_line(other, 2) == "epoch 2/2  train loss 3.210 | valid bits 1.5000 | 1,530 examples/s, 4.1 s"
