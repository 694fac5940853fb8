"""Shared fixtures for the search tests."""

from __future__ import annotations

import pytest

from dynlm.search.space_file import from_mapping
from pipelines.defaults import default_job


@pytest.fixture(name="make_space")
def make_space_fixture():
    """``make_space(search, tune=None, base=None) -> SearchSpace`` (source ``t.yaml``) over the
    embedded default job with subwords on, so that searching bpe_merges is meaningful."""
    def make_space(search: dict, tune: dict | None = None, base: dict | None = None):
        raw = {"base": {"model.embedding": "word+subword", **(base or {})}, "search": search, "tune": tune or {}}
        return from_mapping(raw, base_job=default_job(), source="t.yaml")

    return make_space
