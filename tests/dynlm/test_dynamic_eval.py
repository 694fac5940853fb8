"""Dynamic evaluation: config checks, gradient statistics, lr = 0 equals static evaluation,
weights restored, a lower loss on the second reading of a document, adapting a subset of the
weights, the RMS priors, and the eta / lambda grid choice on validation data."""

import pytest
import torch

from dynlm.config import ConfigError
from dynlm.data.batching import collate_documents
from dynlm.dynamic_eval import (
    DynamicEvalConfig,
    choose_dynamic_eval,
    collect_grad_stats,
    dynamic_evaluate,
    rms_priors,
)
from dynlm.losses import chunk_loss
from dynlm.metrics import MetricAccumulator
from dynlm.models.rnn_lm import RNNLM, rnn_lm_small
from dynlm.vocab_spec import VocabSpec

SPEC = VocabSpec(num_words=24, num_entities=0, shortlist_size=24, num_subwords=4)


def _docs(num_docs, length, readings, seed):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(num_docs):
        sentence = torch.randint(4, SPEC.num_words, (length + i,), generator=g).tolist()
        words, lengths = [], []
        for _ in range(readings):
            words += [SPEC.bos_id, *sentence, SPEC.eos_id]
            lengths.append(len(sentence) + 2)
        n = len(words)
        rows.append(dict(doc_id=f"d{i}", source_file="t", num_tokens=n, sentence_lengths=lengths, word_ids=words,
                         entity_ids=[0] * n, subword_ids=[1] * n, subword_lengths=[1] * n))
    return collate_documents(rows, SPEC)


def _trained_model():
    model = RNNLM(rnn_lm_small(embed_dim=16, hidden_dim=16, dropout=0.0), SPEC)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(10):
        batch = _docs(4, 10, 1, seed=step)
        outputs, _ = model(batch.sentences, model.init_state(4))
        loss, _, _ = chunk_loss(outputs, batch.sentences)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def _static_metrics(model, batches):
    acc = MetricAccumulator()
    model.eval()
    with torch.no_grad():
        for batch in batches:
            state = model.init_state(batch.batch_size)
            for sentence in batch.sentences:
                output, state = model(sentence, state)
                acc.update(output.logits, sentence, output.positions)
    return acc.compute()


def test_config_is_strict_and_validated():
    assert DynamicEvalConfig.from_dict({"lr": 1e-3}).segment_len == 20
    with pytest.raises(ConfigError, match="unknown key"):
        DynamicEvalConfig.from_dict({"learning_rate": 1e-3})
    with pytest.raises(ConfigError, match="segment_len"):
        DynamicEvalConfig.from_dict({"segment_len": 0})


def test_grad_stats_cover_every_parameter_and_are_positive():
    model = _trained_model()
    stats = collect_grad_stats(model, [_docs(3, 10, 1, seed=50)], segment_len=5)
    assert set(stats) == {n for n, _ in model.named_parameters()}
    for name, p in model.named_parameters():
        assert stats[name].shape == p.shape and bool((stats[name] >= 0).all())
    assert float(stats["decoder.weight"].sum()) > 0 and model.training


