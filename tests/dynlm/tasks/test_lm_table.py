"""The LM evaluation table on a hand-made metrics dict: exact text."""

from __future__ import annotations

import math

from dynlm.tasks.lm_table import format_metrics_table

CATEGORIES = ("all", "first_mention", "reappearing", "reappearing_1", "reappearing_2", "reappearing_3_5",
              "reappearing_6_plus", "after_entity", "oov")


def test_table_lists_the_accumulation_bins_under_re_appearing_entities():
    ppl = dict(zip(CATEGORIES, (50.0, 400.0, 30.0, 40.0, 30.0, 25.0, math.nan, 60.0, 900.5)))
    count = dict(zip(CATEGORIES, (1000, 20, 30, 12, 9, 9, 0, 50, 7)))
    metrics = {("ppl" if c == "all" else f"ppl_{c}"): ppl[c] for c in CATEGORIES}
    metrics.update({f"count_{c}": count[c] for c in CATEGORIES})
    assert format_metrics_table(metrics, "model on data").splitlines() == [
        "model on data",
        "  tokens                           count    perplexity",
        "  all tokens                        1000         50.00",
        "  first mention                       20        400.00",
        "  re-appearing entity                 30         30.00",
        "    1 earlier mention                 12         40.00",
        "    2 earlier mentions                 9         30.00",
        "    3-5 earlier mentions               9         25.00",
        "    6+ earlier mentions                0           n/a",
        "  after an entity                     50         60.00",
        "  off the short list (OOV)             7        900.50",
    ]
