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


def test_replace_static_puts_the_score_in_place_of_the_next_new_chains_logit():
    module = NewEntityScore(hidden_dim=2, replace_static=True, num_entities=3)
    with torch.no_grad():
        module.score.weight.copy_(torch.tensor([[1.0, -2.0]]))
        module.score.bias.fill_(0.5)
        module.count_bias.copy_(torch.tensor([0.25, 4.0, -1.0]))  # c_0, c_1, c_2
    logits = torch.arange(15, dtype=torch.float32).view(1, 3, 5)  # 2 words + K = 3 entities
    hidden = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [3.0, 1.0]]])  # s_new = 1.5, -1.5, 1.5
    seen = torch.tensor([[0, 2, 3]])  # next new chain: <unk1>, <unk3>, none (all 3 taken)
    out = module(logits, hidden, seen, entity_offset=2)
    expected = logits.clone()
    expected[0, 0, 2] = 1.5 + 0.25  # <unk1>: s_new + c_0, its static logit (2.0) is gone
    expected[0, 1, 4] = -1.5 - 1.0  # <unk3>: s_new + c_2
    assert torch.equal(out, expected)  # position 2: all taken, nothing moves


def test_replace_static_sends_a_first_mentions_gradient_to_the_score_only():
    torch.manual_seed(0)
    module = NewEntityScore(hidden_dim=3, replace_static=True, num_entities=4)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 2, 6, generator=generator).requires_grad_()
    hidden = torch.randn(1, 2, 3, generator=generator)
    out = module(logits, hidden, torch.tensor([[1, 2]]), entity_offset=2)
    torch.log_softmax(out, -1)[0, :, 3].sum().backward()  # target <unk2> at position 0: a first mention
    assert logits.grad[0, 0, 3] == 0  # the static logit of the new chain gets no gradient
    assert logits.grad[0, 1, 3] != 0  # ... where chain 2 is seen it does
    assert module.score.weight.grad.abs().sum() > 0
    assert module.count_bias.grad[1] != 0 and module.count_bias.grad[0] == 0  # c_n of the n seen there
