"""Tests of dynlm.checkpoint: save -> load gives identical outputs; weights_only loading."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dynlm import checkpoint
from dynlm.data.batching import collate_documents
from dynlm.models import build_model, rnn_lm_small


@pytest.mark.parametrize("overrides", [{}, {"backbone": "gru", "tie_weights": True, "embedding": "word+subword",
                                             "combine": "sum", "num_layers": 2}])
def test_save_load_identical_outputs(tmp_path, tiny_spec, random_rows, overrides):
    cfg = rnn_lm_small(embed_dim=16, hidden_dim=16, subword_dim=8, **overrides)
    model = build_model(cfg, tiny_spec)
    with torch.no_grad():  # make the weights differ from a fresh init
        for p in model.parameters():
            p.add_(0.01)
    path = checkpoint.save(tmp_path / "sub" / "model.pt", model, cfg, tiny_spec, extra={"epoch": 3, "ppl": 12.5})
    loaded, loaded_cfg, loaded_spec, extra = checkpoint.load(path)
    assert loaded_cfg == cfg and loaded_spec == tiny_spec and extra == {"epoch": 3, "ppl": 12.5}
    assert not loaded.training
    if cfg.tie_weights:
        assert loaded.decoder.weight is loaded.embedding.word.weight
    model.eval()
    batch = collate_documents(random_rows(3), tiny_spec)
    with torch.no_grad():
        a, _ = model(batch.sentences, model.init_state(3))
        b, _ = loaded(batch.sentences, loaded.init_state(3))
    for x, y in zip(a, b):
        assert torch.equal(x.logits, y.logits)
    raw = torch.load(path, weights_only=True)
    assert set(raw) == {"task", "state_dict", "model_config", "vocab_spec", "extra"} and raw["task"] == "lm"


def test_load_rejects_non_checkpoint(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(1)}, path)
    with pytest.raises(ValueError, match="not a dynlm checkpoint"):
        checkpoint.load(path)


def test_extra_must_be_plain_values(tmp_path, tiny_spec):
    cfg = rnn_lm_small()

    class Custom:
        pass

    with pytest.raises(TypeError, match=r"extra\.metrics\.obj: Custom"):
        checkpoint.save(tmp_path / "m.pt", build_model(cfg, tiny_spec), cfg, tiny_spec, extra={"metrics": {"obj": Custom()}})
    assert not (tmp_path / "m.pt").exists()


#: A DNTM checkpoint saved before the model defaults became the best-known settings (the paper's
#: DNTM was the default then): E = H = 8 over TINY_SPEC, ``torch.manual_seed(3)`` weights.
BEFORE_DEFAULTS = Path(__file__).parent / "checkpoints" / "dntm_before_best_known_defaults.pt"


def test_a_checkpoint_saved_before_the_best_known_defaults_keeps_its_meaning(random_rows, tiny_spec):
    from dynlm.models.config import DNTMSettings

    model, cfg, spec, _ = checkpoint.load(BEFORE_DEFAULTS)
    assert spec == tiny_spec
    # it stored every setting, so today's defaults (dynlm's additions on) do not change it
    assert (cfg.dntm.new_entity_score, cfg.dntm.new_entity_replaces_static, cfg.dntm.adapt_entity_rows,
            cfg.dntm.entity_row_step) == (False, False, False, "sentence")
    assert cfg.dntm != DNTMSettings()
    assert not hasattr(model, "new_entity") or model.new_entity is None
    batch = collate_documents(random_rows(3), spec)
    with torch.no_grad():
        outputs, _ = model(batch.sentences, model.init_state(3))
    # the same scores as when it was saved (the sum of its finite logits then; float32 kernels
    # differ in their last bits between thread counts and runs: 56.6515915 was seen too)
    total = sum(float(o.logits[torch.isfinite(o.logits)].double().sum()) for o in outputs)
    assert total == pytest.approx(56.651591673493385, rel=1e-6)


def test_bytes_round_trip_rebuilds_the_same_model(tiny_spec, random_rows):
    """``to_bytes`` / ``load_bytes``: the checkpoint a process sends another (scoring actors),
    loaded with ``weights_only=True`` like a file."""
    cfg = rnn_lm_small(embed_dim=16, hidden_dim=16)
    torch.manual_seed(3)
    model = build_model(cfg, tiny_spec).eval()
    loaded = checkpoint.load_bytes(checkpoint.to_bytes(model, cfg, tiny_spec, task="lm"))
    assert loaded.task.name == "lm" and loaded.model_cfg == cfg and loaded.spec == tiny_spec and loaded.extra == {}
    assert not loaded.model.training
    batch = collate_documents(random_rows(2), tiny_spec)
    with torch.no_grad():
        a, _ = model(batch.sentences, model.init_state(2))
        b, _ = loaded.model(batch.sentences, loaded.model.init_state(2))
    assert all(torch.equal(x.logits, y.logits) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="checkpoint bytes: not a dynlm checkpoint"):
        import io

        buffer = io.BytesIO()
        torch.save({"weights": torch.zeros(1)}, buffer)
        checkpoint.load_bytes(buffer.getvalue())
