"""DynamicalLM: static equivalence at theta_hat = 0, equality with dynamic evaluation before
meta-training, updates, gradient to phi (finite differences), gate statistics, and that short
meta-training makes the second reading of a document cheaper (also than dynamic evaluation)."""

import pytest
import torch
import torch.nn.functional as F

from dynlm.data.batching import collate_documents
from dynlm.dynamic_eval import DynamicEvalConfig, collect_grad_stats, dynamic_evaluate
from dynlm.losses import chunk_loss, token_nll
from dynlm.models import build_model
from dynlm.models.dynamical_lm import DynamicalLM, DynamicalState, dynamical_lm_small
from dynlm.tasks.lm import LMTask
from dynlm.tasks.lm_evaluation import evaluate_lm
from dynlm.training import TrainConfig, train_step

LM_TASK = LMTask()
from dynlm.vocab_spec import VocabSpec

SPEC = VocabSpec(num_words=24, num_entities=0, shortlist_size=24, num_subwords=4)


def _row(doc_id, sentences):
    words, lengths = [], []
    for sentence in sentences:
        words += [SPEC.bos_id, *sentence, SPEC.eos_id]
        lengths.append(len(sentence) + 2)
    n = len(words)
    return dict(doc_id=doc_id, source_file="t", num_tokens=n, sentence_lengths=lengths, word_ids=words,
                entity_ids=[0] * n, subword_ids=[1] * n, subword_lengths=[1] * n)


def _random_docs(num_docs, length, readings, seed):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(num_docs):
        sentence = torch.randint(4, SPEC.num_words, (length,), generator=g).tolist()
        rows.append(_row(f"d{i}", [sentence] * readings))
    return collate_documents(rows, SPEC)


def _model(**dynamical):
    cfg = dynamical_lm_small(embed_dim=16, hidden_dim=16, dropout=0.0, dynamical=dynamical)
    return DynamicalLM(cfg, SPEC)


@pytest.mark.parametrize("fast_params", [["output"], ["embedding"], ["recurrent"]])
def test_zero_fast_weights_give_the_static_model(fast_params):
    model = _model(fast_params=fast_params, segment_len=1000).eval()
    batch = _random_docs(3, 9, 1, seed=1)
    output, state = model(batch.sentences[0], model.init_state(3))
    with torch.no_grad():
        static, _ = model.lm(batch.sentences[0], model.lm.init_state(3))
    torch.testing.assert_close(output.logits, static.logits, rtol=1e-5, atol=1e-6)
    assert all(float(v.abs().max()) == 0.0 for v in state.fast.values())  # no update yet
    assert state.segment_pos == 10 and not output.logits.requires_grad


def test_fast_weights_update_each_segment_and_reset_per_document():
    model = _model(segment_len=4).eval()
    batch = _random_docs(2, 9, 1, seed=2)  # 10 positions -> 2 updates, 2 pending
    output, state = model(batch.sentences[0], model.init_state(2))
    assert isinstance(state, DynamicalState) and state.segment_pos == 2
    theta_hat = model.theta_hat(state)
    assert float(theta_hat["output.weight"].abs().max()) > 0 and float(theta_hat["output.bias"].abs().max()) > 0
    # evaluation holds the output weight as theta + theta_hat and the partial segment's d nll / d logits
    torch.testing.assert_close(state.output_weight, model.lm.decoder.weight + theta_hat["output.weight"])
    assert len(state.pending) == 1 and state.pending[0][0].shape == (2, 2, SPEC.num_words)
    reset = model.reset_state(state, torch.tensor([True, False]))
    reset_hat = model.theta_hat(reset)
    assert float(reset_hat["output.weight"][1].abs().max()) == 0.0 and float(reset_hat["output.bias"][1].abs().max()) == 0.0
    torch.testing.assert_close(reset_hat["output.weight"][0], theta_hat["output.weight"][0])
    assert float(reset.segment_tokens[1]) == 0.0 and float(reset.pending[0][0][1].abs().max()) == 0.0
    # the same document read in training mode (autograd path) ends with the same theta_hat
    model.train()
    _, trained_state = model(batch.sentences[0], model.init_state(2))
    torch.testing.assert_close(trained_state.fast["output.weight"], theta_hat["output.weight"], rtol=1e-4, atol=1e-7)


