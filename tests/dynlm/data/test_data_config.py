"""DataConfig validation and hash; hash-based split."""

from __future__ import annotations

from collections import Counter

import pytest

from dynlm.config import ConfigError
from dynlm.data.config import DataConfig
from dynlm.data.split import assign_split


@pytest.fixture
def two_files(tmp_path):
    (tmp_path / "a.conll").write_text("a")
    (tmp_path / "b.conll").write_text("b")
    return str(tmp_path / "a.conll"), str(tmp_path / "b.conll")


def test_data_hash_ignores_location_and_parallelism(two_files):
    a, b = two_files
    cfg = DataConfig(inputs=[a])
    assert cfg.data_hash() == cfg.replace(output_root="/elsewhere", num_encode_actors=8).data_hash()
    assert cfg.data_hash() != cfg.replace(bpe_merges=10).data_hash()
    assert cfg.data_hash() != cfg.replace(max_sentence_tokens=60).data_hash()
    assert cfg.data_hash() != cfg.replace(max_document_sentences=24).data_hash()
    assert cfg.data_hash() != cfg.replace(inputs=[b]).data_hash()


def test_data_hash_of_a_missing_input_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="'nowhere.conll' does not exist"):
        DataConfig(inputs=["nowhere.conll"]).data_hash()


@pytest.mark.parametrize("bad, message", [
    ({"gamma": 1.5}, r"^gamma: must be in \[0, 1\], got 1.5$"),
    ({"valid_fraction": 0.6, "test_fraction": 0.5}, r"^valid_fraction \+ test_fraction must be < 1 .* 0.6 \+ 0.5$"),
    ({"bpe_merges": -1}, r"^bpe_merges: must be >= 0, got -1$"),
    ({"max_sentence_tokens": -1}, r"^max_sentence_tokens: must be >= 0 \(0: off\), got -1$"),
    ({"max_document_sentences": -3}, r"^max_document_sentences: must be >= 0 \(0: off\), got -3$"),
    ({"max_document_sentences": "all"}, r"max_document_sentences"),
    ({"inputs": []}, r"^inputs: at least one input path is required$"),
    ({"too_many_chains": "keep"}, r"^too_many_chains: 'keep' is not one of \['drop', 'truncate'\]$"),
    ({"vocab_sise": 3}, r"^DataConfig: unknown key 'vocab_sise'; known keys: \[.*'vocab_size'\]$"),
])
def test_invalid_values_name_the_key(bad, message):
    with pytest.raises(ConfigError, match=message):
        DataConfig.from_dict({"inputs": ["x"], **bad})


def test_split_is_deterministic_and_roughly_proportional():
    ids = [f"doc{i}" for i in range(2000)]
    splits = [assign_split(d, seed=0, valid_fraction=0.1, test_fraction=0.2) for d in ids]
    assert splits == [assign_split(d, seed=0, valid_fraction=0.1, test_fraction=0.2) for d in ids]
    counts = Counter(splits)
    assert 150 < counts["valid"] < 250 and 330 < counts["test"] < 470
    assert splits != [assign_split(d, seed=1, valid_fraction=0.1, test_fraction=0.2) for d in ids]
    assert assign_split("x", seed=0, valid_fraction=0, test_fraction=0) == "train"


def test_encoding_hash_is_the_data_hash_without_gamma(two_files):
    cfg = DataConfig(inputs=[two_files[0]], gamma=0.9)
    other = cfg.replace(gamma=0.55)
    assert cfg.data_hash() != other.data_hash()  # its own folder (its own short list) ...
    assert cfg.encoding_hash() == other.encoding_hash()  # ... sharing the encoded shards
    assert cfg.encoding_hash() != cfg.replace(bpe_merges=10).encoding_hash()
    assert cfg.encoding_hash() == cfg.replace(output_root="/elsewhere").encoding_hash()
