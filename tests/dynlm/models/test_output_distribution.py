"""Every LM model type scores a proper distribution: at every real position of static scoring,
the probabilities the metrics use (``exp(-token_nll)``) sum to 1 over the whole output
vocabulary (words of the short list + entity identifiers)."""

from __future__ import annotations

import pytest
import torch

from dynlm.data.batching import collate_documents
from dynlm.losses import token_nll
from dynlm.models import build_model, rnn_lm_small
from dynlm.models.dntm import dntm_small
from dynlm.models.dynamical_lm import dynamical_lm_small

MODEL_CONFIGS = {
    "rnn": lambda: rnn_lm_small(embed_dim=16, hidden_dim=16),
    "dntm_input": lambda: dntm_small(embed_dim=16, hidden_dim=16, dntm={"dynamic": "input", "merge_fn": "gru"}),
    "dntm_output": lambda: dntm_small(embed_dim=16, hidden_dim=16, dntm={"dynamic": "output", "merge_fn": "gru"}),
    "dntm_both": lambda: dntm_small(embed_dim=16, hidden_dim=16, dntm={"dynamic": "both", "merge_fn": "max"}),
    "dntm_both_new_entity_gate": lambda: dntm_small(
        embed_dim=16, hidden_dim=16, dntm={"dynamic": "both", "merge_fn": "gru", "new_entity_score": True,
                                           "gate_dynamic_scores": True}),
    "dntm_both_new_entity_logit": lambda: dntm_small(
        embed_dim=16, hidden_dim=16, dntm={"dynamic": "both", "merge_fn": "gru", "new_entity_score": True,
                                           "new_entity_replaces_static": True}),
    "dntm_both_mention_cache": lambda: dntm_small(
        embed_dim=16, hidden_dim=16, dntm={"dynamic": "both", "merge_fn": "gru", "mention_cache": True}),
    "dntm_both_adapted_entity_rows": lambda: dntm_small(
        embed_dim=16, hidden_dim=16, dntm={"dynamic": "both", "merge_fn": "gru", "new_entity_score": True,
                                           "new_entity_replaces_static": True, "adapt_entity_rows": True}),
    "dntm_both_adapted_entity_rows_per_token": lambda: dntm_small(
        embed_dim=16, hidden_dim=16, dntm={"dynamic": "both", "merge_fn": "gru", "adapt_entity_rows": True,
                                           "entity_row_step": "token"}),
    "rnn_entity_class": lambda: rnn_lm_small(embed_dim=16, hidden_dim=16, entity_class_output=True),
    "dntm_both_new_entity_logit_entity_class": lambda: dntm_small(
        embed_dim=16, hidden_dim=16, entity_class_output=True,
        dntm={"dynamic": "both", "merge_fn": "gru", "new_entity_score": True, "new_entity_replaces_static": True}),
    "dynamical": lambda: dynamical_lm_small(embed_dim=16, hidden_dim=16, dynamical={"segment_len": 5}),
}


def _probability_sums(model, batch) -> torch.Tensor:
    """``[N]`` sum over every output id of exp(-token_nll), at the N real positions of the batch."""
    vocab = model.spec.output_size
    sums = []
    model.eval()
    with torch.enable_grad() if model.needs_grad_at_eval else torch.no_grad():
        state = model.init_state(batch.batch_size)
        for sentence in batch.sentences:
            output, state = model(sentence, state)
            logits = output.logits.detach()  # [B, L, V] or [N, V] at output.positions
            probs = torch.stack([torch.exp(-token_nll(logits, torch.full_like(sentence.targets, v), sentence.mask,
                                                      output.positions))
                                 for v in range(vocab)], dim=-1)  # [B, L, V]
            sums.append(probs.sum(dim=-1)[sentence.mask])
    return torch.cat(sums)


@pytest.mark.parametrize("model_type", sorted(MODEL_CONFIGS))
def test_probabilities_sum_to_one_at_every_position(model_type, tiny_spec, random_rows):
    torch.manual_seed(0)
    model = build_model(MODEL_CONFIGS[model_type](), tiny_spec)
    with torch.no_grad():  # the entity-row state starts at w = 0 (no effect)
        for name, param in model.named_parameters():
            if name in ("mention_cache.weight", "row_adaptation.rate"):
                param.normal_(0.0, 2.0)
    batch = collate_documents(random_rows(4, seed=3), tiny_spec)
    sums = _probability_sums(model, batch)
    assert sums.numel() == batch.num_tokens
    torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=1e-5)


@pytest.mark.parametrize("model_type", ["rnn", "dntm_both"])
def test_the_entity_mask_is_exact_on_anonymized_text(model_type):
    """On the anonymized synthetic corpus no target is ever masked (finite NLL everywhere),
    impossible ids are (-inf), and the mask only lowers the NLL (the same weights)."""
    import collections
    import dataclasses

    from dynlm.data.anonymize import anonymize
    from dynlm.data.config import DataConfig
    from dynlm.data.preprocessor import Preprocessor
    from dynlm.data.synth import SynthConfig, generate
    from dynlm.tasks.lm_evaluation import evaluate_lm

    docs = [anonymize(d, max_chains=8)[0] for d in generate(SynthConfig(num_documents=4))]
    counts = collections.Counter(w for d in docs for s in d["sentences"] for w in s)
    pre = Preprocessor.fit(dict(counts), DataConfig(inputs=["synth"], vocab_size=200, bpe_merges=0, max_chains=8))
    rows = [{"doc_id": d["doc_id"], "source_file": d["source_file"], **pre.encode_document(d["sentences"])}
            for d in docs]
    batch = collate_documents(rows, pre.spec)
    torch.manual_seed(0)
    masked = build_model(MODEL_CONFIGS[model_type](), pre.spec)
    unmasked = build_model(dataclasses.replace(masked.cfg, mask_unseen_entities=False), pre.spec)
    unmasked.load_state_dict(masked.state_dict())
    on, off = evaluate_lm(masked, [batch]), evaluate_lm(unmasked, [batch])
    assert on["tokens"] == off["tokens"] and torch.isfinite(torch.tensor(on["loss"]))
    assert on["nll_sum_all"] < off["nll_sum_all"]
    assert on["nll_sum_first_mention"] < off["nll_sum_first_mention"]
    masked.eval()
    with torch.no_grad():
        output, _ = masked(batch.sentences[0], masked.init_state(batch.batch_size))
    assert bool(torch.isinf(output.logits).any())
