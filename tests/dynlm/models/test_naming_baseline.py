"""Tests of dynlm.models.naming_baseline: the most common name for the features."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dynlm.models.naming import PAD, UNK, NamingBatch
from dynlm.models.naming_baseline import FrequencyBaseline


def batch_of(features: list[list[int]], names: list[int]) -> NamingBatch:
    n = len(names)
    return NamingBatch(torch.tensor(features), torch.zeros(n, 2, dtype=torch.long), torch.tensor(names),
                       torch.zeros(n, 1, dtype=torch.long))


# names 2..5, features 1..6 (0 = PAD); feature 2 twice in a row counts once; the PAD name row is skipped
TRAIN = batch_of([[2, 2, 3], [2, 4, 0], [3, 0, 0], [5, 0, 0], [5, 6, 0], [1, 0, 0], [6, 0, 0]],
                 [2, 3, 2, 4, UNK, 4, PAD])
# c(f, n): f2: {2: 1, 3: 1}, f3: {2: 2}, f4: {3: 1}, f5: {4: 1, UNK: 1}, f6: {UNK: 1}, f1: {4: 1}
# c(n): UNK 1, name2 2, name3 1, name4 2, name5 0


def fitted() -> FrequencyBaseline:
    return FrequencyBaseline(num_names=6, num_features=7).fit([TRAIN])


def test_counts():
    baseline = fitted()
    assert baseline.name_counts == [0, 1, 2, 1, 2, 0]
    assert dict(baseline.cooccurrence) == {(2, 2): 1, (2, 3): 1, (3, 2): 2, (4, 3): 1, (5, 4): 1, (5, UNK): 1,
                                           (6, UNK): 1, (1, 4): 1}


def test_ranks_by_mean_feature_share_then_global_count_then_id():
    baseline = fitted()
    query = batch_of([[2, 4, 0], [5, 6, 0], [0, 0, 0], [3, 1, 0]], [2, 2, 2, 2])
    ranked = [[ids[0] for ids, _ in row] for row in baseline.suggest(query, top_k=4)]
    # row 0: c(f2) = 2, c(f4) = 1: name3 = 1/2 + 1/1 = 1.5, name2 = 1/2; back-off by count: name4 (2), name5 (0)
    # row 1: UNK would lead (1/2 + 1) but is never suggested; name4 = 1/2; then name2 (count 2), name3 (1)
    # row 2: no features: global counts, tie name2 / name4 (2 each) by id, then name3 (1), name5
    # row 3: c(f3) = 2 all name2, c(f1) = 1 all name4: a share of 1 each, tie by count then id: name2, name4
    assert ranked == [[3, 2, 4, 5], [4, 2, 3, 5], [2, 4, 3, 5], [2, 4, 3, 5]]


def test_a_feature_every_function_has_does_not_drown_a_specific_one():
    """Summed raw counts would follow the frequent feature; shares follow the specific one."""
    common, specific = 1, 2
    names = [2] * 9 + [3]  # name2: 9 functions with the common feature; name3: 1 with both
    features = [[common, 0]] * 9 + [[common, specific]]
    baseline = FrequencyBaseline(num_names=4, num_features=3).fit([batch_of(features, names)])
    (top, _), *_ = baseline.suggest(batch_of([[common, specific]], [3]))[0]
    # shares: name2 = 9/10, name3 = 1/10 + 1/1 = 1.1 (raw counts: name2 9 > name3 2)
    assert top == (3,)


def test_probabilities_are_the_smoothed_mean_share():
    baseline = fitted()
    query = batch_of([[2, 4, 6]], [3])
    # p_g = (c(n) + 1) / 11 over UNK..name5 = [2, 3, 2, 3, 1] / 11; known features f2, f4, f6: |F| = 3
    # p(name3) = (1/2 + 1 + 0 + 2/11) / (3 + 1) = (37/22) / 4 = 37/88
    assert baseline.log_prob(query).item() == pytest.approx(math.log(37 / 88))
    (top, top_lp), *_ = baseline.suggest(query)[0]
    assert top == (3,) and top_lp == pytest.approx(math.log(37 / 88))
    names = torch.arange(1, 6)
    every = batch_of([[2, 4, 6]] * 5, names.tolist())
    assert baseline.log_prob(every).exp().sum().item() == pytest.approx(1.0)
    unseen = batch_of([[0, 0, 0]] * 5, names.tolist())  # no known feature: the global distribution
    assert baseline.log_prob(unseen).exp().tolist() == pytest.approx([2 / 11, 3 / 11, 2 / 11, 3 / 11, 1 / 11])


def test_never_suggests_pad_or_unk_and_caps_top_k():
    baseline = fitted()
    for row in baseline.suggest(batch_of([[6, 5, 0]], [2]), top_k=10):
        assert len(row) == 4 and all(ids[0] not in (PAD, UNK) for ids, _ in row)


def test_json_round_trip():
    baseline = fitted()
    again = FrequencyBaseline.from_dict(json.loads(json.dumps(baseline.to_dict())))
    query = batch_of([[2, 4, 0], [5, 6, 0]], [2, 3])
    assert again.suggest(query) == baseline.suggest(query)
    assert again.to_dict() == baseline.to_dict()
    with pytest.raises(ValueError, match="expected keys"):
        FrequencyBaseline.from_dict({**baseline.to_dict(), "extra": 1})


def test_bad_ids_are_errors():
    with pytest.raises(ValueError, match="feature id 9 outside"):
        FrequencyBaseline(6, 7).update(batch_of([[9]], [2]))
    with pytest.raises(ValueError, match="no name to suggest"):
        FrequencyBaseline(2, 7)
