"""The accumulation figure: one bar per bin at its perplexity, labelled with its count."""

from __future__ import annotations

import io
import math

from dynlm.tasks.lm_figure import accumulation_figure


def test_bars_heights_labels_and_png():
    metrics = {"ppl_first_mention": 300.0,
               "ppl_reappearing_1": 40.0, "count_reappearing_1": 12, "ppl_reappearing_2": 30.0,
               "count_reappearing_2": 9, "ppl_reappearing_3_5": 25.5, "count_reappearing_3_5": 9,
               "ppl_reappearing_6_plus": math.nan, "count_reappearing_6_plus": 0}
    figure = accumulation_figure(metrics, "model on data")
    axes = figure.axes[0]
    assert [bar.get_height() for bar in axes.patches] == [40.0, 30.0, 25.5, 0.0]
    assert [tick.get_text() for tick in axes.get_xticklabels()] == ["1", "2", "3-5", "6+"]
    assert [text.get_text() for text in axes.texts] == ["n=12", "n=9", "n=9", "n/a"]
    assert axes.get_legend().get_texts()[0].get_text() == "first mention (300.0)"
    png = io.BytesIO()
    figure.savefig(png, format="png")
    assert png.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
