"""The factored entity output: P(entity | h) from its own logit, then a softmax over the entity
ids; exact values, a proper distribution, and an entity mass that the entity scores cannot move."""

import math

import pytest
import torch

from dynlm.modules.entity_class import EntityClassOutput


def test_values_are_the_class_probability_times_the_within_class_softmax():
    module = EntityClassOutput(hidden_dim=2, num_words=3, num_entities=2)
    with torch.no_grad():
        module.score.weight.copy_(torch.tensor([[1.0, -1.0]]))
        module.score.bias.fill_(0.0)
    words = torch.tensor([[0.0, math.log(2.0), math.log(5.0)]])  # softmax 1/8, 2/8, 5/8
    entities = torch.tensor([[0.0, -math.inf]])  # <unk2> masked: <unk1> takes the whole entity share
    hidden = torch.tensor([[math.log(3.0), 0.0]])  # a = log 3: P(entity) = 3/4
    out = module(words, entities, hidden).exp()
    expected = torch.tensor([[1 / 32, 2 / 32, 5 / 32, 3 / 4, 0.0]])
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=0)


def test_it_starts_at_the_entity_share_of_a_uniform_softmax():
    module = EntityClassOutput(hidden_dim=4, num_words=98, num_entities=2)
    hidden = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    out = module(torch.zeros(3, 98), torch.zeros(3, 2), hidden).exp()
    torch.testing.assert_close(out, torch.full((3, 100), 0.01), rtol=1e-5, atol=0)


@pytest.mark.parametrize("scale", [0.1, 1.0, 30.0])
def test_the_entity_scores_move_only_the_split_between_entities(scale):
    """The bug it fixes: with one softmax the entity mass grows with the entity scores' scale."""
    generator = torch.Generator().manual_seed(1)
    module = EntityClassOutput(hidden_dim=4, num_words=6, num_entities=3)
    with torch.no_grad():
        module.score.weight.normal_(generator=generator)
    words, entities = torch.randn(2, 5, 6, generator=generator), torch.randn(2, 5, 3, generator=generator)
    hidden = torch.randn(2, 5, 4, generator=generator)
    log_probs = module(words, scale * entities, hidden)  # [2, 5, 9]
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2, 5))
    entity_mass = log_probs[..., 6:].logsumexp(-1).exp()
    torch.testing.assert_close(entity_mass, torch.sigmoid(module.score(hidden)).squeeze(-1).detach())


def test_it_needs_words_and_entities():
    with pytest.raises(ValueError, match="needs words and entities"):
        EntityClassOutput(hidden_dim=4, num_words=5, num_entities=0)