def test_build_model_and_param_groups():
    cfg = dynamical_lm_small(dynamical=dict(meta_lr=0.01))
    model = build_model(cfg, SPEC)
    assert isinstance(model, DynamicalLM) and DynamicalLM.needs_grad_at_eval
    groups = model.param_groups(0.002)
    assert [g["lr"] for g in groups] == [0.002, 0.01]
    assert sum(p.numel() for g in groups for p in g["params"]) == sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError, match="embedding='word'"):
        DynamicalLM(dynamical_lm_small(embedding="subword", dynamical=dict(fast_params=["embedding"])), SPEC)


def test_no_grad_is_a_clear_error():
    model = _model().eval()
    batch = _random_docs(1, 3, 1, seed=0)
    with torch.no_grad(), pytest.raises(RuntimeError, match="enable_grad"):
        model(batch.sentences[0], model.init_state(1))


@pytest.mark.parametrize("first_order", [False, True])
def test_gradient_of_one_unrolled_update_reaches_phi(first_order):
    """d(loss of segment 2)/d(phi) through one update, against central finite differences."""
    torch.manual_seed(0)
    model = _model(segment_len=5, meta_hidden_dim=3, first_order=first_order, eta=0.5).double().train()
    with torch.no_grad():  # the last layer starts at 0, which would leave the hidden layer without gradient
        model.meta_learner.gates.weight.normal_(0.0, 0.5)
    batch = _random_docs(2, 8, 1, seed=3)  # 9 positions: segment 1 = 0..4, segment 2 = 5..8

    def second_segment_loss():
        output, _ = model(batch.sentences[0], model.init_state(2))
        return F.cross_entropy(output.logits[:, 5:].transpose(1, 2), batch.sentences[0].targets[:, 5:],
                               reduction="none")[batch.sentences[0].mask[:, 5:]].sum()  # float64

    loss = second_segment_loss()
    params = list(model.meta_learner.parameters())
    analytic = torch.autograd.grad(loss, params)
    assert sum(float(g.abs().sum()) for g in analytic) > 0
    step = 1e-6
    for param, grad in zip(params, analytic):
        flat = param.data.view(-1)
        for index in range(0, flat.numel(), max(1, flat.numel() // 3)):
            original = flat[index].item()
            flat[index] = original + step
            plus = second_segment_loss().item()
            flat[index] = original - step
            minus = second_segment_loss().item()
            flat[index] = original
            numeric = (plus - minus) / (2 * step)
            assert abs(numeric - grad.view(-1)[index].item()) <= 1e-6 + 1e-4 * abs(numeric)


def test_unroll_is_truncated_after_unroll_steps():
    model = _model(segment_len=2, unroll_steps=2).train()
    batch = _random_docs(1, 9, 1, seed=4)
    _, state = model(batch.sentences[0], model.init_state(1))  # 10 positions -> 5 updates
    assert state.unrolled == 1  # 5 updates, truncated after 2 and 4
    assert model.detach_state(state).unrolled == 0


def _second_reading_nll(model, twice, once):
    """NLL of the second reading = NLL(two readings) - NLL(first reading alone)."""
    def total(batch):
        state = model.init_state(batch.batch_size)
        nll = 0.0
        for sentence in batch.sentences:
            output, state = model(sentence, state)
            nll += float(token_nll(output.logits, sentence.targets, sentence.mask).sum())
        return nll
    return total(twice) - total(once)


def test_meta_training_lowers_the_loss_of_a_second_reading():
    torch.manual_seed(0)
    model = _model(segment_len=6, unroll_steps=4, eta=0.5, decay=0.02, meta_lr=0.05)
    optimizer = torch.optim.Adam(model.param_groups(0.01))
    model.train()
    for step in range(40):
        batch = _random_docs(8, 12, 2, seed=100 + step)
        outputs, _ = model(batch.sentences, model.init_state(8))
        loss, _, _ = chunk_loss(outputs, batch.sentences)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    twice, once = _random_docs(8, 12, 2, seed=7), _random_docs(8, 12, 1, seed=7)
    dynamic = _second_reading_nll(model, twice, once)
    # the same theta with the meta-learner switched off (theta_hat stays 0) = the static model
    model.meta_learner.set_rule(0.0, 0.0)
    static = _second_reading_nll(model, twice, once)
    # a fast output layer is at best a unigram cache of the 12 words read: ~0.83 of the static NLL
    assert dynamic < 0.9 * static


def test_fast_embedding_leaves_the_pad_row_static():
    """Documents of different lengths are padded with pad_id: that row gets no fast update."""
    torch.manual_seed(0)
    model = _model(fast_params=["embedding"], segment_len=3).train()
    rows = [_row("a", [[5, 6, 7, 8, 9, 10]]), _row("b", [[11, 12]]), _row("c", [[13, 14, 15]])]
    sentence = collate_documents(rows, SPEC).sentences[0]
    assert bool((sentence.tokens == SPEC.pad_id).any())
    output, state = model(sentence, model.init_state(3))
    fast = state.fast["embedding.weight"].detach()
    assert float(fast[:, SPEC.pad_id].abs().max()) == 0.0
    assert float(fast.abs().max()) > 0
    chunk_loss([output], [sentence])[0].backward()
    assert float(model.lm.embedding.word.weight.grad[SPEC.pad_id].abs().max()) == 0.0


@pytest.fixture
def float64():
    """float64 by default (weights and RNN states), so that only float32 scoring rounds."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _static_lm_trained(model):
    """A few Adam steps on theta alone, so that dynamic evaluation has something to adapt."""
    optimizer = torch.optim.Adam(model.lm.parameters(), lr=0.01)
    for step in range(5):
        batch = _random_docs(4, 10, 1, seed=200 + step)
        outputs, _ = model.lm(batch.sentences, model.lm.init_state(4))
        loss, _, _ = chunk_loss(outputs, batch.sentences)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _single_document_batches(num_docs, seed):
    """Documents of different lengths, two readings each, one batch per document."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(num_docs):
        sentence = torch.randint(4, SPEC.num_words, (7 + 2 * i,), generator=g).tolist()
        rows.append(_row(f"d{i}", [sentence, sentence[::-1], sentence]))
    return [collate_documents([row], SPEC) for row in rows]


@pytest.mark.parametrize("gate_form", ["log_sigmoid", "rational"])
def test_before_meta_training_the_model_evaluates_like_dynamic_evaluation(float64, gate_form):
    """Gates start at 1: evaluate_lm(DynamicalLM) == dynamic_evaluate(its theta) on the same weights.

    Fast output layer only: its gradient does not go back through time, so the model's
    truncation at chunk and sentence boundaries (see the module docstring) changes nothing.
    """
    torch.manual_seed(0)
    model = _model(fast_params=["output"], segment_len=5, gate_form=gate_form)
    _static_lm_trained(model)
    stats = collect_grad_stats(model.lm, [_random_docs(3, 10, 1, seed=50)], segment_len=5)
    cfg = DynamicEvalConfig(lr=0.05, decay=0.05, eps=1e-3, segment_len=5)
    model.init_from_dynamic_eval(cfg, stats)
    batches = _single_document_batches(3, seed=9)
    ours = evaluate_lm(model, batches)
    krause = dynamic_evaluate(model.lm, batches, cfg, stats, names=list(model.adapted_parameter_names().values()))
    static = evaluate_lm(model.lm, batches)
    assert ours["tokens"] == krause["tokens"] == static["tokens"]
    assert abs(krause["loss"] - static["loss"]) > 1e-3  # the updates matter on this data
    # token_nll scores in float32 (also dynamic evaluation's gradient): equal to float32 rounding
    assert ours["loss"] == pytest.approx(krause["loss"], rel=1e-6, abs=0)
    with pytest.raises(ValueError, match="segment_len"):
        model.init_from_dynamic_eval(cfg.replace(segment_len=6), stats)


def test_meta_training_from_dynamic_evaluation_beats_it_and_logs_moving_gates():
    """phi alone is meta-trained on documents read twice; the learned rule ends below the hand-set one."""
    torch.manual_seed(0)
    model = _model(segment_len=6, unroll_steps=4, decay=0.0)
    _static_lm_trained(model)
    stats = collect_grad_stats(model.lm, [_random_docs(4, 12, 1, seed=60)], segment_len=6)
    model.init_from_dynamic_eval(DynamicEvalConfig(lr=0.01, decay=0.0, segment_len=6), stats)
    held_out = [_random_docs(8, 12, 2, seed=7)]
    before = evaluate_lm(model, held_out)["loss"]
    optimizer = torch.optim.Adam(model.meta_learner.parameters(), lr=0.05)
    cfg = TrainConfig(bptt_tokens=0, bptt_sentences=2, grad_clip=1.0)
    metrics = [train_step(LM_TASK, model, _random_docs(8, 12, 2, seed=300 + step), optimizer, cfg)["stats"]
               for step in range(10)]
    after = evaluate_lm(model, held_out)["loss"]
    assert metrics[0]["gate_input_mean"] == pytest.approx(1.0) and metrics[0]["gate_input_std"] == 0.0
    assert metrics[-1]["gate_input_mean"] > 1.3  # the learned step is larger than dynamic evaluation's
    assert metrics[-1]["gate_input_std"] > 0 and "gate_forget_mean" in metrics[-1]
    assert after < before - 0.02  # measured: 3.083 -> 3.031


@pytest.mark.parametrize("gate_form", ["log_sigmoid", "rational"])
def test_compiled_update_evaluates_like_the_eager_one(gate_form):
    """compile_update fuses the evaluation update (torch.compile); the numbers do not change."""
    torch.manual_seed(0)
    eager = _model(segment_len=4, eta=0.3, decay=0.05, gate_form=gate_form)
    with torch.no_grad():
        eager.meta_learner.gates.weight.normal_(0.0, 0.5)  # gates away from 1
    fused = _model(segment_len=4, eta=0.3, decay=0.05, compile_update=True, gate_form=gate_form)
    fused.load_state_dict(eager.state_dict())
    batches = [_random_docs(3, 9, 2, seed=11), _ragged_docs(seed=11)]
    assert evaluate_lm(fused, batches)["loss"] == pytest.approx(evaluate_lm(eager, batches)["loss"], rel=1e-5)
    assert "_compiled_update_fn" in fused.__dict__ and "_compiled_update_fn" not in fused.state_dict()


@pytest.mark.parametrize("train_theta, gate_form", [(False, "log_sigmoid"), (True, "log_sigmoid"), (False, "rational")])
def test_meta_training_from_dynamic_evaluation_lowers_its_own_objective(train_theta, gate_form):
    """The meta-objective (NLL of each segment after the updates of the segments before it, in
    eval mode, on the training documents themselves) goes down under meta-training started at
    dynamic evaluation: phi alone, and phi with theta jointly (lr 3e-3 / 1e-3, clip 0.25 as in
    benchmarks/reproduce_dynamical.py). A rise here would be a bug, not overfitting."""
    torch.manual_seed(0)
    model = _model(segment_len=6, unroll_steps=4, decay=0.0, gate_form=gate_form)
    _static_lm_trained(model)
    stats = collect_grad_stats(model.lm, [_random_docs(4, 12, 1, seed=60)], segment_len=6)
    model.init_from_dynamic_eval(DynamicEvalConfig(lr=0.01, decay=0.0, segment_len=6), stats)
    train = [_random_docs(8, 12, 2, seed=400 + i) for i in range(3)]
    before = evaluate_lm(model, train)["loss"]
    groups = [{"params": list(model.meta_learner.parameters()), "lr": 3e-3}]
    if train_theta:
        groups.append({"params": list(model.lm.parameters()), "lr": 1e-3})
    optimizer = torch.optim.Adam(groups)
    cfg = TrainConfig(bptt_tokens=0, bptt_sentences=2, grad_clip=0.25)
    curve = [before]
    for _epoch in range(4):
        for batch in train:
            train_step(LM_TASK, model, batch, optimizer, cfg)
        curve.append(evaluate_lm(model, train)["loss"])
    assert all(b < a for a, b in zip(curve, curve[1:])), curve  # down after every epoch
    # measured: 3.0956 -> 3.0922 (phi alone), 3.0956 -> 3.0634 (phi and theta)
    assert curve[-1] < before - (0.02 if train_theta else 0.002), curve


def _ragged_docs(seed):
    """Three documents of different lengths in one batch: in sentence lockstep some have segments
    without tokens (a short sentence beside a long one) and one ends before the others."""
    g = torch.Generator().manual_seed(seed)

    def sentence(n):
        return torch.randint(4, SPEC.num_words, (n,), generator=g).tolist()
    return collate_documents([_row("a", [sentence(3), sentence(12), sentence(2)]),
                              _row("b", [sentence(14), sentence(1), sentence(13)]),
                              _row("c", [sentence(5)])], SPEC)


@pytest.mark.parametrize("gate_form", ["log_sigmoid", "rational"])
def test_closed_form_output_gradient_at_evaluation_equals_autograd(float64, gate_form):
    """Eval with a fast output layer computes the segment gradient as (softmax - onehot)^T h; with
    graph_at_eval set the model takes the autograd path instead: the same losses."""
    torch.manual_seed(0)
    model = _model(fast_params=["output"], segment_len=5, eta=0.3, decay=0.05, gate_form=gate_form)
    with torch.no_grad():
        model.meta_learner.gates.weight.normal_(0.0, 0.5)  # gates away from 1
    batches = [_random_docs(3, 9, 2, seed=12), _ragged_docs(seed=12)]
    closed = evaluate_lm(model, batches)
    model.graph_at_eval = True
    autograd = evaluate_lm(model, batches)
    model.graph_at_eval = False
    static = evaluate_lm(model.lm, batches)
    assert abs(closed["loss"] - static["loss"]) > 1e-3  # the updates matter (measured 4.2e-3)
    assert closed["loss"] == pytest.approx(autograd["loss"], rel=1e-12, abs=0)


def test_a_closed_form_state_continues_on_the_autograd_path_and_is_not_changed(float64):
    """The closed-form evaluation path holds theta + theta_hat and pending d nll / d logits in its
    state; the autograd path continues such a state exactly, and no forward writes into the state
    it was given (the update's in-place write goes into the segment's own gradient buffer)."""
    torch.manual_seed(0)
    model = _model(fast_params=["output"], segment_len=4, eta=0.3, decay=0.05).eval()
    with torch.no_grad():
        model.meta_learner.gates.weight.normal_(0.0, 0.5)
    batch = _random_docs(2, 9, 2, seed=13)  # sentences of 10 positions: segments span them
    first, state = model(batch.sentences[0], model.init_state(2))
    assert state.output_weight is not None and state.pending  # closed-form parts
    before = {"output_weight": state.output_weight.clone(), "pending": state.pending[0][0].clone()}
    closed, _ = model(batch.sentences[1], state)
    again, _ = model(batch.sentences[1], state)
    torch.testing.assert_close(again.logits, closed.logits, rtol=0, atol=0)
    torch.testing.assert_close(state.output_weight, before["output_weight"], rtol=0, atol=0)
    torch.testing.assert_close(state.pending[0][0], before["pending"], rtol=0, atol=0)
    model.closed_form_grad_at_eval = False
    autograd, _ = model(batch.sentences[1], state)
    torch.testing.assert_close(autograd.logits, closed.logits, rtol=1e-10, atol=1e-12)


def test_the_kept_log_statistic_follows_the_statistics():
    """DynamicalLM keeps log(denominator) / p between updates; new statistics replace it."""
    from dynlm.modules.meta_learner import PREPROCESS_P

    torch.manual_seed(0)
    model = _model(fast_params=["output"], segment_len=5)
    before = model._priors()["output.weight"].log_stat
    stats = collect_grad_stats(model.lm, [_random_docs(3, 10, 1, seed=50)], segment_len=5)
    model.init_from_dynamic_eval(DynamicEvalConfig(lr=0.05, decay=0.0, segment_len=5), stats)
    prior = model._priors()["output.weight"]
    torch.testing.assert_close(prior.log_stat, prior.denominator.log() / PREPROCESS_P, rtol=0, atol=0)
    assert not torch.allclose(prior.log_stat, before)


def test_a_model_built_under_inference_mode_evaluates_like_one_built_outside():
    """Buffers made under ``torch.inference_mode`` have no version counter (the kept log statistic
    is keyed on it): such a model evaluates, and gives the same loss as the same weights built
    outside inference mode; in inference mode too."""
    torch.manual_seed(0)
    model = _model(fast_params=["output"], segment_len=5)
    stats = collect_grad_stats(model.lm, [_random_docs(3, 10, 1, seed=50)], segment_len=5)
    model.init_from_dynamic_eval(DynamicEvalConfig(lr=0.05, decay=0.0, segment_len=5), stats)
    with torch.inference_mode():
        served = _model(fast_params=["output"], segment_len=5)
        served.load_state_dict(model.state_dict())
    assert torch.is_inference(served.prior.output_weight_denominator)
    batches = [_random_docs(2, 12, 2, seed=51)]
    expected = evaluate_lm(model, batches)["loss"]
    assert evaluate_lm(served, batches)["loss"] == pytest.approx(expected, rel=1e-6)
    with torch.inference_mode():
        assert evaluate_lm(served, batches)["loss"] == pytest.approx(expected, rel=1e-6)
