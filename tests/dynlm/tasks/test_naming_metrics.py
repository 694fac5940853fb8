"""Tests of dynlm.tasks.naming_metrics: F1 over subtokens, exact match, neologisms, the curve."""

from __future__ import annotations

import math

import pytest
import torch

from dynlm.tasks.naming_metrics import (
    CURVE_FIELDS,
    THRESHOLDS,
    TOTALS,
    NamingMetrics,
    subtoken_scores,
)

KNOWN = {("get", "name"), ("set", "name"), ("get", "value")}


def test_subtoken_f1_on_a_hand_computed_case():
    # suggested get/user/name vs true get/name: common {get, name} = 2, P = 2/3, R = 2/2, F1 = 2·(2/3)/(5/3) = 0.8
    assert subtoken_scores(("get", "user", "name"), ("get", "name")) == pytest.approx((2 / 3, 1.0, 0.8))
    # multisets: suggested a/a/b vs a/b/b: common {a, b} = 2, P = R = F1 = 2/3
    assert subtoken_scores(("a", "a", "b"), ("a", "b", "b")) == pytest.approx((2 / 3, 2 / 3, 2 / 3))
    assert subtoken_scores(("x",), ("y", "z")) == (0.0, 0.0, 0.0)


def filled() -> NamingMetrics:
    metrics = NamingMetrics()
    metrics.update(
        suggestions=[
            [(("get", "name"), math.log(0.9)), (("set", "name"), math.log(0.05))],  # exact at 1, p = 0.9
            [(("get", "value"), math.log(0.5)), (("set", "value"), math.log(0.3))],  # exact at 2 only; set/value is new
            [(("set", "value"), math.log(0.12))],  # a correct neologism, p = 0.12
            [],  # abstains: no suggestion
        ],
        truths=[("get", "name"), ("set", "value"), ("set", "value"), ("is", "empty")],
        log_probs=[math.log(0.9), math.log(0.3), math.log(0.12), math.log(0.01)],
        known_names=KNOWN, dunders=[False] * 4)
    return metrics


def test_compute_on_a_hand_computed_case():
    out = filled().compute()
    assert out["functions"] == 4 and out["tokens"] == 4
    nll = -(math.log(0.9) + math.log(0.3) + math.log(0.12) + math.log(0.01))
    assert out["loss"] == pytest.approx(nll / 4) and out["ppl"] == pytest.approx(math.exp(nll / 4))
    assert out["exact_at_1"] == pytest.approx(2 / 4)  # functions 0 and 2
    assert out["exact_at_5"] == pytest.approx(3 / 4)  # and function 1 at rank 2
    # top-1 F1: 1, get/value vs set/value = 0.5, 1, 0 (no suggestion)
    assert out["f1_at_1"] == pytest.approx(2.5 / 4) and out["f1_error"] == pytest.approx(1 - 2.5 / 4)
    assert out["precision_at_1"] == pytest.approx(2.5 / 4) and out["recall_at_1"] == pytest.approx(2.5 / 4)
    assert out["f1_at_5"] == pytest.approx(3 / 4)
    assert out["neologisms_suggested"] == 1 and out["neologisms_correct"] == 1
    # threshold 0.0: the 3 that suggest; 0.15 (index 3): functions 0 and 1; 0.9 (index 18): function 0 only
    assert THRESHOLDS[3] == 0.15 and THRESHOLDS[18] == 0.9 and THRESHOLDS[19] == 0.95
    assert out["curve0_suggested"] == pytest.approx(3 / 4) and out["curve0_f1_at_1"] == pytest.approx(2.5 / 3)
    assert out["curve3_suggested"] == pytest.approx(2 / 4) and out["curve3_f1_at_1"] == pytest.approx(1.5 / 2)
    assert out["curve3_exact_at_1"] == pytest.approx(1 / 2) and out["curve3_exact_at_5"] == pytest.approx(1.0)
    assert out["curve18_suggested"] == pytest.approx(1 / 4) and out["curve18_exact_at_1"] == 1.0
    assert out["curve19_suggested"] == 0.0 and math.isnan(out["curve19_f1_at_1"])


def test_curve_is_monotonic_in_suggestion_frequency():
    metrics = NamingMetrics()
    generator = torch.Generator().manual_seed(0)
    probs = torch.rand(200, generator=generator).tolist()
    metrics.update([[(("a",), math.log(p))] for p in probs], [("a",)] * 200, [-1.0] * 200, set(), dunders=[False] * 200)
    curve = metrics.curve()
    assert [row["threshold"] for row in curve] == list(THRESHOLDS)
    frequencies = [row["suggestion_frequency"] for row in curve]
    assert frequencies[0] == 1.0
    assert all(later <= earlier for earlier, later in zip(frequencies, frequencies[1:]))
    assert frequencies[10] == pytest.approx(sum(p >= 0.5 for p in probs) / 200)


