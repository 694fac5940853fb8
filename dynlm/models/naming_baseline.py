"""The frequency baseline of method naming: the most common name for a function's features.

Fitted by counting, over the training functions, how often each (feature, name) pair occurs
(each feature counted once per function) and how often each name occurs. Each feature f seen
in training gives a name distribution, the share c(f, n) / c(f) of its functions named n; a
function's names are ranked by the mean of those distributions over its known features F
(``c(f) = Σ_n c(f, n) > 0``), ties (and names that co-occur with none of its features, the
back-off) by the name's global count, then by id. The probability it reports is that mean
with the global distribution as one more, smoothing member:

    p(n | F) = (Σ_{f∈F} c(f, n) / c(f) + p_g(n)) / (|F| + 1),    p_g(n) = (c(n) + 1) / Σ_m (c(m) + 1)

(p_g is add-one smoothed over every name but PAD), a distribution over the names that the
suggestion-frequency curve can threshold like a model's. A share, not a raw count: features
that nearly every method has (``arg:self``) would otherwise vote for the most frequent name
(``__init__``) whatever the body says. Suggestions never hold PAD or UNK. :meth:`to_dict` /
:meth:`from_dict` save it as JSON.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

import torch

from dynlm.models.naming import PAD, UNK, NamingBatch

_KEYS = {"num_names", "num_features", "name_counts", "cooccurrence"}


class FrequencyBaseline:
    """Counts of names and (feature, name) pairs; :meth:`fit` on training batches, then :meth:`suggest`.

    Args:
        num_names: name vocabulary size (``spec.num_names``).
        num_features: feature vocabulary size (``spec.num_features``).
    """

    def __init__(self, num_names: int, num_features: int):
        if num_names <= UNK + 1:
            raise ValueError(f"FrequencyBaseline: num_names {num_names} leaves no name to suggest (PAD and UNK only)")
        self.num_names, self.num_features = num_names, num_features
        self.name_counts = [0] * num_names
        self.cooccurrence: Counter[tuple[int, int]] = Counter()  # (feature, name) -> functions
        self._matrix: torch.Tensor | None = None  # [num_features, num_names] sparse, built on demand

    def update(self, batch: NamingBatch) -> "FrequencyBaseline":
        """Add the functions of one training batch (rows with a PAD name are skipped)."""
        for features, name in zip(batch.features.tolist(), batch.names.tolist()):
            if name == PAD:
                continue
            if not 0 <= name < self.num_names:
                raise ValueError(f"FrequencyBaseline: name id {name} outside the vocabulary of {self.num_names}")
            self.name_counts[name] += 1
            for feature in set(features) - {PAD}:
                if not 0 <= feature < self.num_features:
                    raise ValueError(f"FrequencyBaseline: feature id {feature} outside the vocabulary of {self.num_features}")
                self.cooccurrence[feature, name] += 1
        self._matrix = None
        return self

    def fit(self, batches: Iterable[NamingBatch]) -> "FrequencyBaseline":
        """:meth:`update` with every batch; returns self."""
        for batch in batches:
            self.update(batch)
        return self

    def _cooccurrence_matrix(self) -> torch.Tensor:
        if self._matrix is None:
            pairs = sorted(self.cooccurrence.items())
            index = torch.tensor([p for p, _ in pairs], dtype=torch.long).reshape(-1, 2).t()
            values = torch.tensor([c for _, c in pairs], dtype=torch.float64)
            self._matrix = torch.sparse_coo_tensor(index, values, (self.num_features, self.num_names),
                                                   check_invariants=True).coalesce()
        return self._matrix

    def _feature_shares(self, batch: NamingBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``([B, num_names] Σ_{f ∈ F} c(f, n) / c(f), [B, 1] |F|)`` float64 over each function's
        known features (each once)."""
        matrix = self._cooccurrence_matrix()
        per_feature = torch.sparse.sum(matrix, dim=1).to_dense() if matrix._nnz() else torch.zeros(self.num_features,
                                                                                                 dtype=torch.float64)
        present = torch.zeros(batch.size, self.num_features, dtype=torch.float64)
        present.scatter_(1, batch.features.cpu(), 1.0)
        present[:, PAD] = 0.0
        present[:, per_feature == 0] = 0.0  # unseen in training: no distribution
        weights = present / per_feature.clamp(min=1.0)  # 1 / c(f) where present
        return torch.sparse.mm(matrix.t(), weights.t()).t(), present.sum(dim=1, keepdim=True)

    def _probabilities(self, shares: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
        """``[B, num_names]`` p(n | F) (module docstring)."""
        counts = torch.tensor(self.name_counts, dtype=torch.float64) + 1.0
        counts[PAD] = 0.0
        global_probs = counts / counts.sum()
        return (shares + global_probs) / (known + 1.0)

    def log_prob(self, batch: NamingBatch) -> torch.Tensor:
        """``[B]`` log p(true name | features) (UNK names included; -inf for PAD)."""
        probs = self._probabilities(*self._feature_shares(batch))
        return probs.gather(1, batch.names.cpu()[:, None]).squeeze(1).log()

    def suggest(self, batch: NamingBatch, top_k: int = 5) -> list[list[tuple[tuple[int, ...], float]]]:
        """Per function the ``top_k`` best names as ``((name_id,), log p)``, ranked as the module
        docstring says; never PAD or UNK."""
        shares, known = self._feature_shares(batch)  # [B, V], [B, 1]
        by_count = torch.tensor(self.name_counts, dtype=torch.float64).expand_as(shares)
        order = torch.sort(by_count, dim=1, descending=True, stable=True).indices  # count, then id
        key = shares.gather(1, order)
        key[torch.isin(order, torch.tensor([PAD, UNK]))] = -1.0
        order = order.gather(1, torch.sort(key, dim=1, descending=True, stable=True).indices)
        order = order[:, : min(top_k, self.num_names - 2)]
        log_probs = self._probabilities(shares, known).log().gather(1, order)
        return [[((n,), p) for n, p in zip(names, probs)] for names, probs in zip(order.tolist(), log_probs.tolist())]

    def to_dict(self) -> dict:
        """JSON-able: sizes, ``name_counts`` and ``cooccurrence`` as sorted ``[feature, name, count]``."""
        return {"num_names": self.num_names, "num_features": self.num_features, "name_counts": list(self.name_counts),
                "cooccurrence": [[f, n, c] for (f, n), c in sorted(self.cooccurrence.items())]}

    @classmethod
    def from_dict(cls, data: dict) -> "FrequencyBaseline":
        """The baseline :meth:`to_dict` gave (unknown or missing keys raise)."""
        if set(data) != _KEYS:
            raise ValueError(f"FrequencyBaseline.from_dict: expected keys {sorted(_KEYS)}, got {sorted(data)}")
        baseline = cls(int(data["num_names"]), int(data["num_features"]))
        if len(data["name_counts"]) != baseline.num_names:
            raise ValueError(f"FrequencyBaseline.from_dict: {len(data['name_counts'])} name_counts for {baseline.num_names} names")
        baseline.name_counts = [int(c) for c in data["name_counts"]]
        baseline.cooccurrence = Counter({(int(f), int(n)): int(c) for f, n, c in data["cooccurrence"]})
        return baseline
