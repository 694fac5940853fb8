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
            logits = output.logits.detach()  # [B, L, V]
            probs = torch.stack([torch.exp(-token_nll(logits, torch.full_like(sentence.targets, v), sentence.mask))
                                 for v in range(vocab)], dim=-1)  # [B, L, V]
            sums.append(probs.sum(dim=-1)[sentence.mask])
    return torch.cat(sums)


@pytest.mark.parametrize("model_type", sorted(MODEL_CONFIGS))
def test_probabilities_sum_to_one_at_every_position(model_type, tiny_spec, random_rows):
    torch.manual_seed(0)
    model = build_model(MODEL_CONFIGS[model_type](), tiny_spec)
    batch = collate_documents(random_rows(4, seed=3), tiny_spec)
    sums = _probability_sums(model, batch)
    assert sums.numel() == batch.num_tokens
    torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=1e-5)
