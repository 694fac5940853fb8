"""Prepared folder: written by prepare_local, read back by PreparedData with pyarrow."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from dynlm.data.config import DataConfig
from dynlm.data.prepared import PreparedData, is_prepared
from dynlm.data.schema import ENCODED_SCHEMA, QUARANTINE_SCHEMA
from dynlm.data.split import SplitRuleError
from dynlm.data.synth import SynthConfig, write_conll
from dynlm.storage import is_uri
from dynlm.tasks.local import prepare_local


def test_prepare_local_and_read_back(tmp_path):
    write_conll(SynthConfig(num_documents=40, docs_per_file=20), tmp_path / "raw")
    (tmp_path / "raw" / "broken.conll").write_text("#begin document (broken); part 0\n\n#end document\n")
    cfg = DataConfig(inputs=[str(tmp_path / "raw")], output_root=str(tmp_path / "out"),
                     vocab_size=100, bpe_merges=50, max_chains=6, valid_fraction=0.2, test_fraction=0.2)
    data = prepare_local(cfg)
    assert data.root == tmp_path / "out" / cfg.data_hash()
    assert data.manifest["split_rule"] == "hash"
    assert data.manifest["config_hash"] == cfg.data_hash()
    counts = {split: data.num_documents(split) for split in ("train", "valid", "test")}
    assert sum(counts.values()) == 40 and min(counts.values()) > 0
    assert data.manifest["counts"]["documents"] == counts and data.manifest["counts"]["quarantined"] == 1
    assert data.manifest["task"] == "lm" and data.manifest["preprocessor_source"] == "fit on the train split"
    assert pq.read_schema(data.files("train")[0]).equals(ENCODED_SCHEMA)
    rows = list(data.iter_rows("valid"))
    assert len(rows) == counts["valid"]
    assert data.spec == data.preprocessor.spec and data.spec.num_entities == 6
    row = rows[0]
    assert row["num_tokens"] == len(row["word_ids"]) == len(row["entity_ids"]) == sum(row["sentence_lengths"])
    assert max(row["entity_ids"]) >= 2 and max(row["word_ids"]) < data.spec.output_size
    (bad,) = data.quarantine_rows()
    assert bad["doc_id"] == "broken/part_0" and bad["reason"].startswith("empty document")
    assert pq.read_schema(next((data.root / "quarantine").glob("*.parquet"))).equals(QUARANTINE_SCHEMA)
    with pytest.raises(KeyError, match="unknown split"):
        data.files("dev")
    # the uncompressed (in-memory Arrow) size of a split, what run.cache_train_split=auto compares
    train = pq.read_table(data.files("train")[0])
    assert data.split_bytes("train") == pq.ParquetFile(data.files("train")[0]).metadata.row_group(0).total_byte_size
    assert 0.5 * train.nbytes < data.split_bytes("train") < 2 * train.nbytes


def test_open_requires_manifest(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a prepared data folder"):
        PreparedData.open(tmp_path)


def test_open_a_uri_root_reads_through_the_filesystem(tmp_path):
    """A ``file://`` URI root (pyarrow's LocalFileSystem behind a URI, like s3:// or gs://)
    reads exactly what the local path reads; files() are URIs, usable by pyarrow and Ray Data."""
    write_conll(SynthConfig(num_documents=30, docs_per_file=10), tmp_path / "raw")
    (tmp_path / "raw" / "broken.conll").write_text("#begin document (broken); part 0\n\n#end document\n")
    cfg = DataConfig(inputs=[str(tmp_path / "raw")], output_root=str(tmp_path / "out"),
                     vocab_size=100, bpe_merges=50, max_chains=6, valid_fraction=0.2, test_fraction=0.2)
    local = prepare_local(cfg)
    uri = f"file://{local.root}/"  # a trailing slash is dropped
    assert is_uri(uri) and not is_uri(local.root)
    assert is_prepared(uri) and is_prepared(local.root) and not is_prepared(f"file://{tmp_path}")
    data = PreparedData.open(uri)
    assert data.root == uri.rstrip("/") and data.path == str(local.root)
    assert data.manifest == local.manifest and data.preprocessor.to_dict() == local.preprocessor.to_dict()
    for split in ("train", "valid", "test"):
        files = data.files(split)
        assert files == [f"{data.root}/{split}/{p.name}" for p in local.files(split)]
        assert pq.read_schema(files[0]).equals(ENCODED_SCHEMA)  # pyarrow resolves the URI itself
        assert list(data.iter_rows(split, batch_size=3)) == list(local.iter_rows(split))
        assert data.num_documents(split) == local.num_documents(split) > 0
        assert data.read_columns(split, ["doc_id"]).column("doc_id").to_pylist() == [
            row["doc_id"] for row in local.iter_rows(split)]
    assert data.quarantine_rows() == local.quarantine_rows() and len(data.quarantine_rows()) == 1
    assert data.shard_names() == local.shard_names() == [
        "quarantine/part-00000.parquet", "test/part-00000.parquet", "train/part-00000.parquet",
        "valid/part-00000.parquet"]
    assert data.read_bytes("preprocessor.json") == (local.root / "preprocessor.json").read_bytes()
    with pytest.raises(FileNotFoundError, match="not a prepared data folder"):
        PreparedData.open(f"file://{tmp_path}")


def _named_corpus(root):
    """``root/train``, ``root/dev`` (a valid split by name), ``root/test``: 4 documents each."""
    for seed, split in enumerate(("train", "dev", "test"), start=31):
        write_conll(SynthConfig(num_documents=4, seed=seed, docs_per_file=2), root / split)
    return root


def _settings(tmp_path, **changes):
    return dict(output_root=str(tmp_path / "out"), vocab_size=100, bpe_merges=20, max_chains=6, **changes)


def test_prepare_local_keeps_named_and_configured_splits(tmp_path):
    corpus = _named_corpus(tmp_path / "corpus")
    named = prepare_local(DataConfig(inputs=[str(corpus)], **_settings(tmp_path)))
    assert named.manifest["split_rule"] == "named"
    folders = {split: {row["source_file"].split("/")[-2] for row in named.iter_rows(split)}
               for split in ("train", "valid", "test")}
    assert folders == {"train": {"train"}, "valid": {"dev"}, "test": {"test"}}
    assert sum(named.manifest["counts"]["documents"].values()) \
        == 12 - named.manifest["counts"]["dropped_docs_too_many_chains"]

    splits = {"train": [str(corpus / "train"), str(corpus / "test")], "test": [str(corpus / "dev")]}
    configured = prepare_local(DataConfig(inputs=[str(corpus)], splits=splits, **_settings(tmp_path)))
    assert configured.manifest["split_rule"] == "config"
    assert configured.num_documents("valid") == 0
    assert {row["source_file"].split("/")[-2] for row in configured.iter_rows("test")} == {"dev"}
    assert configured.num_documents("train") == named.num_documents("train") + named.num_documents("test")


def test_prepare_local_rejects_mixed_inputs(tmp_path):
    corpus = _named_corpus(tmp_path / "corpus")
    write_conll(SynthConfig(num_documents=2, seed=40, docs_per_file=2), tmp_path / "more")
    cfg = DataConfig(inputs=[str(corpus), str(tmp_path / "more")], **_settings(tmp_path))
    with pytest.raises(SplitRuleError, match=r"name none \(.*more/synth_000.conll\)"):
        prepare_local(cfg)


def test_an_empty_train_split_is_one_clear_error_before_any_fitting(tmp_path):
    """One good document that the hash split puts outside train, and one malformed document:
    the error says how the documents were split and what to change (no BPE-fit traceback)."""
    from dynlm.data.prepared_writer import EmptyTrainSplit
    from dynlm.data.split import assign_split
    from dynlm.data.synth import generate

    docs = [d for d in generate(SynthConfig(num_documents=30, seed=9, docs_per_file=30))
            if assign_split(d["doc_id"], seed=0, valid_fraction=0.1, test_fraction=0.1) == "valid"]
    corpus = tmp_path / "raw"
    write_conll(SynthConfig(num_documents=30, seed=9, docs_per_file=30), corpus)
    text = (corpus / "synth_000.conll").read_text()
    keep = text.split("#begin document")[1 + int(docs[0]["doc_id"].rsplit("_", 1)[-1])]
    (corpus / "synth_000.conll").write_text("#begin document" + keep)
    (corpus / "broken.conll").write_text("#begin document (broken); part 0\nbroken 0 0 The\n\n#end document\n")
    cfg = DataConfig(inputs=[str(corpus)], output_root=str(tmp_path / "out"), vocab_size=50, bpe_merges=10, max_chains=6)
    with pytest.raises(EmptyTrainSplit, match=r"^no train document: the hash split rule put the 1 readable document\(s\) "
                                              r"in \{'train': 0, 'valid': 1, 'test': 0\} \(1 record\(s\) quarantined, 0 dropped\); "
                                              r"give more documents or lower valid_fraction=0.1, test_fraction=0.1$"):
        prepare_local(cfg)
    assert not (tmp_path / "out" / cfg.data_hash()).exists()
