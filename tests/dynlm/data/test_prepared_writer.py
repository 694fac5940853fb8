"""Shards of consecutive document ids: written from the blocks that hold them, same bytes every time."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from dynlm.data import prepared_writer as writer
from dynlm.data.config import DataConfig
from dynlm.data.synth import SynthConfig, write_conll
from dynlm.tasks import get_task
from dynlm.tasks.local import files_table, prepare_in_memory, prepare_local


def test_a_documents_shard_is_found_from_its_id_and_the_shards_first_ids():
    firsts = ["a", "doc/part_0", "synth_00001/part_0"]
    ids = ["a", "b", "doc/part_0", "doc/part_9", "synth_00001/part_0", "zz", ""]
    assert writer.shard_indices(ids, firsts).tolist() == [0, 0, 1, 1, 2, 2, 0]  # before the first: shard 0
    assert writer.shard_indices(reversed(ids), firsts).tolist() == [0, 2, 2, 1, 1, 0, 0]  # no dependence on the others
    assert writer.shard_indices(ids, [""]).tolist() == [0] * 7


def test_shard_boundaries_cut_each_split_in_doc_id_order_into_equal_runs():
    train = [f"d{i:04d}" for i in range(513)]
    meta = pa.table({"kind": ["document"] * 600 + ["quarantine"] * 9 + ["document"],
                     "doc_id": [*reversed(train), *[f"v{i:02d}" for i in range(87)], *[f"q{i}" for i in range(9)], "t"],
                     "split": ["train"] * 513 + ["valid"] * 87 + [""] * 9 + ["test"]})
    assert writer.ROWS_PER_SHARD == 256
    boundaries = writer.shard_boundaries(meta)
    assert boundaries == {"train": ["d0000", "d0171", "d0342"], "valid": ["v00"], "test": ["t"]}  # ceil(513 / 256)
    sizes = [int(n) for n in pa.array(writer.shard_indices(train, boundaries["train"])).value_counts().field("counts")]
    assert sorted(sizes) == [171, 171, 171]
    empty = writer.shard_boundaries(meta.filter(pa.array([s != "valid" for s in meta["split"].to_pylist()])))
    assert empty["valid"] == [""]  # one empty shard


def test_many_shards_partition_each_split_sort_within_and_sum_to_the_whole(tmp_path, monkeypatch):
    """ROWS_PER_SHARD=4 on 40 documents: several shards per split. Each holds exactly the
    documents whose ids fall in its run (shard_boundaries), sorted by doc_id; together they are the split; the manifest's
    counts (summed per shard) equal those of the whole split tables; a second build is
    byte-identical."""
    monkeypatch.setattr(writer, "ROWS_PER_SHARD", 4)
    write_conll(SynthConfig(num_documents=40, docs_per_file=10), tmp_path / "raw")
    cfg = DataConfig(inputs=[str(tmp_path / "raw")], output_root=str(tmp_path / "out"), vocab_size=100,
                     bpe_merges=50, max_chains=6, valid_fraction=0.2, test_fraction=0.2)
    data = prepare_local(cfg, log=lambda _: None)
    task = get_task("lm")
    whole = prepare_in_memory(task, files_table(cfg.input_files()), cfg)
    boundaries = writer.shard_boundaries(whole.parsed.drop_columns(list(task.payload_columns)))
    assert len(boundaries["train"]) >= 5 and len(boundaries["valid"]) >= 2
    for split, firsts in boundaries.items():
        files = data.files(split)
        assert [f.name for f in files] == [f"part-{k:05d}.parquet" for k in range(len(firsts))]
        ids_by_file = [pq.read_table(f, columns=["doc_id"])["doc_id"].to_pylist() for f in files]
        for path, ids, first in zip(files, ids_by_file, firsts):
            assert ids == sorted(ids) and ids and ids[0] == first
            assert set(writer.shard_indices(ids, firsts).tolist()) == {int(path.stem.split("-")[1])}
        assert max(map(len, ids_by_file)) - min(map(len, ids_by_file)) <= 1  # runs as equal as can be
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
