"""Shards by a hash of the document id: written where the documents are, same bytes every time."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from dynlm.data import prepared_writer as writer
from dynlm.data.config import DataConfig
from dynlm.data.synth import SynthConfig, write_conll
from dynlm.tasks import get_task
from dynlm.tasks.local import files_table, prepare_in_memory, prepare_local


def test_a_documents_shard_is_a_hash_of_its_id_alone():
    ids = ["a", "b", "doc/part_0", "synth_00001/part_0"]
    assert writer.shard_indices(ids, 4).tolist() == [0, 1, 3, 0]  # sha1's first 8 bytes, mod 4
    assert writer.shard_indices(ids, 1000).tolist() == [108, 269, 683, 416]
    assert writer.shard_indices(ids, 1).tolist() == [0, 0, 0, 0]
    assert writer.shard_indices(reversed(ids), 4).tolist() == [0, 3, 1, 0]  # no dependence on the others


def test_shards_per_split_come_from_the_document_count():
    meta = pa.table({"kind": ["document"] * 600 + ["quarantine"] * 9 + ["document"],
                     "split": ["train"] * 513 + ["valid"] * 87 + [""] * 9 + ["test"]})
    assert writer.ROWS_PER_SHARD == 256
    assert writer.shards_per_split(meta) == {"train": 3, "valid": 1, "test": 1}  # ceil(513 / 256); at least 1


def test_many_shards_partition_each_split_sort_within_and_sum_to_the_whole(tmp_path, monkeypatch):
    """ROWS_PER_SHARD=4 on 40 documents: several shards per split. Each holds exactly the
    documents that hash to it, sorted by doc_id; together they are the split; the manifest's
    counts (summed per shard) equal those of the whole split tables; a second build is
    byte-identical."""
    monkeypatch.setattr(writer, "ROWS_PER_SHARD", 4)
    write_conll(SynthConfig(num_documents=40, docs_per_file=10), tmp_path / "raw")
    cfg = DataConfig(inputs=[str(tmp_path / "raw")], output_root=str(tmp_path / "out"), vocab_size=100,
                     bpe_merges=50, max_chains=6, valid_fraction=0.2, test_fraction=0.2)
    data = prepare_local(cfg, log=lambda _: None)
    task = get_task("lm")
    whole = prepare_in_memory(task, files_table(cfg.input_files()), cfg)
    shards = writer.shards_per_split(whole.parsed.drop_columns(list(task.payload_columns)))
    assert shards["train"] >= 5 and shards["valid"] >= 2
    for split, num_shards in shards.items():
        files = data.files(split)
        assert [f.name for f in files] == sorted(f.name for f in files) and len(files) <= num_shards
        ids_by_file = [pq.read_table(f, columns=["doc_id"])["doc_id"].to_pylist() for f in files]
        for path, ids in zip(files, ids_by_file):
            assert ids == sorted(ids) and ids
            assert set(writer.shard_indices(ids, num_shards).tolist()) == {int(path.stem.split("-")[1])}
        assert sorted(i for ids in ids_by_file for i in ids) == whole.tables[split]["doc_id"].to_pylist()
    meta = whole.parsed.drop_columns(list(task.payload_columns))
    assert data.manifest["counts"] == json.loads(json.dumps(
        task.summarize(meta, task.split_stats(whole.tables, whole.preprocessor.spec), whole.preprocessor)))
    again = prepare_local(cfg.replace(output_root=str(tmp_path / "again")), log=lambda _: None)
    assert again.shard_names() == data.shard_names()
    for name in data.shard_names():
        assert (again.root / name).read_bytes() == (data.root / name).read_bytes(), name


def test_an_empty_split_still_has_one_empty_shard(tmp_path):
    write_conll(SynthConfig(num_documents=6, docs_per_file=6), tmp_path / "raw")
    cfg = DataConfig(inputs=[str(tmp_path / "raw")], output_root=str(tmp_path / "out"), vocab_size=100,
                     bpe_merges=10, max_chains=6, valid_fraction=0.0, test_fraction=0.0)
    data = prepare_local(cfg, log=lambda _: None)
    for split in ("valid", "test"):
        (only,) = data.files(split)
        assert only.name == "part-00000.parquet" and pq.read_metadata(only).num_rows == 0
        assert data.manifest["counts"]["documents"][split] == 0
    assert data.manifest["counts"]["documents"]["train"] == data.num_documents("train") > 0