def test_merge_as_tensor_from_tensor_and_from_metrics_round_trip():
    first, second = filled(), NamingMetrics()
    second.update([[(("get", "value"), math.log(0.7))]], [("get", "value")], [math.log(0.7)], KNOWN, dunders=[True])
    both = NamingMetrics().merge(first).merge(second)
    assert both.compute()["functions"] == 5
    summed = first.as_tensor() + second.as_tensor()  # what the SUM all-reduce does
    assert summed.dtype == torch.float64 and summed.shape == (len(TOTALS) + len(THRESHOLDS) * len(CURVE_FIELDS),)
    assert NamingMetrics.from_tensor(summed).compute() == pytest.approx(both.compute(), nan_ok=True)
    again = NamingMetrics.from_metrics(both.compute())
    assert torch.equal(again.as_tensor(), both.as_tensor())
    with pytest.raises(ValueError, match="expected 155 values"):
        NamingMetrics.from_tensor(torch.zeros(3, dtype=torch.float64))


def test_empty_and_mismatched_input():
    out = NamingMetrics().compute()
    assert out["functions"] == 0 and math.isnan(out["loss"]) and math.isnan(out["f1_at_1"])
    with pytest.raises(ValueError, match="1 dunder flags"):
        NamingMetrics().update([[]], [("a",), ("b",)], [0.0], set(), dunders=[False])


def test_non_dunder_sums_on_a_hand_computed_batch():
    metrics = NamingMetrics()
    metrics.update(
        suggestions=[
            [(("init",), math.log(0.95))],  # __init__: exact, p = 0.95
            [(("eq",), math.log(0.6))],  # __eq__: exact, p = 0.6
            [(("get", "value"), math.log(0.4)), (("load", "user"), math.log(0.2))],  # load_user: F1 0, at 5 exact
            [(("parse", "header"), math.log(0.7))],  # parse_dict_header: P 1, R 2/3, F1 0.8
            [],  # is_empty: abstains
        ],
        truths=[("init",), ("eq",), ("load", "user"), ("parse", "dict", "header"), ("is", "empty")],
        log_probs=[math.log(0.95), math.log(0.6), math.log(0.2), math.log(0.3), math.log(0.01)],
        known_names=KNOWN, dunders=[True, True, False, False, False])
    out = metrics.compute()
    assert out["functions"] == 5 and out["f1_at_1"] == pytest.approx(2.8 / 5)  # 1 + 1 + 0 + 0.8 + 0
    assert out["non_dunder_functions"] == 3
    assert out["non_dunder_f1_at_1"] == pytest.approx(0.8 / 3) and out["non_dunder_exact_at_1"] == 0.0
    assert out["non_dunder_f1_at_5"] == pytest.approx(1.8 / 3) and out["non_dunder_exact_at_5"] == pytest.approx(1 / 3)
    # threshold 0.5 (index 10): the two dunders and parse_header suggest; of the 3 non-dunders, 1
    assert out["curve10_suggested"] == pytest.approx(3 / 5) and out["curve10_f1_at_1"] == pytest.approx(2.8 / 3)
    assert out["curve10_non_dunder_suggested"] == pytest.approx(1 / 3)
    assert out["curve10_non_dunder_f1_at_1"] == pytest.approx(0.8) and out["curve10_non_dunder_exact_at_1"] == 0.0
    assert out["curve0_non_dunder_suggested"] == pytest.approx(2 / 3)
    assert out["curve0_non_dunder_f1_at_1"] == pytest.approx(0.4)
    assert out["curve19_non_dunder_suggested"] == 0.0 and math.isnan(out["curve19_non_dunder_f1_at_1"])
    # fixed-size sums: the all-reduce and the round trip keep the subset
    assert NamingMetrics.from_tensor(metrics.as_tensor()).compute() == pytest.approx(out, nan_ok=True)
    assert torch.equal(NamingMetrics.from_metrics(out).as_tensor(), metrics.as_tensor())


def test_the_table_shows_the_non_dunder_rows():
    from dynlm.tasks.naming_report import format_naming_table

    metrics = NamingMetrics()
    metrics.update([[(("init",), math.log(0.9))], [(("parse", "header"), math.log(0.7))]],
                   [("init",), ("parse", "dict", "header")], [math.log(0.9), math.log(0.3)], KNOWN,
                   dunders=[True, False])
    lines = format_naming_table(metrics.compute(), "t").splitlines()
    assert "  F1@1 (subtokens)                 0.900" in lines  # (1 + 0.8) / 2
    assert "  non-dunder functions                 1" in lines
    assert "  non-dunder F1@1                  0.800" in lines
    assert "  non-dunder exact@1               0.000" in lines
    start = lines.index("  the same curve, non-dunder functions only (__init__, __eq__... left out)")
    assert lines[start + 2] == "          0.00       1.000     0.800     0.000"
    assert lines[start + 5] == "          0.75       0.000       n/a       n/a"
