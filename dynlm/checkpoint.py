"""Checkpoints: ``{"task", "state_dict", "model_config", "vocab_spec", "extra"}``, never pickled modules.

``task`` names the :class:`dynlm.tasks.Task` whose ``model_config`` / ``spec_class`` /
``build_model`` rebuild the model (``lm`` for the LM models; ``vocab_spec`` is the task's spec).

Loaded with ``torch.load(weights_only=True)``, so ``extra`` may hold only tensors and plain
Python values (dict, list, str, int, float, bool, None).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dynlm.tasks import DEFAULT_TASK, get_task

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


def save(path: str | Path, model: nn.Module, model_cfg, spec, extra: dict | None = None, *,
         task: str = DEFAULT_TASK) -> Path:
    """Write a checkpoint (a DDP wrapper is unwrapped; parent folders are created).

    Args:
        path: the file to write.
        model: the model (or a DDP wrapper).
        model_cfg: its config (the task's ``model_config``).
        spec: its preprocessor's spec (the task's ``spec_class``; the LM: a VocabSpec).
        extra: plain values to keep alongside (epoch, metrics, train config dict ...).
        task: the task name (:func:`dynlm.tasks.get_task`) that rebuilds the model.

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(_payload(model, model_cfg, spec, extra, task), tmp)
    tmp.replace(path)
    return path


def to_bytes(model: nn.Module, model_cfg, spec, *, task: str = DEFAULT_TASK) -> bytes:
    """The checkpoint :func:`save` writes, as bytes (no extra): what a process sends another
    that must rebuild the model (:func:`load_bytes`; e.g. into Ray's object store for scoring actors)."""
    buffer = io.BytesIO()
    torch.save(_payload(model, model_cfg, spec, None, task), buffer)
    return buffer.getvalue()


def _payload(model: nn.Module, model_cfg, spec, extra: dict | None, task: str) -> dict:
    _check_plain(dict(extra or {}), "")
    module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return {
        "task": task,
        "state_dict": {k: v.detach().cpu() for k, v in module.state_dict().items()},
        "model_config": model_cfg.to_dict(),
        "vocab_spec": spec.to_dict(),
        "extra": dict(extra or {}),
    }


@dataclass
class Loaded:
    """A checkpoint rebuilt through its task: the model (eval mode), its config, spec and extra."""

    task: Any
    model: nn.Module
    model_cfg: Any
    spec: Any
    extra: dict


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> Loaded:
    """Rebuild the model of a checkpoint written by :func:`save`, through its task."""
    return _rebuild(torch.load(Path(path), map_location=map_location, weights_only=True), str(path), map_location)


def load_bytes(data: bytes, map_location: str | torch.device = "cpu") -> Loaded:
    """Rebuild the model of :func:`to_bytes`'s bytes (``weights_only=True``, like a file)."""
    return _rebuild(torch.load(io.BytesIO(data), map_location=map_location, weights_only=True), "checkpoint bytes",
                    map_location)


def _rebuild(payload: dict, source: str, map_location) -> Loaded:
    missing = {"task", "state_dict", "model_config", "vocab_spec", "extra"} - set(payload)
    if missing:
        raise ValueError(f"{source}: not a dynlm checkpoint (missing {sorted(missing)})")
    task = get_task(payload["task"])
    model_cfg = task.model_config.from_dict(payload["model_config"])
    spec = task.spec_class.from_dict(payload["vocab_spec"])
    model = task.build_model(model_cfg, spec)
    model.load_state_dict(payload["state_dict"])
    model.to(map_location)
    model.eval()
    return Loaded(task, model, model_cfg, spec, payload["extra"])


def load(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[nn.Module, Any, Any, dict]:
    """``(model, model_cfg, spec, extra)`` of :func:`load_checkpoint`; the model is in eval mode."""
    loaded = load_checkpoint(path, map_location)
    return loaded.model, loaded.model_cfg, loaded.spec, loaded.extra
