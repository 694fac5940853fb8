"""Tests of dynlm.models.naming: the log-bilinear name and subtoken models (Allamanis et al., 2015)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dynlm.config import ConfigError
from dynlm.models.naming import (
    END,
    PAD,
    UNK,
    LogBilinearNameModel,
    NamingBatch,
    NamingModelConfig,
    NamingSpec,
    SubtokenNameModel,
    build_naming_model,
)
from dynlm.modules.nce import nce_loss

# names: PAD, UNK + 5 names; subtokens: PAD, UNK, END, START + a (4), b (5)
SPEC = NamingSpec(num_names=7, num_subtokens=6, num_features=9, num_context_tokens=6, max_context_size=4,
                  name_counts=[0, 3, 5, 1, 2, 2, 1], subtoken_counts=[0, 1, 6, 0, 3, 2])
A, B = 4, 5


def config(model_type: str, **changes) -> NamingModelConfig:
    base = dict(type=model_type, embed_dim=8, context_size=2, subtoken_history=2, noise_samples=5, top_k=5,
                beam_size=8, max_subtokens=3)
    return NamingModelConfig(**{**base, **changes})


def model_of(model_type: str, seed: int = 0, **changes):
    torch.manual_seed(seed)
    return build_naming_model(config(model_type, **changes), SPEC)


def batch_of(features, context, names, subtokens) -> NamingBatch:
    return NamingBatch(*(torch.as_tensor(x, dtype=torch.long) for x in (features, context, names, subtokens)))


BATCH = batch_of(features=[[2, 3, 0], [4, 5, 6], [7, 0, 0]],
                 context=[[1, 2, 3, 4, 5, 1, 2, 3], [5, 4, 3, 2, 1, 5, 4, 3], [0, 0, 3, 4, 5, 0, 0, 0]],
                 names=[2, 5, 1],
                 subtokens=[[A, B, END], [B, END, PAD], [UNK, A, END]])


def test_builds_the_model_of_the_type():
    assert isinstance(model_of("name"), LogBilinearNameModel)
    assert isinstance(model_of("subtoken"), SubtokenNameModel)


def test_nce_scores_have_one_event_per_name_or_subtoken():
    scores = model_of("name")(BATCH)
    assert scores.target_scores.shape == (3,) and scores.noise_scores.shape == (3, 5)
    assert scores.target_log_noise.shape == (3,) and scores.noise_log_noise.shape == (3, 5)
    scores = model_of("subtoken")(BATCH)  # 3 + 2 + 3 subtoken slots, END included
    assert scores.target_scores.shape == (8,) and scores.noise_scores.shape == (8, 5)
    assert nce_loss(scores).shape == (8,)


def test_nce_loss_gives_every_parameter_a_gradient():
    for model_type in ("name", "subtoken"):
        model = model_of(model_type)
        nce_loss(model(BATCH)).sum().backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_noise_is_the_smoothed_unigram_and_never_pad_or_start():
    name_model, subtoken_model = model_of("name"), model_of("subtoken")
    # add-one: name counts [_, 3, 5, 1, 2, 2, 1] + 1 = [0, 4, 6, 2, 3, 3, 2] / 20 (PAD left out)
    assert name_model.noise_probs.tolist() == pytest.approx([0, 0.2, 0.3, 0.1, 0.15, 0.15, 0.1])
    # subtokens [_, 1, 6, _, 3, 2] + 1 = [0, 2, 7, 0, 4, 3] / 16 (PAD and START left out)
    assert subtoken_model.noise_probs.tolist() == pytest.approx([0, 2 / 16, 7 / 16, 0, 4 / 16, 3 / 16])
    # b_t starts at the log unigram probability
    assert name_model.target_bias[1:].tolist() == pytest.approx(torch.tensor([0.2, 0.3, 0.1, 0.15, 0.15, 0.1]).log().tolist())
    torch.manual_seed(1)
    drawn = set(name_model.nce_scores(torch.zeros(500, 8), torch.full((500,), 2)).noise_log_noise.exp().flatten().tolist())
    assert min(drawn) > 0  # every noise draw has q > 0: never PAD
    noise_ids = torch.multinomial(subtoken_model.noise_probs, 5000, replacement=True)
    assert set(noise_ids.tolist()) == {UNK, END, A, B}


def test_only_the_k_nearest_context_tokens_count():
    for model_type in ("name", "subtoken"):
        model = model_of(model_type)  # K = 2 of K_max = 4: columns 2, 3 (positions -2, -1) and 4, 5 (+1, +2)
        before = model.log_prob(BATCH)
        far = BATCH.context.clone()
        far[:, [0, 1, 6, 7]] = torch.tensor([3, 2, 1, 4])  # positions -4, -3, +3, +4
        assert torch.equal(model.log_prob(batch_of(BATCH.features, far, BATCH.names, BATCH.subtokens)), before)
        for column in (2, 3, 4, 5):
            near = BATCH.context.clone()
            near[:, column] = (near[:, column] + 1) % 6
            changed = model.log_prob(batch_of(BATCH.features, near, BATCH.names, BATCH.subtokens))
            assert not torch.allclose(changed, before)


def test_padded_features_contribute_nothing():
    for model_type in ("name", "subtoken"):
        model = model_of(model_type)
        wider = torch.cat([BATCH.features, torch.zeros(3, 4, dtype=torch.long)], dim=1)
        assert torch.equal(model.log_prob(batch_of(wider, BATCH.context, BATCH.names, BATCH.subtokens)),
                           model.log_prob(BATCH))


def test_context_narrower_than_context_size_is_an_error():
    model = model_of("name", context_size=3)
    with pytest.raises(ValueError, match="K_max >= context_size 3"):
        model.log_prob(batch_of(BATCH.features, BATCH.context[:, 2:6], BATCH.names, BATCH.subtokens))


def test_name_log_probs_sum_to_one_over_all_names():
    model = model_of("name", seed=3)
    names = list(range(1, SPEC.num_names))  # every name but PAD, UNK included
    for row in range(3):
        batch = batch_of(BATCH.features[row].repeat(len(names), 1), BATCH.context[row].repeat(len(names), 1), names,
                         BATCH.subtokens[row].repeat(len(names), 1))
        assert model.log_prob(batch).exp().sum().item() == pytest.approx(1.0, abs=1e-6)


def sequences_batch(row: int, sequences: list[tuple[int, ...]], width: int) -> NamingBatch:
    """``BATCH``'s function ``row`` once per sequence (subtoken ids as given, PAD after)."""
    subtokens = [list(s) + [PAD] * (width - len(s)) for s in sequences]
    n = len(sequences)
    return batch_of(BATCH.features[row].repeat(n, 1), BATCH.context[row].repeat(n, 1), [2] * n, subtokens)


