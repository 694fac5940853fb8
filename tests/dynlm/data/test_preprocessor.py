"""Preprocessor: exact encodings, entity ids, save/load round trip, byte-identical determinism."""

from __future__ import annotations

import json
import sys

import pytest

from dynlm.data.anonymize import anonymize
from dynlm.data.config import DataConfig
from dynlm.data.preprocessor import Preprocessor, entity_index, is_entity_token
from dynlm.data.synth import SynthConfig, generate

COUNTS = {"the": 5, "cat": 3, "sat": 2, "on": 2, "mat": 1, "dog": 1}


def fitted(**overrides) -> Preprocessor:
    cfg = DataConfig(inputs=["x"], vocab_size=5, gamma=0.5, bpe_merges=5, max_chains=3).replace(**overrides)
    return Preprocessor.fit(COUNTS, cfg)


def test_spec_and_exact_encoding():
    pre = fitted()
    assert pre.vocabulary.itos == ["<pad>", "<unk>", "<bos>", "<eos>", "the", "cat", "on", "sat", "dog"]
    spec = pre.spec
    assert (spec.num_words, spec.num_entities, spec.shortlist_size) == (9, 3, 4 + 3)
    assert spec.num_subwords == pre.subwords.vocab_size
    enc = pre.encode_text("<unk1> sat on the mat\n\nthe <unk3>")
    assert enc["num_tokens"] == 11 and enc["sentence_lengths"] == [7, 4]
    assert enc["word_ids"] == [2, 9, 7, 6, 4, 1, 3, 2, 4, 11, 3]   # mat -> <unk>, <unk3> -> 9 + 3 - 1
    assert enc["entity_ids"] == [0, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0]
    assert len(enc["subword_lengths"]) == 11 and sum(enc["subword_lengths"]) == len(enc["subword_ids"])
    sub = pre.subwords
    assert enc["subword_ids"][:2] == [sub.token_id("<bos>"), sub.token_id("<unk1>")]
    # out-of-vocabulary "mat" keeps its subwords
    assert pre.decode_word_ids(enc["word_ids"][:6]) == ["<bos>", "<unk1>", "sat", "on", "the", "<unk>"]
    assert enc == pre.encode_document([["<unk1>", "sat", "on", "the", "mat"], ["the", "<unk3>"]])


@pytest.mark.parametrize("gamma", [0.0, 0.2, 0.5, 0.8, 1.0])
def test_with_gamma_equals_a_fit_with_that_gamma(gamma):
    pre = fitted().with_gamma(gamma)
    assert pre.to_dict() == fitted(gamma=gamma).to_dict()
    assert pre.spec.shortlist_size == 4 + {0.0: 0, 0.2: 1, 0.5: 3, 0.8: 4, 1.0: 5}[gamma]
    text = "<unk1> sat on the mat\n\nthe <unk3>"
    assert pre.encode_text(text) == fitted().encode_text(text)  # the encoding does not depend on gamma


def test_entity_helpers_and_errors():
    assert is_entity_token("<unk12>") and not is_entity_token("<unk>") and not is_entity_token("<unk0>")
    assert entity_index("<unk12>") == 12 and entity_index("cat") == 0
    pre = fitted()
    with pytest.raises(ValueError, match="beyond max_chains=3"):
        pre.encode_text("<unk4>")
    with pytest.raises(ValueError, match="anonymize"):
        pre.encode_document([["a"]], [{"sentence": 0, "start": 0, "end": 0, "chain": "1"}])


def test_save_load_round_trip(tmp_path):
    docs = [anonymize(d, max_chains=10)[0] for d in generate(SynthConfig(num_documents=20))]
    counts: dict[str, int] = {}
    for d in docs:
        for s in d["sentences"]:
            for w in s:
                counts[w] = counts.get(w, 0) + 1
    pre = Preprocessor.fit(counts, DataConfig(inputs=["x"], vocab_size=60, bpe_merges=40, max_chains=10))
    path = pre.save(tmp_path / "preprocessor.json")
    data = json.loads(path.read_text())
    assert data["format_version"] == 1 and data["spec"] == pre.spec.to_dict()
    loaded = Preprocessor.load(path)
    assert loaded.spec == pre.spec and loaded.to_json() == pre.to_json()
    for d in docs:
        assert loaded.encode_document(d["sentences"]) == pre.encode_document(d["sentences"])
    data["format_version"] = 99
    with pytest.raises(ValueError, match="format_version 99"):
        Preprocessor.from_dict(data)


FIT_AND_PRINT = """
import hashlib, json
from dynlm.data.anonymize import anonymize
from dynlm.data.config import DataConfig
from dynlm.data.preprocessor import Preprocessor
from dynlm.data.synth import SynthConfig, generate
docs = [anonymize(d, max_chains=10)[0] for d in generate(SynthConfig(num_documents=30, seed=3))]
counts = {}
for d in docs:
    for s in d["sentences"]:
        for w in s:
            counts[w] = counts.get(w, 0) + 1
pre = Preprocessor.fit(counts, DataConfig(inputs=["x"], vocab_size=100, bpe_merges=200, max_chains=10))
blob = pre.to_json() + json.dumps([pre.encode_document(d["sentences"]) for d in docs])
print(hashlib.sha256(blob.encode()).hexdigest())
"""


def test_byte_identical_across_processes(processes):
    # different PYTHONHASHSEED and a fresh Rust hash state in each process
    digests = {
        processes.run([sys.executable, "-c", FIT_AND_PRINT], capture_output=True, text=True, timeout=120,
                      env={"PYTHONHASHSEED": str(seed), "PATH": ""}).stdout.strip()
        for seed in (1, 2)
    }
    assert len(digests) == 1 and len(next(iter(digests))) == 64