def test_zero_step_equals_static_evaluation_and_weights_are_restored():
    model = _trained_model()
    batches = [_docs(3, 9, 2, seed=60)]
    stats = collect_grad_stats(model, [_docs(3, 10, 1, seed=50)], segment_len=5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    static = _static_metrics(model, batches)
    dynamic = dynamic_evaluate(model, batches, DynamicEvalConfig(lr=0.0, decay=0.0, segment_len=4), stats)
    assert dynamic["tokens"] == static["tokens"] == 2 * (10 + 11 + 12)  # 2 readings of 3 docs
    assert dynamic["loss"] == pytest.approx(static["loss"], rel=1e-5)
    dynamic_evaluate(model, batches, DynamicEvalConfig(lr=1e-2, decay=0.01, segment_len=4), stats)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name


def test_missing_stats_is_an_error():
    model = _trained_model()
    with pytest.raises(ValueError, match="no gradient statistics"):
        dynamic_evaluate(model, [_docs(1, 5, 1, seed=0)], DynamicEvalConfig(), {})


def test_dynamic_evaluation_lowers_the_loss_of_a_second_reading():
    model = _trained_model()
    stats = collect_grad_stats(model, [_docs(4, 10, 1, seed=70)], segment_len=5)
    twice, once = [_docs(4, 12, 2, seed=80)], [_docs(4, 12, 1, seed=80)]
    cfg = DynamicEvalConfig(lr=3e-2, decay=0.0, segment_len=5)

    def second_reading(metrics_fn):
        a, b = metrics_fn(twice), metrics_fn(once)
        return a["nll_sum_all"] - b["nll_sum_all"]

    static = second_reading(lambda batches: _static_metrics(model, batches))
    dynamic = second_reading(lambda batches: dynamic_evaluate(model, batches, cfg, stats))
    assert dynamic < 0.9 * static


def test_rms_priors_exact_values():
    priors = rms_priors({"a": torch.tensor([1.0, 3.0]), "b": torch.tensor([0.0, 4.0])}, eps=0.5, decay=0.5)
    # mean rms = 2; rate = rms / 2 clipped at 1 / decay = 2
    torch.testing.assert_close(priors["a"].denominator, torch.tensor([1.5, 3.5]))
    torch.testing.assert_close(priors["a"].decay_rate, torch.tensor([0.5, 1.5]))
    torch.testing.assert_close(priors["b"].decay_rate, torch.tensor([0.0, 2.0]))


def test_only_the_named_weights_adapt():
    model = _trained_model()
    stats = collect_grad_stats(model, [_docs(3, 10, 1, seed=50)], segment_len=5)
    batches = [_docs(3, 9, 2, seed=60)]
    cfg = DynamicEvalConfig(lr=3e-2, decay=0.0, segment_len=4)
    everything = dynamic_evaluate(model, batches, cfg, stats)
    output_only = dynamic_evaluate(model, batches, cfg, stats, names=["decoder.weight", "decoder.bias"])
    static = _static_metrics(model, batches)
    assert output_only["loss"] < static["loss"] and output_only["loss"] != pytest.approx(everything["loss"])
    with pytest.raises(ValueError, match="not trainable parameters"):
        dynamic_evaluate(model, batches, cfg, stats, names=["decoder.nothing"])


def test_choose_dynamic_eval_picks_the_lowest_validation_loss_and_skips_diverged_points():
    model = _trained_model()
    stats = collect_grad_stats(model, [_docs(3, 10, 1, seed=50)], segment_len=5)
    valid = [_docs(3, 9, 2, seed=61)]
    best, grid = choose_dynamic_eval(model, valid, stats, etas=[0.0, 3e-2, 1e4], lambdas=[0.0], segment_len=4)
    assert [(g["eta"], g["lambda"]) for g in grid] == [(0.0, 0.0), (3e-2, 0.0), (1e4, 0.0)]
    assert grid[0]["ppl"] == pytest.approx(_static_metrics(model, valid)["ppl"], rel=1e-5)
    assert grid[1]["loss"] < grid[0]["loss"] and not grid[2]["loss"] < grid[1]["loss"]
    assert (best.lr, best.decay, best.segment_len) == (3e-2, 0.0, 4)
    with pytest.raises(ValueError, match="must not be empty"):
        choose_dynamic_eval(model, valid, stats, etas=[], lambdas=[0.0])


# ----- the invariant for every model type (issue 18) ------------------------------------------
# A small seeded model of each type on the synthetic coreference corpus (re-appearing people,
# sentences of 4-14 tokens). segment_len=7 cuts most sentences in two: the DNTM bug of issue 18
# (a segment boundary inside a sentence) shows only then.

SYNTH_CHAINS = 6


def _synth_data():
    """(spec, gradient-statistics batch, evaluation batch, evaluation rows) of the synthetic corpus."""
    import collections

    from dynlm.data.anonymize import anonymize
    from dynlm.data.config import DataConfig
    from dynlm.data.preprocessor import Preprocessor
    from dynlm.data.synth import SynthConfig, generate

    docs = [anonymize(d, max_chains=SYNTH_CHAINS)[0] for d in generate(SynthConfig(num_documents=7, events_per_document=6))]
    counts = collections.Counter(w for d in docs for s in d["sentences"] for w in s)
    pre = Preprocessor.fit(dict(counts), DataConfig(inputs=["synth"], vocab_size=200, bpe_merges=0,
                                                    max_chains=SYNTH_CHAINS))
    rows = [{"doc_id": d["doc_id"], "source_file": d["source_file"], **pre.encode_document(d["sentences"])}
            for d in docs]
    return pre.spec, collate_documents(rows[:3], pre.spec), collate_documents(rows[3:], pre.spec), rows[3:]


def _model_of_type(model_type, spec):
    """A seeded untrained model (dropout 0.3: eval mode must switch it off in both paths)."""
    from dynlm.models import build_model
    from dynlm.models.dntm import dntm_small
    from dynlm.models.dynamical_lm import dynamical_lm_small

    torch.manual_seed(0)
    sizes = dict(embed_dim=16, hidden_dim=16, dropout=0.3)
    if model_type == "rnn":
        cfg = rnn_lm_small(**sizes)
    elif model_type == "dntm_adapted_rows":  # its per-document entity-row state must carry across segments
        cfg = dntm_small(**sizes, dntm={"dynamic": "both", "merge_fn": "gru", "adapt_entity_rows": True})
    elif model_type.startswith("dntm_"):
        cfg = dntm_small(**sizes, dntm={"dynamic": model_type[len("dntm_"):], "merge_fn": "gru"})
    else:
        cfg = dynamical_lm_small(**sizes, dynamical={"segment_len": 9})
    model = build_model(cfg, spec)
    if model_type == "dntm_adapted_rows":
        with torch.no_grad():
            model.row_adaptation.rate.normal_(0.0, 1.0)  # (zero at the start: no effect)
    return model


MODEL_TYPES = ["rnn", "dntm_input", "dntm_output", "dntm_both", "dntm_adapted_rows", "dynamical"]


def _assert_same_metrics(dynamic, static):
    """Every key of static evaluation's metrics dict, per category: counts exactly, NLL sums and
    perplexities to rel 1e-5. Why 1e-5: static evaluation reads the documents as one padded batch
    (packed RNN, batched matmuls), dynamic evaluation one document at a time in pieces, so each
    float32 token NLL differs by summation order (~1e-7 relative); the bug was ~10 %."""
    assert set(dynamic) == set(static)
    for key, value in static.items():
        if key.startswith("count_") or key == "tokens":
            assert dynamic[key] == value, key
        else:
            assert dynamic[key] == pytest.approx(value, rel=1e-5, abs=1e-9, nan_ok=True), key


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_zero_step_equals_static_evaluation_for_every_model_type(model_type):
    from dynlm.tasks.lm_evaluation import evaluate_lm

    spec, stats_batch, eval_batch, eval_rows = _synth_data()
    model = _model_of_type(model_type, spec)
    stats = collect_grad_stats(model, [stats_batch], segment_len=7)
    if model_type == "dynamical":  # its own segments count the batch's lockstep positions (padding
        # included), so its static scores depend on the batch: the reference reads documents alone
        static = evaluate_lm(model, [collate_documents([row], spec) for row in eval_rows])
    else:
        static = evaluate_lm(model, [eval_batch])
    assert static["count_reappearing"] > 20 and static["count_first_mention"] > 5  # the categories are there
    dynamic = dynamic_evaluate(model, [eval_batch], DynamicEvalConfig(lr=0.0, decay=0.0, segment_len=7), stats)
    _assert_same_metrics(dynamic, static)
    assert model.training  # the mode is restored


def _static_token_nll(model, batch, row):
    """Static per-token NLL of document ``row`` read alone: ``[tokens]`` in reading order."""
    from dynlm.losses import token_nll
    from dynlm.modules.fast_weights import select_rows, slice_columns

    model.eval()
    parts = []
    with torch.enable_grad() if model.needs_grad_at_eval else torch.no_grad():
        state = model.init_state(1)
        for sentence in batch.sentences:
            length = int(sentence.lengths[row])
            if length == 0:
                continue
            sentence = slice_columns(select_rows(sentence, [row]), 0, length)
            output, state = model(sentence, state)
            parts.append(token_nll(output.logits.detach(), sentence.targets, sentence.mask, output.positions)[0])
            state = model.detach_state(state)
    model.train()
    return torch.cat(parts)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_first_segment_of_every_document_scores_as_static_and_later_ones_adapt(model_type):
    from dynlm.dynamic_eval import dynamic_scores

    spec, stats_batch, eval_batch, _ = _synth_data()
    model = _model_of_type(model_type, spec)
    stats = collect_grad_stats(model, [stats_batch], segment_len=7)
    cfg = DynamicEvalConfig(lr=0.05, decay=0.01, segment_len=7)
    scores = list(dynamic_scores(model, [eval_batch], cfg, stats))
    assert [s.document for s in scores] == sorted(s.document for s in scores)
    for row in range(eval_batch.batch_size):
        static = _static_token_nll(model, eval_batch, row)
        mine = [s for s in scores if s.document == row]
        first = torch.cat([s.nll[0] for s in mine if s.segment == 0])
        later = torch.cat([s.nll[0] for s in mine if s.segment > 0])
        assert first.numel() >= cfg.segment_len and first.numel() + later.numel() == static.numel()
        torch.testing.assert_close(first, static[: first.numel()], rtol=1e-5, atol=1e-6)
        assert float((later - static[first.numel():]).abs().max()) > 1e-3  # the steps change later scores


@pytest.mark.parametrize("model_type", ["rnn", "dntm_both"])
def test_grad_stats_read_documents_alone_whatever_the_batch(model_type):
    """The statistics are of one document's segment gradient (what the update divides by them):
    the same documents give the same statistics in one batch or one per batch (before issue 18
    the batch's mean gradient was used: smaller with more documents, so steps were larger)."""
    spec, stats_batch, _, _ = _synth_data()
    model = _model_of_type(model_type, spec)
    together = collect_grad_stats(model, [stats_batch], segment_len=7)
    alone = collect_grad_stats(model, [_one_document(stats_batch, row) for row in range(stats_batch.batch_size)],
                               segment_len=7)
    for name in together:
        torch.testing.assert_close(together[name], alone[name], rtol=1e-4, atol=1e-9)


def _one_document(batch, row):
    """Document ``row`` of a DocumentBatch as a batch of its own (its sentences only)."""
    from dynlm.data.batching import DocumentBatch
    from dynlm.modules.fast_weights import select_rows

    sentences = [select_rows(s, [row]) for s in batch.sentences if int(s.lengths[row]) > 0]
    return DocumentBatch(sentences, [batch.doc_ids[row]], sum(int(s.mask.sum()) for s in sentences), 0)


def _weights_while_reading(model, batch, stats, names):
    """name -> how far each weight moved from theta_0 while the first document was read (read
    from inside :func:`dynamic_scores`, which restores the weights at every document start)."""
    from dynlm.dynamic_eval import dynamic_scores

    theta0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = DynamicEvalConfig(lr=0.05, decay=0.0, segment_len=7)
    moved = None
    for score in dynamic_scores(model, [batch], cfg, stats, names=names):
        if score.document > 0:
            break
        moved = {n: float((p.detach() - theta0[n]).abs().max()) for n, p in model.named_parameters()}
    return moved


def test_dntm_dynamic_evaluation_adapts_the_lm_weights_only_unless_named():
    """The DNTM declares every weight outside its LM static for dynamic evaluation (W_dy, W_dx, the
    context encoder, the merge): by default ``lm.*`` adapts and they do not; named, they adapt too."""
    from dynlm.dynamic_eval import default_adapted_names

    spec, stats_batch, eval_batch, _ = _synth_data()
    model = _model_of_type("dntm_both", spec)
    stats = collect_grad_stats(model, [stats_batch], segment_len=7)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert default_adapted_names(model) == [n for n in trainable if n.startswith("lm.")]
    assert {"output_proj.weight", "input_proj.weight", "merge.cell.weight_ih"} <= set(model.dynamic_eval_static_params)
    moved = _weights_while_reading(model, eval_batch, stats, names=None)
    assert all(moved[n] == 0.0 for n in ("output_proj.weight", "input_proj.weight", "merge.cell.weight_ih",
                                         "context_encoder.proj.weight"))
    assert all(moved[n] > 0 for n in ("lm.decoder.weight", "lm.embedding.word.weight", "lm.rnn.weight_hh_l0"))
    moved = _weights_while_reading(model, eval_batch, stats, names=trainable)
    assert moved["output_proj.weight"] > 0 and moved["merge.cell.weight_ih"] > 0
    rnn = _model_of_type("rnn", spec)
    assert default_adapted_names(rnn) == [n for n, p in rnn.named_parameters() if p.requires_grad]
