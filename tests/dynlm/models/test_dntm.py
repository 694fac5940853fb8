"""Tests of the Dynamic Neural Text Model (dynlm.models.dntm)."""

from __future__ import annotations

import pytest
import torch

from dynlm.data.batching import collate_documents
from dynlm.losses import token_nll
from dynlm.models import build_model
from dynlm.models.dntm import DNTM, DNTMState, dntm_small
from dynlm.models.rnn_lm import RNNLM
from dynlm.vocab_spec import VocabSpec

SPEC = VocabSpec(num_words=20, num_entities=3, shortlist_size=15, num_subwords=4)
E1, E2, E3 = 20, 21, 22  # word ids of <unk1>, <unk2>, <unk3>


def _row(doc_id: str, sentences: list[list[int]]) -> dict:
    """An encoded document row from sentences of word ids (<bos>/<eos> added; 1 subword a token)."""
    words = [w for s in sentences for w in (SPEC.bos_id, *s, SPEC.eos_id)]
    return {
        "doc_id": doc_id, "source_file": "test", "num_tokens": len(words),
        "sentence_lengths": [len(s) + 2 for s in sentences], "word_ids": words,
        "entity_ids": [w - SPEC.num_words + 1 if w >= SPEC.num_words else 0 for w in words],
        "subword_ids": [1] * len(words), "subword_lengths": [1] * len(words),
    }


DOC_A = [[5, E1, 6, 7], [E1, 8, E2, 9], [10, E1, E2, 11, E1], [E2, 12, E1]]
DOC_B = [[E1, 13, 14, 15, 16, 17, E1], [18, E2], [E3, 5, E1, 6], [7, E3, 8], [9, E2]]


def _model(dynamic="both", merge_fn="gru", seed=0, dntm=None, **overrides) -> DNTM:
    torch.manual_seed(seed)
    settings = {"dynamic": dynamic, "merge_fn": merge_fn, **(dntm or {})}
    cfg = dntm_small(embed_dim=8, hidden_dim=8, dropout=0.0, dntm=settings, **overrides)
    return DNTM(cfg, SPEC).eval()


def _run(model, rows) -> tuple[list[torch.Tensor], DNTMState]:
    batch = collate_documents(rows, SPEC)
    state = model.init_state(batch.batch_size)
    outputs, state = model(batch.sentences, state)
    return [o.padded_logits() for o in outputs], state


def test_build_model_shapes_and_state():
    model = build_model(dntm_small(), SPEC)
    assert isinstance(model, DNTM)
    batch = collate_documents([_row("a", DOC_A), _row("b", DOC_B)], SPEC)
    state = model.init_state(2)
    assert state.entities.memory.shape == (2, 3, 64) and state.rnn.h.shape == (1, 2, 64)
    output, state = model(batch.sentences[0], state)
    assert output.padded_logits().shape == (2, 8, SPEC.output_size) and output.hidden.shape == (2, 8, 64)
    # After sentence 1: doc a saw <unk1>, doc b saw <unk1> (twice); nobody saw <unk2>/<unk3>.
    memory = state.entities.memory
    assert memory[:, 0].abs().sum(-1).gt(0).all() and torch.all(memory[:, 1:] == 0)
    detached = model.detach_state(state)
    assert not detached.entities.memory.requires_grad and not detached.rnn.h.requires_grad
    reset = model.reset_state(state, torch.tensor([True, False]))
    assert torch.all(reset.entities.memory[1] == 0) and torch.equal(reset.entities.memory[0], memory[0])
    assert torch.all(reset.rnn.h[:, 1] == 0) and torch.all(reset.rnn.c[:, 1] == 0)


