"""Tests of dynlm.metrics on a hand-made example with known target kinds."""

from __future__ import annotations

import math

import pytest
import torch

from dynlm.data.batching import collate_documents
from dynlm.metrics import MetricAccumulator, perplexity

E1, E2 = 20, 21


@pytest.fixture
def batch(make_row, tiny_spec):
    # doc a: targets [5, <e1>(first), 16(after entity, oov), <eos>], [<e1>(re), <e2>(first, after), 7(after), <eos>]
    # doc b: targets [6, 6, <eos>]
    return collate_documents([make_row("a", [[5, E1, 16], [E1, E2, 7]]), make_row("b", [[6, 6]])], tiny_spec)


def _filled(batch) -> MetricAccumulator:
    acc = MetricAccumulator()
    s0, s1 = batch.sentences
    acc.update_from_nll(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 9.0]]), s0)  # 9.0 is padding
    acc.update_from_nll(torch.tensor([[1.0, 2.0, 3.0, 4.0], [7.0, 7.0, 7.0, 7.0]]), s1)  # row b inactive
    return acc


def test_category_sums_and_perplexities(batch):
    m = _filled(batch).compute()
    assert m["count_all"] == 11 and m["tokens"] == 11
    assert m["nll_sum_all"] == pytest.approx(12.8)
    assert (m["count_first_mention"], m["nll_sum_first_mention"]) == (2, pytest.approx(2.2))
    assert (m["count_reappearing"], m["nll_sum_reappearing"]) == (1, pytest.approx(1.0))
    assert (m["count_after_entity"], m["nll_sum_after_entity"]) == (3, pytest.approx(5.3))
    assert (m["count_oov"], m["nll_sum_oov"]) == (1, pytest.approx(0.3))
    assert m["loss"] == pytest.approx(12.8 / 11)
    assert m["ppl"] == pytest.approx(math.exp(12.8 / 11))
    assert m["ppl_first_mention"] == pytest.approx(math.exp(1.1))
    assert m["ppl_reappearing"] == pytest.approx(math.e)
    assert m["ppl_after_entity"] == pytest.approx(math.exp(5.3 / 3))
    assert m["ppl_oov"] == pytest.approx(math.exp(0.3))


def test_update_from_logits_matches_cross_entropy(batch, tiny_spec):
    torch.manual_seed(0)
    acc = MetricAccumulator()
    logits = torch.randn(2, 4, tiny_spec.output_size)
    acc.update(logits, batch.sentences[0])
    s0 = batch.sentences[0]
    expected = torch.nn.functional.cross_entropy(logits[s0.mask], s0.targets[s0.mask], reduction="sum")
    assert acc.compute()["nll_sum_all"] == pytest.approx(float(expected), rel=1e-6)


def test_aggregation_across_workers(batch):
    a, b = _filled(batch), _filled(batch)
    summed = MetricAccumulator.from_tensor(a.as_tensor() + b.as_tensor())  # what an all-reduce gives
    merged = _filled(batch).merge(_filled(batch))
    for result in (summed.compute(), merged.compute()):
        assert result["count_all"] == 22 and result["nll_sum_all"] == pytest.approx(25.6)
        assert result["ppl"] == pytest.approx(math.exp(12.8 / 11))


def test_empty_category_is_nan():
    m = MetricAccumulator().compute()
    assert math.isnan(m["ppl"]) and math.isnan(m["ppl_oov"]) and m["tokens"] == 0
    assert perplexity(10_000.0, 1) == float("inf")


def test_accumulation_bins_from_a_batch_with_known_mention_counts(make_row, tiny_spec):
    # <e1> x4 then <e2> x2 in one sentence: targets E1 E1 E1 E1 E2 E2 <eos>, earlier mentions 0 1 2 3 0 1
    batch = collate_documents([make_row("acc", [[E1, E1, E1, E1, E2, E2]])], tiny_spec)
    acc = MetricAccumulator()
    acc.update_from_nll(torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]]), batch.sentences[0])
    m = acc.compute()
    assert (m["count_reappearing_1"], m["nll_sum_reappearing_1"]) == (2, pytest.approx(2.0 + 6.0))
    assert (m["count_reappearing_2"], m["nll_sum_reappearing_2"]) == (1, pytest.approx(3.0))
    assert (m["count_reappearing_3_5"], m["nll_sum_reappearing_3_5"]) == (1, pytest.approx(4.0))
    assert m["count_reappearing_6_plus"] == 0 and math.isnan(m["ppl_reappearing_6_plus"])
    assert m["ppl_reappearing_1"] == pytest.approx(math.exp(4.0))
    assert m["count_reappearing"] == 4 and m["nll_sum_reappearing"] == pytest.approx(15.0)
    summed = MetricAccumulator.from_tensor(acc.as_tensor() + acc.as_tensor())  # an all-reduce of 2 ranks
    assert summed.compute()["count_reappearing_3_5"] == 2
    assert summed.compute()["nll_sum_reappearing_1"] == pytest.approx(16.0)


def test_from_metrics_inverts_compute(batch):
    computed = _filled(batch).compute()
    assert MetricAccumulator.from_metrics(computed).compute() == pytest.approx(computed, nan_ok=True)
