"""Learning test of the naming models on synthetic tensors: features imply the name.

A function that ``returns`` / ``assigns`` / ``checks`` field x is named get_x / set_x / has_x;
every function also has the uninformative feature ``self`` and one random noise feature, and
random context tokens. get_a makes up ~40% of training, so the frequency baseline (summed
co-occurrence counts) is pulled towards it; set_b and has_d never occur in training, so only
the subtoken model can name them (neologisms).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from dynlm.models.naming import (
    END,
    PAD,
    UNK,
    NamingBatch,
    NamingModelConfig,
    NamingSpec,
    build_naming_model,
)
from dynlm.models.naming_baseline import FrequencyBaseline
from dynlm.modules.nce import nce_loss
from dynlm.tasks.naming_metrics import NamingMetrics

VERBS = {"get": "returns", "set": "assigns", "has": "checks"}
FIELDS = ("a", "b", "c", "d")
UNSEEN = {("set", "b"), ("has", "d")}
SUBTOKENS = ["<pad>", "<unk>", "<end>", "<start>", *VERBS, *FIELDS]
FEATURES = ["<pad>", "<unk>", "self", *VERBS.values(), *(f"field_{x}" for x in FIELDS), "noise0", "noise1", "noise2", "noise3"]
TRAIN_NAMES = [(v, x) for v, x in itertools.product(VERBS, FIELDS) if (v, x) not in UNSEEN]
NAMES = [("<pad>",), ("<unk>",), *TRAIN_NAMES]
K_MAX = 2


def make_batch(combos: list[tuple[str, str]], generator: torch.Generator) -> NamingBatch:
    n = len(combos)
    noise = torch.randint(FEATURES.index("noise0"), len(FEATURES), (n,), generator=generator).tolist()
    features = [[FEATURES.index("self"), FEATURES.index(VERBS[v]), FEATURES.index(f"field_{x}"), z]
                for (v, x), z in zip(combos, noise)]
    names = [NAMES.index(c) if c in NAMES else UNK for c in combos]
    subtokens = [[SUBTOKENS.index(v), SUBTOKENS.index(x), END] for v, x in combos]
    context = torch.randint(1, 5, (n, 2 * K_MAX), generator=generator)
    return NamingBatch(torch.tensor(features), context, torch.tensor(names), torch.tensor(subtokens))


def data() -> tuple[NamingBatch, NamingBatch, NamingSpec]:
    generator = torch.Generator().manual_seed(0)
    train_combos = [("get", "a")] * 60 + [c for c in TRAIN_NAMES if c != ("get", "a")] * 8
    test_combos = list(itertools.product(VERBS, FIELDS)) * 3  # every combination, the unseen two included
    train, test = make_batch(train_combos, generator), make_batch(test_combos, generator)
    name_counts = torch.bincount(train.names, minlength=len(NAMES)).tolist()
    subtoken_counts = torch.bincount(train.subtokens.flatten(), minlength=len(SUBTOKENS)).tolist()
    name_counts[PAD] = subtoken_counts[PAD] = 0
    spec = NamingSpec(num_names=len(NAMES), num_subtokens=len(SUBTOKENS), num_features=len(FEATURES),
                      num_context_tokens=5, max_context_size=K_MAX, name_counts=name_counts,
                      subtoken_counts=subtoken_counts)
    return train, test, spec


def as_strings(model_type: str, ids: tuple[int, ...]) -> tuple[str, ...]:
    return NAMES[ids[0]] if model_type == "name" else tuple(SUBTOKENS[i] for i in ids)


def evaluate(suggestions, log_probs, test: NamingBatch, model_type: str) -> dict:
    metrics = NamingMetrics()
    truths = [(SUBTOKENS[row[0]], SUBTOKENS[row[1]]) for row in test.subtokens.tolist()]
    strings = [[(as_strings(model_type, ids), lp) for ids, lp in ranked] for ranked in suggestions]
    metrics.update(strings, truths, log_probs, set(TRAIN_NAMES), dunders=[False] * len(truths))
    return metrics.compute()


def train(model_type: str, train_batch: NamingBatch, spec: NamingSpec, steps: int = 300):
    torch.manual_seed(0)
    cfg = NamingModelConfig(type=model_type, embed_dim=16, context_size=K_MAX, noise_samples=8, top_k=5,
                            beam_size=8, max_subtokens=3)
    model = build_naming_model(cfg, spec)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nce_loss(model(train_batch)).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0], losses[::50]  # measured: 3.14 -> 1.67 (both models)
    return model


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()  # tiny tensors: extra threads only contend (20x slower on a shared CPU)
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_both_models_beat_the_frequency_baseline_and_the_subtoken_model_invents_names(one_thread):
    # Measured f1_at_1: baseline 0.29, name model 0.92 (all but the two unseen names), subtoken
    # model 1.00 with 6 of 6 neologisms correct (set_b and has_d, 3 functions each).
    train_batch, test, spec = data()
    baseline = FrequencyBaseline(spec.num_names, spec.num_features).fit([train_batch])
    baseline_out = evaluate(baseline.suggest(test, top_k=5), baseline.log_prob(test).tolist(), test, "name")
    assert baseline_out["f1_at_1"] < 0.6  # pulled towards get_a
    for model_type in ("name", "subtoken"):
        model = train(model_type, train_batch, spec)
        out = evaluate(model.suggest(test), model.log_prob(test).tolist(), test, model_type)
        assert out["f1_at_1"] > baseline_out["f1_at_1"] + 0.2, (model_type, out["f1_at_1"], baseline_out["f1_at_1"])
        if model_type == "name":
            assert out["neologisms_suggested"] == 0  # it can only suggest training names
        else:
            assert out["neologisms_correct"] >= 1, out
