"""The chunk layout computes what sentence lockstep computes (issue 11's equality test).

In the chunk layout (:class:`dynlm.data.batching.ChunkLayout`) the LM reads each document in
one recurrent pass per chunk, and the DNTM runs only its context encoder and merge sentence by
sentence (:meth:`dynlm.models.dntm.DNTM.forward_step`). In eval mode every target must get the
same log-likelihood as when the same model reads the same documents a sentence at a time.
"""

from __future__ import annotations

import pytest
import torch

from dynlm.data.batching import ChunkLayout, collate_documents
from dynlm.losses import token_nll
from dynlm.models import build_model, needs_whole_sentences
from dynlm.models.config import ModelConfig
from dynlm.models.dntm import PAPER_DNTM
from dynlm.vocab_spec import VocabSpec

TINY_SPEC = VocabSpec(num_words=20, num_entities=3, shortlist_size=15, num_subwords=12)  # as tests/dynlm/conftest.py

DNTM_CASES = [dict(dynamic=d, merge_fn=m) for d in ("input", "output", "both") for m in ("max", "gru", "gru_relu", "latest", "attention")]
DNTM_CASES += [dict(dynamic="both", merge_fn="gru", new_entity_score=True, gate_dynamic_scores=True),
               dict(dynamic="output", merge_fn="latest", new_entity_score=True),
               dict(dynamic="both", merge_fn="max", new_entity_score=True, new_entity_replaces_static=True),
               dict(dynamic="both", merge_fn="gru", mention_cache=True),
               dict(dynamic="none", merge_fn="gru", mention_cache=True),
               dict(dynamic="both", merge_fn="gru", adapt_entity_rows=True),
               dict(dynamic="both", merge_fn="max", new_entity_score=True, new_entity_replaces_static=True,
                    adapt_entity_rows=True),
               dict(dynamic="none", merge_fn="gru", adapt_entity_rows=True),
               dict(dynamic="both", merge_fn="gru", new_entity_score=True, new_entity_replaces_static=True,
                    adapt_entity_rows=True, entity_row_step="token")]
# each case changes the paper's DNTM (not the best-known defaults, which switch the additions on)
CASES = [dict(type="rnn"), dict(type="rnn", backbone="gru")] + [dict(type="dntm", dntm={**PAPER_DNTM, **case})
                                                                 for case in DNTM_CASES]


def _model(case: dict):
    torch.manual_seed(0)
    cfg = ModelConfig.from_dict({"backbone": "lstm", "embed_dim": 8, "hidden_dim": 8, "num_layers": 1, "dropout": 0.3,
                                 **case})
    model = build_model(cfg, TINY_SPEC).eval()
    with torch.no_grad():  # the entity-row state starts at w = 0 (no effect): give it weights that change the scores
        for name, param in model.named_parameters():
            if name in ("mention_cache.weight", "row_adaptation.rate"):
                param.normal_(0.0, 2.0)
    return cfg, model


def _token_nll(model, batch) -> list[list[float]]:
    """Per document, the NLL of each of its targets in reading order."""
    state = model.init_state(batch.batch_size)
    per_doc: list[list[float]] = [[] for _ in range(batch.batch_size)]
    with torch.no_grad():
        for step in batch.sentences:
            output, state = model(step, state)
            nll = token_nll(output.logits, step.targets, step.mask, output.positions)
            for row in range(batch.batch_size):
                per_doc[row] += nll[row, : int(step.lengths[row])].tolist()
    return per_doc


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["type"] + "-" + "-".join(str(v) for v in c.get("dntm", c).values()))
@pytest.mark.parametrize("tokens", [5, 12, 400])
def test_chunks_give_the_sentence_steps_log_likelihoods(case, tokens, random_rows):
    cfg, model = _model(case)
    rows = random_rows(6, seed=5, max_sentences=7)
    reference = _token_nll(model, collate_documents(rows, TINY_SPEC))
    layout = ChunkLayout(tokens, whole_sentences=needs_whole_sentences(cfg))
    chunked = _token_nll(model, collate_documents(rows, TINY_SPEC, layout))
    for ref, got in zip(reference, chunked):
        assert torch.allclose(torch.tensor(got), torch.tensor(ref), atol=1e-5, rtol=1e-5)


# Summed test NLL of the sentence-step models as they were before the chunked pass existed
# (commit 1c67be9: one LSTM call per sentence): the chunked pass must keep them.
BEFORE_CHUNKS = {
    "rnn": 317.4123589992523,
    "input-gru": 317.4632840156555,
    "output-max": 317.4458131790161,
    "both-gru": 317.53862404823303,
    "both-latest-new-gate": 317.4608449935913,
}
BEFORE_CASES = {
    "rnn": dict(type="rnn"),
    "input-gru": dict(type="dntm", dntm=dict(dynamic="input", merge_fn="gru")),
    "output-max": dict(type="dntm", dntm=dict(dynamic="output", merge_fn="max")),
    "both-gru": dict(type="dntm", dntm=dict(dynamic="both", merge_fn="gru")),
    "both-latest-new-gate": dict(type="dntm", dntm=dict(dynamic="both", merge_fn="latest", new_entity_score=True,
                                                        gate_dynamic_scores=True)),
}
# recorded on the paper's DNTM: each case changes PAPER_DNTM (the defaults switch dynlm's additions on)
BEFORE_CASES = {name: {**case, "dntm": {**PAPER_DNTM, **case["dntm"]}} if "dntm" in case else case
                for name, case in BEFORE_CASES.items()}


