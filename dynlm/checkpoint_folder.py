"""The checkpoint file in a checkpoint folder (a Ray Train checkpoint, ``dynlm evaluate --model DIR``).

A folder holds one :mod:`dynlm.checkpoint` file: ``model.pt``, else its only ``*.pt``.
"""

from __future__ import annotations

from pathlib import Path


def find_checkpoint_file(checkpoint: str | Path) -> Path:
    """The dynlm checkpoint file in a checkpoint folder (``model.pt``, else the only ``*.pt``)."""
    path = Path(checkpoint)
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if (path / "model.pt").is_file():
        return path / "model.pt"
    candidates = sorted(path.glob("*.pt"))
    if len(candidates) != 1:
        raise FileNotFoundError(
            f"checkpoint folder {path} must hold model.pt or exactly one *.pt file; "
            f"found {[p.name for p in path.iterdir()]}")
    return candidates[0]