def test_subtoken_log_probs_sum_to_one_over_all_sequences():
    # Every outcome of generation up to L = 3 subtokens is either a name of 0..3 targets followed
    # by END, or a prefix of 4 non-END targets (a longer name): their probabilities sum to 1.
    model = model_of("subtoken", seed=4)
    targets = [UNK, A, B]  # every target but END (PAD and START never are)
    names = [s + (END,) for n in range(4) for s in itertools.product(targets, repeat=n)]
    longer = list(itertools.product(targets, repeat=4))
    for row in range(3):
        total = (model.log_prob(sequences_batch(row, names, 4)).exp().sum()
                 + model.log_prob(sequences_batch(row, longer, 4)).exp().sum())
        assert total.item() == pytest.approx(1.0, abs=1e-5)


def test_subtoken_history_is_the_previous_m_subtokens():
    model = model_of("subtoken", seed=5, subtoken_history=1)  # log p(x y z) − log p(x y) = log p(z | y): no x
    log_probs = model.log_prob(sequences_batch(0, [(A, B, A), (A, B), (B, B, A), (B, B)], 3))
    assert (log_probs[0] - log_probs[1]).item() == pytest.approx((log_probs[2] - log_probs[3]).item(), abs=1e-6)
    model = model_of("subtoken", seed=5, subtoken_history=2)  # with M = 2 the x counts
    log_probs = model.log_prob(sequences_batch(0, [(A, B, A), (A, B), (B, B, A), (B, B)], 3))
    assert (log_probs[0] - log_probs[1]).item() != pytest.approx((log_probs[2] - log_probs[3]).item(), abs=1e-4)


def test_nll_is_the_summed_negative_log_prob():
    for model_type, events in (("name", 3), ("subtoken", 8)):
        model = model_of(model_type)
        nll_sum, count = model.nll(BATCH)
        assert count == events
        assert nll_sum.item() == pytest.approx(-model.log_prob(BATCH).sum().item(), rel=1e-6)


