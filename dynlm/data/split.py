"""Deterministic, hash-based train/valid/test assignment of documents."""

from __future__ import annotations

import hashlib


def split_fraction(doc_id: str, seed: int) -> float:
    """A uniform number in [0, 1) that depends only on (seed, doc_id)."""
    digest = hashlib.sha256(f"{seed}\x00{doc_id}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_split(doc_id: str, *, seed: int, valid_fraction: float, test_fraction: float) -> str:
    """Return ``"train"``, ``"valid"`` or ``"test"`` for a document.

    The same (doc_id, seed) always lands in the same split, whatever the order of documents,
    the number of workers or the other documents in the corpus.

    Args:
        doc_id: the document's stable id.
        seed: split seed (DataConfig.split_seed).
        valid_fraction: expected fraction of documents in ``valid``.
        test_fraction: expected fraction in ``test``.

    Returns:
        The split name.
    """
    if valid_fraction < 0 or test_fraction < 0 or valid_fraction + test_fraction >= 1:
        raise ValueError(
            f"valid_fraction ({valid_fraction}) and test_fraction ({test_fraction}) must be >= 0 "
            "and sum to < 1"
        )
    u = split_fraction(doc_id, seed)
    if u < valid_fraction:
        return "valid"
    if u < valid_fraction + test_fraction:
        return "test"
    return "train"
