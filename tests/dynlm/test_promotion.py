"""The champion/challenger policy: a relative margin, the same validation set, conflicts."""

from __future__ import annotations

import pytest

from dynlm.promotion import (
    MeasuredChampion,
    decide_registration,
    promotion_decision,
    registered_name,
)


def test_promotion_policy_margin_is_relative():
    decide = promotion_decision
    # margin 0.25: the challenger must be below 75% of the champion's perplexity, at any scale
    assert decide(29.99, "v", 40.0, "v", 0.25)[0] is True
    assert decide(30.0, "v", 40.0, "v", 0.25)[0] is False  # 40 x 0.75 = 30: not strictly below
    assert decide(299.0, "v", 400.0, "v", 0.25)[0] is True
    assert decide(310.0, "v", 400.0, "v", 0.25)[0] is False  # 90 points better, but only 22.5%
    promote, reason = decide(35.0, "v", 40.0, "v", 0.0)  # margin 0: strictly better is enough
    assert promote is True and reason == ("valid_ppl 35.0000 beats champion ppl 40.0000 x (1 - margin 0) "
                                          "= 40.0000 on validation v")
    assert decide(40.0, "v", 40.0, "v", 0.0) == (
        False, "valid_ppl 40.0000 does not beat champion ppl 40.0000 x (1 - margin 0) = 40.0000 on validation v")
    assert decide(1e9, "v", None, None, 0.5) == (True, "there was no champion yet")
    assert decide(float("nan"), "v", None, None, 0.0) == (False, "valid_ppl nan is not finite")
    assert decide(float("inf"), "v", 40.0, "v", 0.0)[0] is False
    promote, reason = decide(1.0, "b", 40.0, "a", 0.0)  # another validation set: never comparable
    assert promote is False and "not comparable" in reason and "on a, the challenger on b" in reason
    for margin in (-0.1, 1.0):
        with pytest.raises(ValueError, match=r"margin must be in \[0, 1\)"):
            decide(1.0, "v", 40.0, "v", margin)


def test_decide_registration_against_the_registry_champion():
    assert decide_registration("1", 40.0, "v", 0.0, current_version=None, current_ppl=None,
                               current_hash=None) == ("promoted", "promoted: there was no champion yet")
    assert decide_registration("3", 45.0, "v", 0.0, current_version="1", current_ppl=40.0, current_hash="v") == (
        "rejected", "not promoted: valid_ppl 45.0000 does not beat champion ppl 40.0000 x (1 - margin 0) "
                    "= 40.0000 on validation v (v3 vs champion v1)")
    decision, reason = decide_registration("2", 1.0, "v", 0.0, current_version="1", current_ppl=float("nan"),
                                           current_hash="v")  # a champion without a valid_ppl tag
    assert decision == "rejected" and "champion ppl nan" in reason


def test_decide_registration_with_a_measured_champion():
    measured = MeasuredChampion("1", 40.0)
    decision, reason = decide_registration("2", 30.0, "fixed", 0.0, current_version="1", current_ppl=99.0,
                                           current_hash="other", champion=measured)
    assert decision == "promoted" and "champion ppl 40.0000" in reason and reason.endswith("(v2 vs champion v1)")
    assert decide_registration("3", 30.0, "fixed", 0.0, current_version="2", current_ppl=30.0,
                               current_hash="fixed", champion=measured) == (
        "conflict", "refused: champion moved from v1 to v2 while v3 was being trained and scored")


def test_registered_name():
    assert registered_name("dntm") == "dynlm-dntm"
