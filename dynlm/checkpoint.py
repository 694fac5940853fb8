"""Checkpoints: ``{"state_dict", "model_config", "vocab_spec", "extra"}``, never pickled modules.

Loaded with ``torch.load(weights_only=True)``, so ``extra`` may hold only tensors and plain
Python values (dict, list, str, int, float, bool, None).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from dynlm.models import build_model
from dynlm.models.config import ModelConfig
from dynlm.vocab_spec import VocabSpec


_PLAIN = (str, int, float, bool, type(None), torch.Tensor)


def _check_plain(value, key: str) -> None:
    """Raise TypeError unless ``value`` loads under ``weights_only=True``."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"checkpoint extra{key}: key {k!r} must be a str or int")
            _check_plain(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{key}[{i}]")
    elif not isinstance(value, _PLAIN):
        raise TypeError(f"checkpoint extra{key}: {type(value).__name__} is not a plain value or tensor")


def save(path: str | Path, model: nn.Module, model_cfg: ModelConfig, spec: VocabSpec, extra: dict | None = None) -> Path:
    """Write a checkpoint (a DDP wrapper is unwrapped; parent folders are created).

    Args:
        path: the file to write.
        model: the model (or a DDP wrapper).
        model_cfg: its config.
        spec: its vocabulary spec.
        extra: plain values to keep alongside (epoch, metrics, train config dict ...).

    Returns:
        The path written.
    """
    _check_plain(dict(extra or {}), "")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    payload = {
        "state_dict": {k: v.detach().cpu() for k, v in module.state_dict().items()},
        "model_config": model_cfg.to_dict(),
        "vocab_spec": spec.to_dict(),
        "extra": dict(extra or {}),
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)
    return path


def load(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[nn.Module, ModelConfig, VocabSpec, dict]:
    """Rebuild the model from a checkpoint written by :func:`save`.

    Returns:
        ``(model, model_cfg, spec, extra)``; the model is in eval mode on ``map_location``.
    """
    payload = torch.load(Path(path), map_location=map_location, weights_only=True)
    missing = {"state_dict", "model_config", "vocab_spec", "extra"} - set(payload)
    if missing:
        raise ValueError(f"{path}: not a dynlm checkpoint (missing {sorted(missing)})")
    model_cfg = ModelConfig.from_dict(payload["model_config"])
    spec = VocabSpec.from_dict(payload["vocab_spec"])
    model = build_model(model_cfg, spec)
    model.load_state_dict(payload["state_dict"])
    model.to(map_location)
    model.eval()
    return model, model_cfg, spec, payload["extra"]