@pytest.mark.parametrize("name", sorted(BEFORE_CHUNKS))
@pytest.mark.parametrize("tokens", [None, 6, 13, 1000])
def test_chunks_keep_the_log_likelihoods_of_the_sentence_step_models(name, tokens, random_rows):
    torch.manual_seed(0)
    cfg = ModelConfig.from_dict({"backbone": "lstm", "embed_dim": 8, "hidden_dim": 8, "num_layers": 1, "dropout": 0.0,
                                 **BEFORE_CASES[name]})
    model = build_model(cfg, TINY_SPEC).eval()
    layout = None if tokens is None else ChunkLayout(tokens, whole_sentences=needs_whole_sentences(cfg))
    total = sum(sum(doc) for doc in _token_nll(model, collate_documents(random_rows(5, seed=7, max_sentences=7),
                                                                       TINY_SPEC, layout)))
    assert total == pytest.approx(BEFORE_CHUNKS[name], abs=1e-4)


def test_a_chunk_of_whole_sentences_trains_like_its_sentences(random_rows):
    """Training mode, dropout off: the loss and the gradients of one chunk of whole sentences
    equal those of the same sentences read as one truncated-BPTT chunk of sentence steps."""
    cfg, model = _model(dict(type="dntm", dropout=0.0, dntm=dict(dynamic="both", merge_fn="gru")))
    model.train()
    rows = random_rows(3, seed=2, max_sentences=3)
    grads = []
    for layout in (None, ChunkLayout(1000, whole_sentences=True)):
        batch = collate_documents(rows, TINY_SPEC, layout)
        model.zero_grad()
        outputs, _ = model(batch.sentences, model.init_state(batch.batch_size))
        loss = sum(token_nll(o.logits, s.targets, s.mask, o.positions).sum() for o, s in zip(outputs, batch.sentences))
        loss.backward()
        grads.append((float(loss.detach()), [p.grad.clone() for p in model.parameters()]))
    (loss_a, grads_a), (loss_b, grads_b) = grads
    assert loss_b == pytest.approx(loss_a, rel=1e-6)
    for a, b in zip(grads_a, grads_b):
        assert torch.allclose(a, b, atol=1e-6)


def _doc_token_nll(model, batch) -> dict[str, list[float]]:
    """Per document id, the NLL of each of its targets in reading order (rows may hold several
    documents: a row's targets are cut at its documents' ``doc_start`` positions)."""
    rows = _token_nll(model, batch)
    starts: list[list[bool]] = [[] for _ in range(batch.batch_size)]
    for step in batch.sentences:
        for row in range(batch.batch_size):
            starts[row] += step.doc_start[row, : int(step.lengths[row])].tolist()
    pieces = []
    for nll, start in zip(rows, starts):
        for value, first in zip(nll, start):
            if first:
                pieces.append([])
            pieces[-1].append(value)
    assert len(pieces) == batch.num_documents
    return {doc_id: nll for doc_id, nll in zip(batch.doc_ids, pieces)}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["type"] + "-" + "-".join(str(v) for v in c.get("dntm", c).values()))
@pytest.mark.parametrize("tokens,num_rows", [(5, 2), (12, 3), (400, 2)])
def test_packed_rows_give_each_document_its_own_log_likelihoods(case, tokens, num_rows, random_rows):
    """Several documents a row (the next starting inside a chunk): every target gets the NLL it
    gets when its document has a row of its own: state and memory are reset at ``doc_start``."""
    cfg, model = _model(case)
    rows = random_rows(7, seed=11, max_sentences=6)
    whole = needs_whole_sentences(cfg)
    alone = _doc_token_nll(model, collate_documents(rows, TINY_SPEC, ChunkLayout(tokens, whole_sentences=whole)))
    packed_batch = collate_documents(rows, TINY_SPEC, ChunkLayout(tokens, whole_sentences=whole, pack_documents=True),
                                     num_rows=num_rows)
    assert packed_batch.batch_size == num_rows and packed_batch.num_documents == 7
    later_starts = [(t, c) for t, s in enumerate(packed_batch.sentences) for c in s.reset_columns.tolist() if t or c]
    assert later_starts  # a row reads a second document
    if not whole and tokens == 5:  # and one starts inside a chunk
        assert any(c > 0 for s in packed_batch.sentences for c in s.reset_columns.tolist())
    packed = _doc_token_nll(model, packed_batch)
    assert sorted(packed) == sorted(alone)
    for doc_id, ref in alone.items():
        assert torch.allclose(torch.tensor(packed[doc_id]), torch.tensor(ref), atol=1e-5, rtol=1e-5), doc_id
