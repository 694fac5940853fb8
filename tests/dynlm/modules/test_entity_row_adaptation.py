"""Tests of the learned per-document adaptation of the entity rows (dynlm.modules.entity_row_adaptation)."""

from __future__ import annotations

import torch

from dynlm.modules.entity_row_adaptation import EntityRowAdaptation


def test_the_step_is_the_rate_times_the_log_likelihood_gradient_of_the_entity_rows():
    """Δb_k = w ⊙ sum_i (1[y_i = k] - p_i(k)) h_i is w times the gradient of sum_i log p_i(y_i)
    with respect to the output vectors b^y_k of the entity identifiers (the rows of dynamic evaluation)."""
    torch.manual_seed(0)
    module = EntityRowAdaptation(4)
    with torch.no_grad():
        module.rate.uniform_(0.5, 1.5)
    hidden = torch.randn(2, 5, 4)
    word_weight = torch.randn(6, 4)
    entity_weight = torch.randn(3, 4, requires_grad=True)  # b^y of <unk1..3>
    targets = torch.tensor([[0, 7, 2, 6, 6], [8, 1, 6, 0, 3]])  # ids: 0..5 words, 6..8 <unk1..3>
    mask = torch.tensor([[True] * 5, [True, True, True, True, False]])
    logits = torch.cat([hidden @ word_weight.T, hidden @ entity_weight.T], dim=-1)  # [2, 5, 9]
    log_likelihood = (torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1) * mask).sum()
    (gradient,) = torch.autograd.grad(log_likelihood, entity_weight)  # [3, 4] summed over both rows
    chains = torch.where(targets >= 6, targets - 5, torch.zeros_like(targets))
    change = module.step(hidden, (hidden @ entity_weight.T).detach(), torch.logsumexp(hidden @ word_weight.T, -1),
                         chains, mask)  # [2, 3, 4], one per document
    torch.testing.assert_close(change.sum(0), gradient * module.rate.detach(), rtol=1e-5, atol=1e-6)


def test_scores_are_the_hidden_state_against_the_shifted_rows():
    torch.manual_seed(1)
    hidden, shift = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    torch.testing.assert_close(EntityRowAdaptation.scores(hidden, shift), torch.einsum("rph,rkh->rpk", hidden, shift))


def test_a_masked_identifier_gets_no_negative_step_and_the_rate_learns():
    module = EntityRowAdaptation(3)
    hidden = torch.randn(1, 2, 3)
    logits = torch.tensor([[[0.5, float("-inf")], [0.2, float("-inf")]]])  # <unk2> cannot come next
    change = module.step(hidden, logits, torch.zeros(1, 2), torch.tensor([[1, 0]]), torch.ones(1, 2, dtype=torch.bool))
    assert torch.equal(change, torch.zeros_like(change))  # w = 0 at the start
    with torch.no_grad():
        module.rate.fill_(1.0)
    change = module.step(hidden, logits, torch.zeros(1, 2), torch.tensor([[1, 0]]), torch.ones(1, 2, dtype=torch.bool))
    assert torch.equal(change[0, 1], torch.zeros(3)) and change[0, 0].abs().sum() > 0


def test_where_the_logit_holds_no_row_only_the_observed_term_counts():
    """With ``row_in_logit`` False at (i, k) the logit of k there does not contain b_k (the new-entity
    logit in place of <unk{n+1}>'s): the step is w times the gradient of the rows that are in the
    logits, plus the observed hidden state wherever such a slot is the target (a first mention)."""
    torch.manual_seed(2)
    module = EntityRowAdaptation(4)
    with torch.no_grad():
        module.rate.uniform_(0.5, 1.5)
    hidden = torch.randn(1, 5, 4)
    word_weight = torch.randn(6, 4)
    entity_weight = torch.randn(3, 4, requires_grad=True)
    new_chain_logit = torch.randn(1, 5, 3)  # a score of its own where the row is not in the logit
    row_in_logit = torch.tensor([[[False, False, False], [True, False, False], [True, False, False],
                                  [True, True, False], [True, True, False]]])  # chains seen before each target
    targets = torch.tensor([[6, 6, 7, 7, 2]])  # <unk1> first, again; <unk2> first, again; a word
    mask = torch.ones(1, 5, dtype=torch.bool)
    entity_logits = torch.where(row_in_logit, hidden @ entity_weight.T, new_chain_logit)  # [1, 5, 3]
    logits = torch.cat([hidden @ word_weight.T, entity_logits], dim=-1)
    log_likelihood = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).sum()
    (gradient,) = torch.autograd.grad(log_likelihood, entity_weight)  # [3, 4]
    chains = torch.where(targets >= 6, targets - 5, torch.zeros_like(targets))
    first_mentions = torch.zeros(3, 4)
    first_mentions[0], first_mentions[1] = hidden[0, 0], hidden[0, 2]
    change = module.step(hidden, entity_logits.detach(), torch.logsumexp(hidden @ word_weight.T, -1), chains,
                         mask, row_in_logit)
    torch.testing.assert_close(change[0], (gradient + first_mentions) * module.rate.detach(), rtol=1e-5, atol=1e-6)


def test_within_a_sentence_position_t_reads_the_shift_stepped_on_the_positions_before_it():
    """sum_{i < t} e_i(k) (w ⊙ h_i) · h_t: at t the rows are those of the per-sentence step taken
    over positions 0..t-1 only (by hand, one position at a time)."""
    torch.manual_seed(3)
    module = EntityRowAdaptation(4)
    with torch.no_grad():
        module.rate.uniform_(-1.0, 1.0)
    hidden, error = torch.randn(2, 5, 4), torch.randn(2, 5, 3)
    scores = module.within_sentence_scores(hidden, error)  # [2, 5, 3]
    for t in range(5):
        partial = module.change(hidden[:, :t], error[:, :t])  # [2, 3, 4]: the step over positions < t
        torch.testing.assert_close(scores[:, t], EntityRowAdaptation.scores(hidden[:, t:t + 1], partial)[:, 0],
                                   rtol=1e-5, atol=1e-6)
    assert torch.equal(scores[:, 0], torch.zeros(2, 3))  # nothing before the first position