def test_seeded_expected_values():
    logits, state = _run(_model("both", "gru"), [_row("a", DOC_A)])
    torch.testing.assert_close(logits[0][0, 1, E1 - 2 : E1 + 2], torch.tensor(EXPECTED_FIRST), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits[3][0, 1, E1 - 2 : E1 + 2], torch.tensor(EXPECTED_LAST), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(state.entities.memory[0, :2, :3], torch.tensor(EXPECTED_MEMORY), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dynamic", ["none", "input", "output", "both"])
def test_zero_entity_representation_equals_the_baseline_exactly(dynamic):
    model = _model(dynamic)
    baseline = RNNLM(model.cfg, SPEC).eval()
    baseline.load_state_dict(model.lm.state_dict())
    rows = [_row("a", DOC_A), _row("b", DOC_B)]
    batch = collate_documents(rows, SPEC)
    expected, _ = baseline(batch.sentences, baseline.init_state(2))
    logits, _ = _run(model, rows)
    # Sentence 1 is read with d_e = 0 for every chain: identical to the baseline, bit for bit.
    assert torch.equal(logits[0], expected[0].padded_logits())
    if dynamic == "none":
        assert all(torch.equal(a, b.padded_logits()) for a, b in zip(logits, expected))
    else:  # later sentences use the merged d_e and differ ...
        assert not torch.equal(logits[1], expected[1].padded_logits())
        with torch.no_grad():  # ... unless W_dx = W_dy = 0, which makes every d_e contribute 0
            for name in ("input_proj", "output_proj"):
                if hasattr(model, name):
                    getattr(model, name).weight.zero_()
        logits, _ = _run(model, rows)
        assert all(torch.equal(a, b.padded_logits()) for a, b in zip(logits, expected))


def test_input_and_output_dynamics_touch_the_right_places():
    rows = [_row("a", DOC_A)]
    base, _ = _run(_model("none"), rows)
    out_only, _ = _run(_model("output"), rows)
    in_only, _ = _run(_model("input"), rows)
    words = slice(0, SPEC.num_words)
    # Output dynamics only change entity logits (sentence 2: <unk1> has a representation).
    assert torch.equal(out_only[1][..., words], base[1][..., words])
    assert not torch.equal(out_only[1][0, :, E1], base[1][0, :, E1])
    assert torch.equal(out_only[1][0, :, E3], base[1][0, :, E3])  # <unk3> never seen in doc a
    # Input dynamics change the LM from the first input mention of a known entity on.
    assert torch.equal(in_only[1][0, 0], base[1][0, 0])  # <bos> <unk1> 8 ...: <bos> is read alike
    assert not torch.allclose(in_only[1][0, 1], base[1][0, 1])  # <unk1> is read as W_dx d_1 + b^x_1


def test_padding_and_batching_do_not_change_results():
    model = _model("both", "attention")
    alone, alone_state = _run(model, [_row("a", DOC_A)])
    together, state = _run(model, [_row("b", DOC_B), _row("a", DOC_A)])
    for t, logits in enumerate(alone):
        n = logits.size(1)
        torch.testing.assert_close(together[t][1, :n], logits[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.entities.memory[1], alone_state.entities.memory[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state.entities.score_lse[1], alone_state.entities.score_lse[0])


@pytest.mark.parametrize("merge_fn", ["max", "gru", "gru_relu", "latest", "attention"])
def test_gradients_reach_every_dynamic_parameter(merge_fn):
    model = _model("both", merge_fn)
    model.train()
    batch = collate_documents([_row("a", DOC_A), _row("b", DOC_B)], SPEC)
    state = model.init_state(2)
    outputs, state = model(batch.sentences[:3], state)
    loss = sum(
        token_nll(o.logits, s.targets, s.mask, o.positions).sum() / s.mask.sum()
        for o, s in zip(outputs, batch.sentences[:3])
    )
    loss.backward()
    params = dict(model.named_parameters())
    names = ["input_proj.weight", "output_proj.weight", "context_encoder.proj.weight",
             "context_encoder.rnn.weight_ih_l0", "context_encoder.rnn.weight_ih_l0_reverse"]
    names += [n for n in params if n.startswith("merge.")]
    assert any(n.startswith("merge.") for n in names) == (merge_fn not in ("max", "latest"))
    for name in names:
        assert params[name].grad is not None and params[name].grad.abs().sum() > 0, name


def test_save_load_gives_identical_outputs(tmp_path):
    from dynlm import checkpoint

    model = _model("both", "attention")
    rows = [_row("a", DOC_A), _row("b", DOC_B)]
    expected, _ = _run(model, rows)
    path = tmp_path / "dntm.pt"
    checkpoint.save(path, model, model.cfg, SPEC)
    loaded, cfg, spec, _ = checkpoint.load(path)
    assert isinstance(loaded, DNTM) and cfg == model.cfg and spec == SPEC
    logits, _ = _run(loaded.eval(), rows)
    assert all(torch.equal(a, b) for a, b in zip(logits, expected))


def test_bad_entity_ids_are_rejected_when_batches_are_built():
    """Ids beyond a model's memory are stopped in the data path, before any step.

    The model itself does not look at the ids' values during a step: on a GPU that would be a host
    synchronisation per step (issue 11). Batches are built against the model's spec instead.
    """
    small = VocabSpec(num_words=20, num_entities=2, shortlist_size=15, num_subwords=4)
    with pytest.raises(ValueError, match="document 'b'.*outside"):
        collate_documents([_row("b", DOC_B)], small)  # mentions <unk3>, beyond a 2-chain memory
    row = _row("b", DOC_B)
    row["entity_ids"] = [3 if e == 3 else e for e in row["entity_ids"]]
    row["word_ids"] = [E2 if w == E3 else w for w in row["word_ids"]]  # word ids fit, entity ids do not
    with pytest.raises(ValueError, match=r"entity id outside \[0, 2\]"):
        collate_documents([row], small)


# <unk2> after no chain cannot come next: -inf (issue 18, mask_unseen_entities; -0.28779 unmasked)
EXPECTED_FIRST = [-0.29669, 0.04776, -0.05865, float("-inf")]
EXPECTED_LAST = [-0.17196, -0.03983, -0.16972, -0.2666]
EXPECTED_MEMORY = [[-0.0826, -0.13805, -0.3488], [-0.06084, -0.13585, -0.40332]]


def test_the_new_entity_score_starts_as_the_model_without_it_and_the_gate_learns():
    plain = _model("both")
    extended = _model("both", dntm={"new_entity_score": True, "gate_dynamic_scores": True})
    extended.load_state_dict({**extended.state_dict(), **plain.state_dict()})  # same shared weights
    with torch.no_grad():
        extended.score_gate.gate.bias.fill_(60.0)  # g = 1 in float32: exactly the ungated model
    rows = [_row("a", DOC_A), _row("b", DOC_B)]
    for ours, theirs in zip(_run(extended, rows)[0], _run(plain, rows)[0]):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)

    with torch.no_grad():
        extended.score_gate.gate.bias.fill_(4.0)  # back to its initial value: the gate's gradient flows
    extended.train()
    batch = collate_documents(rows, SPEC)
    outputs, _ = extended(batch.sentences[:3], extended.init_state(2))
    sum(token_nll(o.logits, s.targets, s.mask, o.positions).sum() / s.mask.sum()
        for o, s in zip(outputs, batch.sentences[:3])).backward()
    for name in ("new_entity.score.weight", "new_entity.score.bias", "score_gate.gate.weight"):
        grad = dict(extended.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name


def test_the_gate_needs_output_dynamics():
    from dynlm.config import ConfigError

    with pytest.raises(ConfigError, match="gate_dynamic_scores"):
        dntm_small(dntm={"dynamic": "input", "gate_dynamic_scores": True})


def test_the_new_entity_logit_is_inert_without_the_new_entity_score():
    """`new_entity_score: false` alone gives the paper's output layer, whatever
    new_entity_replaces_static (on by default) says."""
    plain, replacing = _model("both"), _model("both", dntm={"new_entity_replaces_static": True})
    rows = [_row("a", DOC_A)]
    assert all(torch.equal(a, b) for a, b in zip(_run(replacing, rows)[0], _run(plain, rows)[0]))


def test_the_factored_entity_output_is_not_for_the_dynamical_lm():
    from dynlm.config import ConfigError
    from dynlm.models.dynamical_lm import dynamical_lm_small

    with pytest.raises(ConfigError, match="entity_class_output"):
        dynamical_lm_small(entity_class_output=True)


def test_with_the_factored_output_the_entity_mass_is_the_class_probability(tiny_spec, random_rows):
    """At every real position of a DNTM with output dynamics, the probability of all entity ids
    together is sigmoid(u . h + c): the dynamic scores only split it between entities."""
    torch.manual_seed(0)
    model = build_model(dntm_small(embed_dim=16, hidden_dim=16, dropout=0.0, entity_class_output=True), tiny_spec)
    with torch.no_grad():
        model.lm.entity_class.score.weight.normal_()
    batch = collate_documents(random_rows(3, seed=5), tiny_spec)
    model.eval()
    with torch.no_grad():
        state = model.init_state(batch.batch_size)
        for sentence in batch.sentences:
            output, state = model(sentence, state)
            log_probs = output.padded_logits()[sentence.mask]  # [N, V_out]
            entity_mass = log_probs[:, tiny_spec.entity_offset:].logsumexp(-1).exp()
            expected = torch.sigmoid(model.lm.entity_class.score(output.hidden[sentence.mask])).squeeze(-1)
            torch.testing.assert_close(entity_mass, expected)


def test_the_mention_cache_starts_as_the_model_without_it_and_raises_a_re_mentioned_chain():
    plain = _model("both")
    cached = _model("both", dntm={"mention_cache": True})
    cached.load_state_dict({**cached.state_dict(), **plain.state_dict()})
    rows = [_row("a", DOC_A), _row("b", DOC_B)]
    for ours, theirs in zip(_run(cached, rows)[0], _run(plain, rows)[0]):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    with torch.no_grad():  # w = 1: s_k = h_t . c_k
        cached.mention_cache.weight.fill_(1.0)
    logits, state = _run(cached, rows)
    base, _ = _run(plain, rows)
    words = slice(0, SPEC.num_words)
    # Doc a reads <bos> 5 <unk1> ...: <unk1> is the target of position 1, so positions 0 and 1 have
    # nothing cached; words never move.
    assert torch.equal(logits[0][0, :2], base[0][0, :2])
    assert all(torch.equal(a[..., words], b[..., words]) for a, b in zip(logits, base))
    # position 2 scores <unk1> with h_2 . h_1
    assert not torch.equal(logits[0][0, 2, E1], base[0][0, 2, E1])
    assert state.entity_rows.shape == (2, 3, 8) and torch.all(state.entity_rows[0, 2] == 0)  # doc a has no <unk3>
    reset = cached.reset_state(state, torch.tensor([True, False]))
    assert torch.all(reset.entity_rows[1] == 0) and torch.equal(reset.entity_rows[0], state.entity_rows[0])
    assert not cached.detach_state(state).entity_rows.requires_grad


def test_adapted_entity_rows_start_as_the_model_without_them_and_follow_the_prediction_errors():
    plain = _model("both")
    adapted = _model("both", dntm={"adapt_entity_rows": True})
    adapted.load_state_dict({**adapted.state_dict(), **plain.state_dict()})
    rows = [_row("a", DOC_A)]
    for ours, theirs in zip(_run(adapted, rows)[0], _run(plain, rows)[0]):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    with torch.no_grad():
        adapted.row_adaptation.rate.fill_(1.0)
    logits, state = _run(adapted, rows)
    base, _ = _run(plain, rows)
    # sentence 1 reads unshifted rows; from sentence 2 on only the entity columns move
    assert torch.equal(logits[0], base[0])
    words = slice(0, SPEC.num_words)
    assert all(torch.equal(a[..., words], b[..., words]) for a, b in zip(logits, base))
    assert not torch.equal(logits[1][..., E1], base[1][..., E1])
    # Δb after sentence 1 by hand: sum_i (1[y_i = k] - p_i(k)) h_i over its positions (rate 1)
    batch = collate_documents(rows, SPEC)
    output, after_first = adapted(batch.sentences[0], adapted.init_state(1))
    probs = torch.softmax(output.padded_logits()[0], dim=-1)[:, SPEC.num_words:]  # [P, K]
    observed = torch.nn.functional.one_hot(batch.sentences[0].target_entity_ids[0], 4)[:, 1:].float()
    expected = (observed - probs).T @ output.hidden[0]  # [K, H] (dropout 0: hidden = dropped)
    torch.testing.assert_close(after_first.entity_rows[0], expected, rtol=1e-5, atol=1e-6)
    # <unk1> is the one chain seen: its row moved towards the contexts that predicted it
    assert state.entity_rows.shape == (1, 3, 8)


def test_with_the_new_entity_logit_a_chain_row_stays_unshifted_until_its_first_mention():
    """The new-entity logit holds no row, so its probability is no error of the next chain's row:
    Δb_k is zero until chain k's first mention, which writes its hidden state; after it, the
    usual (1[y_i = k] - p_i(k)) h_i."""
    settings = {"adapt_entity_rows": True, "new_entity_score": True, "new_entity_replaces_static": True}
    adapted = _model("both", dntm=settings)
    with torch.no_grad():
        adapted.row_adaptation.rate.fill_(1.0)
    batch = collate_documents([_row("a", DOC_A)], SPEC)
    sentence = batch.sentences[0]  # <bos> 5 <unk1> 6 7 <eos>: chain 1 appears at its second target
    output, after = adapted(sentence, adapted.init_state(1))
    assert torch.equal(after.entity_rows[0, 1:], torch.zeros(2, 8))  # <unk2>, <unk3>: not seen yet
    probs = torch.softmax(output.padded_logits()[0], dim=-1)[:, SPEC.num_words]  # [P] p_i(<unk1>)
    targets, seen = sentence.target_entity_ids[0], sentence.entities_seen[0]
    weight = (targets == 1).float() - probs * (seen >= 1).float()  # [P]: no -p before chain 1 is seen
    assert weight[0] == 0 and weight[1] == 1  # <bos> -> 5: <unk1> is the new slot; 5 -> <unk1>: its first mention
    torch.testing.assert_close(after.entity_rows[0, 0], weight @ output.hidden[0], rtol=1e-5, atol=1e-6)


def test_rows_stepped_per_token_end_each_sentence_where_the_per_sentence_step_does():
    """``entity_row_step: token``: inside a sentence position t adds h_t · (w ⊙ sum_{i<t} e_i h_i) to
    the entity logits (a chain mentioned earlier in the sentence counts at once); the state after
    every sentence, the word logits and the first position of each sentence are the per-sentence model's."""
    settings = {"adapt_entity_rows": True, "new_entity_score": True, "new_entity_replaces_static": True}
    per_sentence = _model("both", dntm=settings)
    per_token = _model("both", dntm={**settings, "entity_row_step": "token"})
    with torch.no_grad():
        per_sentence.row_adaptation.rate.fill_(1.0)
    per_token.load_state_dict(per_sentence.state_dict())
    rows = [_row("a", DOC_A), _row("b", DOC_B)]
    (ours, _), (theirs, _) = _run(per_token, rows), _run(per_sentence, rows)
    batch = collate_documents(rows, SPEC)
    for count in range(1, len(batch.sentences) + 1):  # the state after every sentence
        _, our_state = per_token(batch.sentences[:count], per_token.init_state(2))
        _, their_state = per_sentence(batch.sentences[:count], per_sentence.init_state(2))
        torch.testing.assert_close(our_state.entity_rows, their_state.entity_rows, rtol=1e-5, atol=1e-6)
    words = slice(0, SPEC.num_words)
    for a, b in zip(ours, theirs):
        assert torch.equal(a[..., words], b[..., words]) and torch.equal(a[:, 0], b[:, 0])
    # sentence 1 of doc a: <bos> 5 <unk1> 6 7 <eos>; <unk1> is first mentioned at target 1, so from
    # position 2 on its logit moves by h_t · (w ⊙ e_1(<unk1>) h_1) (and by the -p terms before it)
    assert not torch.equal(ours[0][0, 2:, E1], theirs[0][0, 2:, E1])
    output, _ = per_sentence(batch.sentences[0], per_sentence.init_state(2))
    logits, hidden = output.padded_logits()[0], output.hidden[0]  # doc a, [P, V], [P, H]
    probs = torch.softmax(logits, dim=-1)[:, SPEC.num_words:]  # [P, K]
    sentence = batch.sentences[0]
    seen, targets = sentence.entities_seen[0], sentence.target_entity_ids[0]
    observed = torch.nn.functional.one_hot(targets, 4)[:, 1:].float()  # [P, K]
    error = observed - probs * (torch.arange(3) < seen.unsqueeze(-1)).float()  # [P, K]: -p over seen chains only
    length = int(sentence.lengths[0])
    for t in range(1, length):
        expected = theirs[0][0, t, E1] + (error[:t, 0] * (hidden[:t] @ hidden[t])).sum()
        torch.testing.assert_close(ours[0][0, t, E1], expected, rtol=1e-5, atol=1e-5)


def test_the_entity_row_states_are_exclusive_and_not_for_the_factored_output():
    from dynlm.config import ConfigError

    with pytest.raises(ConfigError, match="choose one"):
        dntm_small(dntm={"mention_cache": True, "adapt_entity_rows": True})
    with pytest.raises(ConfigError, match="entity_class_output"):
        dntm_small(entity_class_output=True, dntm={"adapt_entity_rows": True})
    # the per-token step is inert without the rows (a search may switch them off under it)
    plain, stepped = _model("both"), _model("both", dntm={"entity_row_step": "token"})
    rows = [_row("a", DOC_A)]
    assert all(torch.equal(a, b) for a, b in zip(_run(stepped, rows)[0], _run(plain, rows)[0]))
