"""The run figures: learning curve panels, the task's figures of the best epoch."""

from __future__ import annotations

import math

import pytest

from dynlm.figures import best_epoch_figures, plot_learning_curve

HISTORY = [
    {"epoch": 1, "train_ppl": 90.0, "valid_ppl": 80.0, "valid_ppl_first_mention": 300.0, "stopped_early": False},
    {"epoch": 2, "train_ppl": 60.0, "valid_ppl": 70.0, "valid_ppl_first_mention": math.inf},
]


def test_learning_curve_panels():
    figure = plot_learning_curve(HISTORY)
    overall, detailed = figure.axes
    assert [line.get_label() for line in overall.get_lines()] == ["train_ppl", "valid_ppl"]
    assert overall.get_lines()[1].get_xydata().tolist() == [[1.0, 80.0], [2.0, 70.0]]
    (first_mention,) = detailed.get_lines()  # the infinite point is left out
    assert first_mention.get_label() == "valid_ppl_first_mention"
    assert first_mention.get_xydata().tolist() == [[1.0, 300.0]]
    assert overall.get_yscale() == "log" and detailed.get_title() == "by token kind"
    with pytest.raises(ValueError, match="empty history"):
        plot_learning_curve([])


def test_learning_curve_reads_as_epochs_and_plain_numbers_with_oov_apart():
    history = [{**row, "valid_ppl_oov": 4000.0 + row["epoch"]} for row in HISTORY]
    figure = plot_learning_curve(history, "run exp1 (ab12cd34), model dntm")
    overall, detailed, oov = figure.axes
    assert [line.get_label() for line in detailed.get_lines()] == ["valid_ppl_first_mention"]
    assert [line.get_label() for line in oov.get_lines()] == ["valid_ppl_oov"]
    assert oov.get_title() == "off the short list (OOV)" and figure._suptitle.get_text() == "run exp1 (ab12cd34), model dntm"
    figure.canvas.draw()
    assert all(tick == int(tick) for tick in overall.get_xticks())  # whole epochs, not 1.25
    labels = [t.get_text() for t in overall.get_yticklabels(minor=True) + overall.get_yticklabels() if t.get_text()]
    assert labels and all(label.replace(".", "").isdigit() for label in labels), labels  # "70", not "7×10¹"


def test_best_epoch_figures():
    assert best_epoch_figures(HISTORY) == {}  # no accumulation metrics: no figure
    assert best_epoch_figures([{"epoch": 1, "train_ppl": 3.0}]) == {}  # no validation
    bins = ("1", "2", "3_5", "6_plus")
    best = {**HISTORY[1], **{f"valid_ppl_reappearing_{b}": 20.0 + i for i, b in enumerate(bins)},
            **{f"valid_count_reappearing_{b}": 5 for b in bins}}
    worse = {**best, "epoch": 3, "valid_ppl": 75.0, "valid_ppl_reappearing_1": 99.0}
    (name, figure), = best_epoch_figures([HISTORY[0], best, worse]).items()
    assert name == "accumulation.png"
    assert [bar.get_height() for bar in figure.axes[0].patches] == [20.0, 21.0, 22.0, 23.0]
