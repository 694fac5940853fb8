"""Building blocks of a task whose records are one sequence of units each (characters, bytes,
subtokens) read left to right: a unit vocabulary (the preprocessor) and next-unit batches.

The character-level test task (``tests/dynlm/tasks/char_task.py``) is built from them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from dynlm.config import Config

PAD, UNK, EOS = 0, 1, 2  # unit ids; the vocabulary's units from 3 on, most frequent first


@dataclass
class UnitSpec(Config):
    """What a model over a :class:`UnitVocabulary` is built from besides its config."""

    num_units: int  # output size, the specials included


class UnitVocabulary:
    """Unit -> id: the specials ``PAD UNK EOS``, then the kept units, most frequent first (ties
    by the unit itself, so the order is deterministic). A preprocessor (``to_json`` /
    ``from_json`` / ``spec``)."""

    def __init__(self, units: list[str]):
        self.units = list(units)
        self.ids = {unit: 3 + i for i, unit in enumerate(self.units)}
        self.spec = UnitSpec(num_units=3 + len(self.units))

    @classmethod
    def fit(cls, counts: dict[str, int], max_units: int) -> "UnitVocabulary":
        """The ``max_units`` most frequent units of ``counts`` (the others read as UNK)."""
        return cls(sorted(counts, key=lambda unit: (-counts[unit], unit))[:max_units])

    def to_json(self) -> str:
        return json.dumps({"units": self.units})

    @classmethod
    def from_json(cls, text: str) -> "UnitVocabulary":
        return cls(json.loads(text)["units"])

    def encode(self, units) -> list[int]:
        """Ids of ``units`` (an iterable of units: a string is its characters), then EOS."""
        return [self.ids.get(unit, UNK) for unit in units] + [EOS]


@dataclass
class NextUnitBatch:
    """Sequences read left to right: ``inputs`` ``[B, T]`` (EOS, then the sequence but its last
    id), ``targets`` ``[B, T]`` (the sequence), ``mask`` ``[B, T]`` bool (real targets)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor

    def to(self, device) -> "NextUnitBatch":
        return NextUnitBatch(self.inputs.to(device), self.targets.to(device), self.mask.to(device))

    @property
    def num_documents(self) -> int:
        """Sequences with at least one target (an inactive batch has none)."""
        return int(self.mask.any(dim=1).sum())

    @property
    def num_padded(self) -> int:
        """Padded positions of those sequences."""
        return int((~self.mask[self.mask.any(dim=1)]).sum())

    @classmethod
    def collate(cls, sequences: list[list[int]]) -> "NextUnitBatch":
        """One batch of id sequences (each ending in EOS), padded to the longest; no sequences:
        an inactive batch of one masked position (a DDP rank without data)."""
        width = max((len(ids) for ids in sequences), default=1)
        targets = torch.full((max(len(sequences), 1), width), PAD, dtype=torch.long)
        for b, ids in enumerate(sequences):
            targets[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        inputs = torch.cat([torch.full_like(targets[:, :1], EOS), targets[:, :-1]], dim=1)
        return cls(inputs, targets, targets != PAD)