def test_name_suggestions_are_the_most_probable_names_never_pad_or_unk():
    model = model_of("name", seed=6)
    with torch.no_grad():
        model.target_bias[UNK] = 10.0  # UNK is by far the most probable name ...
    suggestions = model.suggest(BATCH, top_k=10)
    for row, ranked in enumerate(suggestions):
        assert len(ranked) == SPEC.num_names - 2  # ... yet never suggested (nor PAD)
        ids = [ids[0] for ids, _ in ranked]
        assert sorted(ids) == list(range(2, SPEC.num_names))
        batch = batch_of(BATCH.features[row].repeat(5, 1), BATCH.context[row].repeat(5, 1), list(range(2, 7)),
                         BATCH.subtokens[row].repeat(5, 1))
        expected = sorted(zip(model.log_prob(batch).tolist(), range(2, 7)), reverse=True)
        assert ids == [name for _, name in expected]
        assert [lp for _, lp in ranked] == pytest.approx([lp for lp, _ in expected])
    assert [len(r) for r in model.suggest(BATCH)] == [5, 5, 5]  # cfg.top_k


def exhaustive_names(model, row: int, max_length: int) -> list[tuple[tuple[int, ...], float]]:
    """Every name of 1..max_length subtokens over {a, b} with its log p (END included), best first."""
    names = [s for n in range(1, max_length + 1) for s in itertools.product([A, B], repeat=n)]
    log_probs = model.log_prob(sequences_batch(row, [s + (END,) for s in names], max_length + 1))
    return sorted(zip(names, log_probs.tolist()), key=lambda item: -item[1])


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_beam_search_equals_exhaustive_search(seed):
    model = model_of("subtoken", seed=seed, max_subtokens=3, beam_size=8)  # 8 = every prefix of 3 over {a, b}
    with torch.no_grad():
        model.target_bias[UNK] = 3.0  # a tempting UNK: never emitted, yet its probability mass stays
    for top_k in (5, 14):
        suggestions = model.suggest(BATCH, top_k=top_k)
        for row, ranked in enumerate(suggestions):
            expected = exhaustive_names(model, row, 3)[:top_k]
            assert [ids for ids, _ in ranked] == [ids for ids, _ in expected]
            assert [lp for _, lp in ranked] == pytest.approx([lp for _, lp in expected], abs=1e-5)


def test_subtoken_suggestions_never_hold_specials_and_respect_the_length():
    model = model_of("subtoken", seed=10, max_subtokens=4, beam_size=6)
    with torch.no_grad():
        model.target_bias[UNK] = 8.0
    for ranked in model.suggest(BATCH):
        assert len(ranked) == 5
        scores = [lp for _, lp in ranked]
        assert scores == sorted(scores, reverse=True)
        for ids, _ in ranked:
            assert 1 <= len(ids) <= 4 and set(ids) <= {A, B}


def test_state_dict_round_trip():
    for model_type in ("name", "subtoken"):
        model, fresh = model_of(model_type, seed=11), model_of(model_type, seed=12)
        assert not torch.equal(model.log_prob(BATCH), fresh.log_prob(BATCH))
        fresh.load_state_dict(model.state_dict())
        assert torch.equal(model.log_prob(BATCH), fresh.log_prob(BATCH))
        assert model.suggest(BATCH) == fresh.suggest(BATCH)


def test_build_checks_the_config_against_the_spec():
    with pytest.raises(ConfigError, match="context_size 5 exceeds"):
        build_naming_model(config("name", context_size=5), SPEC)
    with pytest.raises(ConfigError, match="3 name_counts for num_names 7"):
        build_naming_model(config("name"), NamingSpec(**{**SPEC.to_dict(), "name_counts": [0, 1, 2]}))
    with pytest.raises(ConfigError, match="num_subtokens 4 leaves no subtoken"):
        build_naming_model(config("subtoken"), NamingSpec(**{**SPEC.to_dict(), "num_subtokens": 4, "subtoken_counts": []}))
    with pytest.raises(ConfigError, match="beam_size"):
        NamingModelConfig.from_dict({"top_k": 5, "beam_size": 3})


def test_counts_left_empty_give_a_uniform_noise():
    spec = NamingSpec(**{**SPEC.to_dict(), "name_counts": []})
    torch.manual_seed(0)
    model = build_naming_model(config("name"), spec)
    assert model.noise_probs.tolist() == pytest.approx([0] + [1 / 6] * 6)
    assert math.isfinite(model.log_prob(BATCH).sum().item())


def test_an_inactive_batch_has_no_events_and_still_backpropagates():
    # PAD names and all-PAD subtokens: the row a DDP rank without data trains on
    blank = batch_of([[0, 0]], [[0] * 8], [PAD], [[PAD, PAD]])
    for model_type in ("name", "subtoken"):
        model = model_of(model_type)
        scores = model(blank)
        assert scores.target_scores.shape == (0,) and scores.noise_scores.shape == (0, 5)
        nce_loss(scores).sum().backward()
        assert all(p.grad is not None and p.grad.abs().sum() == 0 for p in model.parameters())
        assert model.nll(blank)[1] == 0
