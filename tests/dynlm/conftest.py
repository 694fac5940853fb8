"""Shared helpers for model/batching tests: a tiny VocabSpec, hand-made encoded rows, and real
gloo process groups (the ``gloo_ranks`` fixture: :func:`run_gloo_ranks`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dynlm.vocab_spec import VocabSpec

TINY_SPEC = VocabSpec(num_words=20, num_entities=3, shortlist_size=15, num_subwords=12)


def subwords_of(word_id: int, spec: VocabSpec = TINY_SPEC) -> list[int]:
    """A deterministic 1-3 unit segmentation of a word id (ids in [1, num_subwords))."""
    if word_id >= spec.num_words or word_id < 4:  # entities / specials: one special unit
        return [1]
    return [2 + (word_id + k) % (spec.num_subwords - 2) for k in range(1 + word_id % 3)]


def make_row(doc_id: str, sentences: list[list[int]], spec: VocabSpec = TINY_SPEC) -> dict:
    """An ENCODED_SCHEMA row from sentences of word ids (without <bos>/<eos>; added here)."""
    word_ids, entity_ids, sub_ids, sub_lengths, lengths = [], [], [], [], []
    for sentence in sentences:
        full = [spec.bos_id, *sentence, spec.eos_id]
        lengths.append(len(full))
        for w in full:
            word_ids.append(w)
            entity_ids.append(w - spec.num_words + 1 if w >= spec.num_words else 0)
            units = subwords_of(w, spec)
            sub_ids.extend(units)
            sub_lengths.append(len(units))
    return {
        "doc_id": doc_id, "source_file": "test", "num_tokens": len(word_ids), "sentence_lengths": lengths,
        "word_ids": word_ids, "entity_ids": entity_ids, "subword_ids": sub_ids, "subword_lengths": sub_lengths,
    }


def random_rows(num_docs: int, seed: int = 0, spec: VocabSpec = TINY_SPEC, max_sentences: int = 5) -> list[dict]:
    """Random documents (1..max_sentences sentences of 1..8 tokens, some entity mentions)."""
    import random

    rng = random.Random(seed)
    rows = []
    for d in range(num_docs):
        sentences = []
        for _ in range(rng.randint(1, max_sentences)):
            sentence = [rng.randrange(4, spec.output_size) for _ in range(rng.randint(1, 8))]
            sentences.append(sentence)
        rows.append(make_row(f"doc{d}", sentences, spec))
    return rows


@pytest.fixture
def tiny_spec() -> VocabSpec:
    """20 words (short list 15), 3 entity identifiers (ids 20..22), 12 subwords."""
    return TINY_SPEC


@pytest.fixture(name="make_row")
def make_row_fixture():
    """``make_row(doc_id, sentences_of_word_ids) -> encoded row`` over TINY_SPEC."""
    return make_row


@pytest.fixture(name="random_rows")
def random_rows_fixture():
    """``random_rows(num_docs, seed=0) -> list of encoded rows`` over TINY_SPEC."""
    return random_rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_gloo_ranks(script: str, out_dir: Path, *args: str, world_size: int = 2, timeout: float = 180,
                   hang_message: str = "DDP workers hung") -> list[dict]:
    """Run the Python source ``script`` as ``world_size`` processes of one gloo group (MASTER_ADDR,
    MASTER_PORT, RANK, WORLD_SIZE set; ``sys.argv[1:]`` = ``out_dir``, ``*args``). Each rank writes
    ``rank{r}.json`` into ``out_dir``; returns them in rank order. A hang or a failing rank fails the test."""
    path = Path(out_dir) / "gloo_worker.py"
    path.write_text(script)
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(world_size),
           "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)}
    procs = [subprocess.Popen([sys.executable, str(path), str(out_dir), *args], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(world_size)]
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=timeout)[0].decode())
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail(hang_message)
    assert all(p.returncode == 0 for p in procs), outputs
    return [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in range(world_size)]


@pytest.fixture
def gloo_ranks():
    """:func:`run_gloo_ranks`, for tests that run real DDP processes."""
    return run_gloo_ranks
