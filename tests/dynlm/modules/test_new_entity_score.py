"""The new-entity score: added to <unk{n+1}> only, nowhere once all K identifiers are taken,
zero at initialisation."""

import torch

from dynlm.modules.new_entity_score import NewEntityScore


def test_the_score_goes_to_the_next_new_chain_only():
    module = NewEntityScore(hidden_dim=2)
    with torch.no_grad():
        module.score.weight.copy_(torch.tensor([[1.0, -2.0]]))
        module.score.bias.fill_(0.5)
    logits = torch.zeros(1, 3, 5)  # 2 words + K = 3 entities
    hidden = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [3.0, 1.0]]])  # s_new = 1.5, -1.5, 1.5
    seen = torch.tensor([[0, 2, 3]])  # next new chain: <unk1>, <unk3>, none (all 3 taken)
    out = module(logits, hidden, seen, entity_offset=2)
    expected = torch.zeros(1, 3, 5)
    expected[0, 0, 2] = 1.5  # <unk1>
    expected[0, 1, 4] = -1.5  # <unk3>
    assert torch.equal(out, expected)


def test_it_starts_as_the_model_without_it():
    module = NewEntityScore(hidden_dim=4)
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0))
    out = module(logits, torch.randn(2, 3, 4), torch.tensor([[0, 1, 2], [3, 4, 4]]), entity_offset=3)
    assert torch.equal(out, logits)
