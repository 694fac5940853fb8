"""A tiny real dynlm model + preprocessor for the MLflow tests (no Ray, no prepared data)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from dynlm.data.config import DataConfig
from dynlm.data.preprocessor import Preprocessor
from dynlm.models import build_model
from dynlm.models.config import ModelConfig

TRAIN_TEXT = """\
the captain walked to the harbour .
<unk1> saw the ship and the captain .
the ship sailed at dawn .
<unk1> waved to <unk2> from the harbour .
<unk2> laughed and the captain smiled .
the harbour was quiet at night .
"""


def make_tiny_lm(folder: Path, *, seed: int = 0, model_type: str = "dntm"):
    """A seeded tiny model, its config, VocabSpec and a saved preprocessor.json.

    Returns:
        ``(model, model_cfg, spec, preprocessor_path)``.
    """
    counts = Counter(token for line in TRAIN_TEXT.splitlines() for token in line.split())
    data_cfg = DataConfig(inputs=["memory"], vocab_size=30, gamma=0.8, bpe_merges=20, max_chains=4)
    preprocessor = Preprocessor.fit(dict(counts), data_cfg)
    path = preprocessor.save(Path(folder) / "preprocessor.json")
    model_cfg = ModelConfig(type=model_type, embed_dim=16, hidden_dim=16, dropout=0.0,
                            embedding="word+subword", subword_dim=8)
    torch.manual_seed(seed)
    model = build_model(model_cfg, preprocessor.spec)
    model.eval()
    return model, model_cfg, preprocessor.spec, path


def make_prepared_folder(folder: Path, preprocessor_path: Path):
    """A prepared folder with no shards (tracking only reads its manifest and preprocessor)."""
    import json

    from dynlm.data.prepared import PreparedData

    folder.mkdir(parents=True)
    (folder / "preprocessor.json").write_bytes(Path(preprocessor_path).read_bytes())
    (folder / "manifest.json").write_text(json.dumps(
        {"task": "lm", "preprocessor": "preprocessor.json", "splits": {"train": "train", "valid": "valid", "test": "test"}}))
    return PreparedData.open(folder)
