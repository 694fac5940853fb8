"""The Ray Data preprocessing job on real Ray (the session's local cluster) and real Parquet.

Each prepare() build is a few Ray Data jobs (seconds each on 2 cores), so the tests share builds:
one synthetic corpus (with a malformed file) built twice (API, then CLI into another root),
then once more per URI output root (file://, and s3:// on a local moto server when installed).
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dynlm.data.anonymize import anonymize
from dynlm.data.batch_encoder import encode_documents
from dynlm.data.config import DataConfig
from dynlm.data.parse_stage import parse_files
from dynlm.data.plaintext import is_title_heading
from dynlm.data.prepared import PreparedData
from dynlm.data.prepared_writer import SPLITS, format_summary
from dynlm.data.preprocessor import Preprocessor
from dynlm.data.schema import DOCUMENT_SCHEMA, ENCODED_SCHEMA, QUARANTINE_SCHEMA
from dynlm.data.split import SplitRuleError, assign_split, check_split_rule
from dynlm.data.synth import SynthConfig, generate, write_conll
from dynlm.tasks import get_task
from dynlm.tasks.local import prepare_local
from pipelines.cli import main
from pipelines.prepare import QuarantineError, prepare
from pipelines.ray_env import init_ray

SYNTH = SynthConfig(num_documents=40, seed=3, docs_per_file=10)
BROKEN = "#begin document (broken); part 0\nbroken 0 0 The\n\n#end document\n"
SETTINGS = {"bpe_merges": 40, "vocab_size": 60, "max_chains": 8, "num_encode_actors": 2}


def _shard_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.parquet"))}


def test_encode_documents_equals_encode_document_per_document():
    """The vectorized batch encoder gives exactly Preprocessor.encode_document's rows (no Ray)."""
    cfg = DataConfig(inputs=["unused"], vocab_size=4, gamma=0.5, bpe_merges=3, max_chains=3)
    preprocessor = Preprocessor.fit({"the": 9, "cat": 7, "sat": 5, "on": 4, "mat": 3, "über": 2}, cfg)
    documents = [
        [["the", "cat", "<unk1>", "sat"], ["on", "the", "mat", "qx"]],
        [],  # no sentence
        [[], ["<unk3>", "<unk1>", "über"]],  # an empty sentence
        [["zzz"]],
    ]
    columns = encode_documents(preprocessor, pa.chunked_array([pa.array(documents, pa.list_(pa.list_(pa.string())))]))
    assert set(columns) == set(ENCODED_SCHEMA.names) - {"doc_id", "source_file"}
    for index, sentences in enumerate(documents):
        assert {k: v[index].as_py() for k, v in columns.items()} == preprocessor.encode_document(sentences)
    assert columns["num_tokens"].to_pylist() == [12, 0, 7, 3]
    with pytest.raises(ValueError, match="beyond max_chains=3"):
        encode_documents(preprocessor, pa.array([[["<unk4>"]]], pa.list_(pa.list_(pa.string()))))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The synthetic corpus written by `dynlm data synth`, plus one malformed CoNLL file."""
    folder = tmp_path_factory.mktemp("corpus")
    assert main(["data", "synth", "--out", str(folder), "--num-documents", str(SYNTH.num_documents),
                 "--seed", str(SYNTH.seed), "--docs-per-file", str(SYNTH.docs_per_file)]) == 0
    reference = write_conll(SYNTH, tmp_path_factory.mktemp("reference"))
    assert [p.read_bytes() for p in reference] == [(folder / p.name).read_bytes() for p in reference]
    (folder / "broken.conll").write_text(BROKEN)
    last = reference[-1].name  # one gzipped file: Ray Data gunzips *.gz while reading, the reader too
    (folder / f"{last}.gz").write_bytes(gzip.compress((folder / last).read_bytes()))
    (folder / last).unlink()
    return folder


@pytest.fixture(scope="module")
def built(ray_session, corpus, tmp_path_factory) -> PreparedData:
    cfg = DataConfig(inputs=[str(corpus)], output_root=str(tmp_path_factory.mktemp("prepared_a")), **SETTINGS)
    return prepare(cfg, progress=False)


def test_prepare_counts_and_rows_match_the_library(built, corpus):
    cfg = DataConfig.from_dict(built.manifest["config"])
    counts = built.manifest["counts"]
    assert built.root.name == cfg.data_hash() == built.manifest["config_hash"]

    # The expected documents: the library's own pipeline, document by document.
    expected = {}
    for doc in generate(SYNTH):
        source = corpus / doc["source_file"]
        doc = dict(doc, source_file=str(source if source.exists() else f"{source}.gz"))
        anonymized, _ = anonymize(doc, max_chains=cfg.max_chains, min_chain_mentions=cfg.min_chain_mentions)
        if anonymized is not None:
            expected[doc["doc_id"]] = anonymized
    assert sum(counts["documents"].values()) == len(expected) == SYNTH.num_documents - counts["dropped_docs"]
    assert counts["chains"] > 0 and counts["anonymized_mentions"] >= 2 * counts["chains"]

    seen = {}
    for split in SPLITS:
        files = built.files(split)
        assert [f.name for f in files] == ["part-00000.parquet"]
        assert pq.read_schema(files[0]).remove_metadata() == ENCODED_SCHEMA
        rows = list(built.iter_rows(split))
        assert [r["doc_id"] for r in rows] == sorted(r["doc_id"] for r in rows)
        assert len(rows) == counts["documents"][split] == built.num_documents(split)
        want = [expected[r["doc_id"]] for r in rows]
        assert counts["sentences"][split] == sum(len(d["sentences"]) for d in want)
        assert counts["tokens"][split] == sum(len(s) for d in want for s in d["sentences"])
        for row, doc in zip(rows, want):
            assert assign_split(row["doc_id"], seed=cfg.split_seed, valid_fraction=cfg.valid_fraction,
                                test_fraction=cfg.test_fraction) == split
            assert row["source_file"] == doc["source_file"]
            encoded = built.preprocessor.encode_document(doc["sentences"])
            assert {k: row[k] for k in encoded} == encoded
            seen[row["doc_id"]] = split
    assert set(seen) == set(expected)
    assert any(d["source_file"].endswith(".conll.gz") for d in expected.values())
    assert set(seen.values()) == set(SPLITS)  # 40 documents: every split has some
    assert 0.0 < counts["oov_rate_valid"] < 1.0  # vocab_size=60 leaves valid words out
    assert counts["subwords_per_word"] > 1.0
    assert init_ray() == "existing"  # the session's Ray was reused
    assert built.manifest["split_rule"] == "hash"  # an unsplit folder
    summary = format_summary(get_task("lm"), counts, "hash")
    assert summary.splitlines()[0] == f"{'split rule':32s}hash: unsplit inputs, a hash of each document id (valid/test_fraction)"
    assert f"{'documents':32s}" + "".join(f"{counts['documents'][s]:>12,d}" for s in SPLITS) in summary
    assert f"{'quarantined records':32s}{1:>12,d}" in summary


def test_the_ray_free_path_writes_the_same_folder(built, tmp_path, capsys):
    """prepare_local runs the same stage functions in this process: same key, same bytes."""
    cfg = DataConfig.from_dict(built.manifest["config"]).replace(output_root=str(tmp_path / "local"))
    local = prepare_local(cfg)
    assert local.root.name == built.root.name
    assert _shard_bytes(local.root) == _shard_bytes(built.root)
    assert (local.root / "preprocessor.json").read_bytes() == (built.root / "preprocessor.json").read_bytes()
    for key in ("task", "counts", "files", "inputs", "split_rule", "config_hash", "preprocessor_source"):
        assert local.manifest[key] == built.manifest[key], key


def test_many_shards_are_written_by_the_workers_as_the_ray_free_path_writes_them(ray_session, corpus, tmp_path,
                                                                                monkeypatch):
    """Four documents a shard on average (``ROWS_PER_SHARD``, read by the driver): the Ray job's
    workers write several shards per split, each a run of consecutive doc ids, and the folder
    is byte-identical to the in-process path's."""
    from dynlm.data import prepared_writer

    monkeypatch.setattr(prepared_writer, "ROWS_PER_SHARD", 4)
    cfg = DataConfig(inputs=[str(corpus)], output_root=str(tmp_path / "ray"), **SETTINGS)
    built = prepare(cfg, progress=False)
    local = prepare_local(cfg.replace(output_root=str(tmp_path / "local")), log=lambda _: None)
    assert len(built.files("train")) >= 4  # 24 train documents, 4 a shard on average
    assert _shard_bytes(built.root) == _shard_bytes(local.root)
    assert built.manifest["counts"] == local.manifest["counts"] and built.manifest["files"] == local.manifest["files"]
    documents = sum(built.manifest["counts"]["documents"].values())
    assert sum(built.num_documents(split) for split in SPLITS) == documents == SYNTH.num_documents - \
        built.manifest["counts"]["dropped_docs"]


def test_a_given_preprocessor_encodes_new_documents_with_its_ids(built, tmp_path, capsys):
    """New documents (Parquet DOCUMENT_SCHEMA rows, as a retrain gets them) encoded with an
    existing preprocessor: one parameter of the one job; the folder key names the preprocessor."""
    docs = [d for d in generate(SynthConfig(num_documents=12, seed=77, docs_per_file=12))]
    folder = tmp_path / "new"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(docs, schema=DOCUMENT_SCHEMA), folder / "part-0.parquet")
    cfg = DataConfig.from_dict(built.manifest["config"]).replace(inputs=[str(folder)],
                                                                output_root=str(tmp_path / "out"))
    given = prepare(cfg, preprocessor=built.preprocessor, progress=False)
    assert given.root.name.startswith(f"{cfg.data_hash()}-p") and given.manifest["preprocessor_source"] == "given"
    assert (given.root / "preprocessor.json").read_bytes() == (built.root / "preprocessor.json").read_bytes()
    rows = {r["doc_id"]: r for split in SPLITS for r in given.iter_rows(split)}
    assert len(rows) == sum(given.manifest["counts"]["documents"].values()) > 0
    for doc in docs:
        anonymized, _ = anonymize(doc, max_chains=cfg.max_chains, min_chain_mentions=cfg.min_chain_mentions)
        if anonymized is not None:
            encoded = built.preprocessor.encode_document(anonymized["sentences"])
            assert {k: rows[doc["doc_id"]][k] for k in encoded} == encoded
            assert rows[doc["doc_id"]]["source_file"] == doc["source_file"]  # the row's own, not the Parquet file
    refit = prepare(cfg, progress=False)  # without it: fitted on these documents, another folder
    assert refit.root.name == cfg.data_hash() and refit.manifest["preprocessor_source"] == "fit on the train split"


def test_malformed_file_is_quarantined_and_strict_raises(built, corpus, capsys):
    rows = built.quarantine_rows()
    assert rows == [{"source_file": str(corpus / "broken.conll"), "doc_id": "broken/part_0", "line": 2,
                     "reason": "wrong column count: 4 columns, at least 12 expected"}]
    assert built.manifest["counts"]["quarantined"] == 1
    assert pq.read_schema(built.root / "quarantine" / "part-00000.parquet").remove_metadata() == QUARANTINE_SCHEMA

    cfg = DataConfig.from_dict(built.manifest["config"])
    with pytest.raises(QuarantineError, match="1 input record.*broken.conll:2 'broken/part_0': wrong column count") as info:
        prepare(cfg, strict=True, progress=False)
    assert info.value.counts["quarantined"] == 1


def test_second_call_reuses_the_folder(built, capsys):
    cfg = DataConfig.from_dict(built.manifest["config"])
    manifest = built.root / "manifest.json"
    before = (built.root.stat().st_mtime_ns, manifest.stat().st_mtime_ns, _shard_bytes(built.root))
    started = time.perf_counter()
    again = prepare(cfg.replace(num_encode_actors=1), progress=False)  # not part of the hash
    assert time.perf_counter() - started < 5.0
    assert again.root == built.root
    assert "reusing" in capsys.readouterr().out
    assert (built.root.stat().st_mtime_ns, manifest.stat().st_mtime_ns, _shard_bytes(built.root)) == before
    assert not list(built.root.parent.glob(".tmp-*"))


def test_a_gamma_only_change_shares_the_shards_and_equals_a_full_build(built, tmp_path, capsys):
    cfg = DataConfig.from_dict(built.manifest["config"]).replace(gamma=0.55)
    started = time.perf_counter()
    derived = prepare(cfg, progress=False)
    assert time.perf_counter() - started < 5.0  # no Ray Data job
    assert "only in its preprocessor: sharing its shards" in capsys.readouterr().out
    assert derived.root.name == cfg.data_hash() != built.root.name
    assert derived.manifest["derived_from"] == built.root.name
    for name in _shard_bytes(built.root):  # the same files, hard-linked
        assert (derived.root / name).stat().st_ino == (built.root / name).stat().st_ino
    assert derived.spec.shortlist_size < built.spec.shortlist_size
    assert derived.spec.replace(shortlist_size=built.spec.shortlist_size) == built.spec

    full = prepare(cfg.replace(output_root=str(tmp_path / "full")), progress=False)  # no sibling there
    assert "derived_from" not in full.manifest
    assert _shard_bytes(full.root) == _shard_bytes(derived.root)
    assert (full.root / "preprocessor.json").read_bytes() == (derived.root / "preprocessor.json").read_bytes()
    for key in ("config_hash", "encoding_hash", "counts", "files", "splits"):
        assert full.manifest[key] == derived.manifest[key], key
    assert full.manifest["config"] == {**derived.manifest["config"], "output_root": str(tmp_path / "full")}


def test_cli_build_into_another_root_is_byte_identical(built, corpus, tmp_path, capsys):
    args = ["prepare", "--input", str(corpus), "--output-root", str(tmp_path / "prepared_b"), "--no-progress"]
    args += [arg for key, value in SETTINGS.items() if key != "num_encode_actors" for arg in ("--set", f"{key}={value}")]
    assert main(args + ["--set", "num_encode_actors=1"]) == 0
    other = tmp_path / "prepared_b" / built.root.name
    assert f"prepared data: {other}" in capsys.readouterr().out
    assert _shard_bytes(other) == _shard_bytes(built.root)
    assert (other / "preprocessor.json").read_bytes() == (built.root / "preprocessor.json").read_bytes()
    assert json.loads((other / "manifest.json").read_text())["counts"] == built.manifest["counts"]
    # --strict on the (reused) folder: quarantine -> exit code 2
    assert main(args + ["--strict"]) == 2
    assert "quarantined (strict mode)" in capsys.readouterr().err


def test_litbank(ray_session, litbank_dir, tmp_path):
    cfg = DataConfig(inputs=[str(litbank_dir)], output_root=str(tmp_path), bpe_merges=200, vocab_size=5000)
    prepared = prepare(cfg, progress=False)
    counts = prepared.manifest["counts"]
    num_files = len(list(litbank_dir.glob("*.conll")))
    assert counts["input_files"] == num_files
    assert sum(counts["documents"].values()) + counts["dropped_docs"] + counts["quarantined"] >= num_files
    assert min(counts["documents"].values()) > 0
    assert counts["chains"] > 100 and counts["anonymized_mentions"] > counts["chains"]
    assert 0.0 < counts["oov_rate_valid"] < 0.5
    assert prepared.spec.num_words == 5000 + 4 and prepared.spec.num_entities == cfg.max_chains
    row = next(prepared.iter_rows("valid"))
    assert len(row["word_ids"]) == row["num_tokens"] == sum(row["sentence_lengths"])
    assert max(row["entity_ids"]) <= cfg.max_chains and max(row["entity_ids"]) > 0


# ---------------------------------------------------------------------------------------------
# Official splits: inputs that name their split (train/ valid/ test/), or data.splits
# ---------------------------------------------------------------------------------------------

NAMED = {"train": (21, 8), "valid": (22, 4), "test": (23, 4)}  # split -> (synth seed, documents)


@pytest.fixture(scope="module")
def named_corpus(tmp_path_factory) -> Path:
    """``corpus/train/``, ``corpus/valid/``, ``corpus/test/``: synthetic documents (other seeds,
    so other doc ids) written by `dynlm data synth`; the folder names give the split."""
    folder = tmp_path_factory.mktemp("named")
    for split, (seed, num_documents) in NAMED.items():
        assert main(["data", "synth", "--out", str(folder / split), "--num-documents", str(num_documents),
                     "--seed", str(seed), "--docs-per-file", "2"]) == 0
    return folder


def _doc_ids_by_split(prepared: PreparedData) -> dict[str, set[str]]:
    return {split: {row["doc_id"] for row in prepared.iter_rows(split)} for split in SPLITS}


def test_named_folders_keep_their_split(ray_session, named_corpus, tmp_path, capsys):
    cfg = DataConfig(inputs=[str(named_corpus)], output_root=str(tmp_path), **SETTINGS)
    prepared = prepare(cfg, progress=False)
    assert prepared.manifest["split_rule"] == "named"
    assert f"{'split rule':32s}named: the split each input's file/folder names" in capsys.readouterr().out
    expected = {split: {f"synth_{seed}_{i:05d}/part_0" for i in range(n)} for split, (seed, n) in NAMED.items()}
    dropped = prepared.manifest["counts"]["dropped_docs"]
    got = _doc_ids_by_split(prepared)
    assert all(got[split] <= expected[split] for split in SPLITS)  # every document in its folder's split
    assert sum(map(len, got.values())) == sum(n for _, n in NAMED.values()) - dropped
    assert min(map(len, got.values())) > 0
    for split in SPLITS:
        assert all(Path(row["source_file"]).parent.name == split for row in prepared.iter_rows(split))
        assert prepared.manifest["counts"]["documents"][split] == len(got[split])


def test_config_splits_win_over_names_through_the_cli(ray_session, named_corpus, tmp_path, capsys):
    """``data.splits`` in a YAML config: valid/ and test/ swapped on purpose, so the listed
    split (not the folder name) is what the documents keep."""
    config = tmp_path / "data.yaml"
    config.write_text(json.dumps({"data": {
        "inputs": [str(named_corpus)], "output_root": str(tmp_path / "out"), **SETTINGS,
        "splits": {"train": [str(named_corpus / "train")], "valid": [str(named_corpus / "test")],
                   "test": [str(named_corpus / "valid")]}}}))
    assert main(["prepare", "--config", str(config), "--no-progress"]) == 0
    assert f"{'split rule':32s}config: the input paths listed in data.splits" in capsys.readouterr().out
    (root,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    prepared = PreparedData.open(root)
    assert prepared.manifest["split_rule"] == "config"
    by_folder = {split: {Path(row["source_file"]).parent.name for row in prepared.iter_rows(split)}
                 for split in SPLITS}
    assert by_folder == {"train": {"train"}, "valid": {"test"}, "test": {"valid"}}


def test_mixed_named_and_unnamed_inputs_fail_before_writing(ray_session, named_corpus, tmp_path, capsys):
    """Through the CLI: one line on stderr (what to do), exit code 2, nothing written."""
    extra = tmp_path / "extra"
    write_conll(SynthConfig(num_documents=2, seed=24, docs_per_file=2), extra)
    args = ["prepare", "--input", str(named_corpus), "--input", str(extra), "--output-root", str(tmp_path / "out"),
            "--no-progress", "--set", "bpe_merges=10"]
    assert main(args) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("dynlm: error:")]
    assert line.startswith("dynlm: error: the inputs mix files whose path names their split (e.g. ")
    assert f"name none ({extra}/synth_000.conll)" in line and "Pass only the named files" in line
    assert not [p for p in (tmp_path / "out").iterdir() if p.is_dir()]  # nothing published, no temporary folder


def _title_headings(data: bytes) -> int:
    return sum(is_title_heading(line) for line in gzip.decompress(data).decode("utf-8").splitlines())


def test_wikitext2_documents_keep_the_official_split(wikitext_dir):
    """The parse stage on the real WikiText-2 files (no Ray: the Ray job runs this function per
    file): each file's documents keep its split, one per `` = Title = `` article."""
    files = {split: wikitext_dir / f"{split}.txt.gz" for split in SPLITS}
    cfg = DataConfig(inputs=[str(f) for f in files.values()], format="text", max_chains=1, bpe_merges=0)
    batch = pa.table({"bytes": [f.read_bytes() for f in files.values()], "path": [str(f) for f in files.values()]})
    parsed = parse_files(batch, cfg.to_dict())
    assert set(parsed["kind"].to_pylist()) == {"document"}
    splits = parsed["split"].to_pylist()
    per_file = {split: _title_headings(f.read_bytes()) for split, f in files.items()}
    assert per_file["train"] == 629  # (tests/dynlm/data/test_plaintext.py reads the same)
    assert {split: splits.count(split) for split in SPLITS} == per_file
    assert check_split_rule(parsed["source_file"].to_pylist(), cfg.inputs, {}, splits) == "named"
    # the whole folder holds README.pytorch-examples and SOURCE.md too: named + unnamed = an error
    listed = sorted(str(p) for p in wikitext_dir.iterdir())
    with pytest.raises(SplitRuleError, match="README.pytorch-examples, .*SOURCE.md"):
        check_split_rule(listed, [str(wikitext_dir)], {}, ["train", "valid", "test"])


# ---------------------------------------------------------------------------------------------
# Output to a filesystem URI: file:// (pyarrow's LocalFileSystem) and s3:// (a local moto server)
# ---------------------------------------------------------------------------------------------


def _uri_bytes(prepared: PreparedData) -> dict[str, bytes]:
    """Shards of a (URI) prepared folder, read through its filesystem: {"train/part-00000.parquet": bytes}."""
    return {name: prepared.read_bytes(name) for name in prepared.shard_names()}


def _check_uri_output(built: PreparedData, output_root: str, capsys) -> PreparedData:
    """Build into ``output_root`` (a URI): byte-identical to the local build, reused, and a
    gamma-only change derived from it inside the store."""
    cfg = DataConfig.from_dict(built.manifest["config"]).replace(output_root=output_root)
    capsys.readouterr()
    remote = prepare(cfg, progress=False)
    assert f"prepare: wrote {output_root}/{built.root.name}" in capsys.readouterr().out
    assert remote.root == f"{output_root}/{built.root.name}" and isinstance(remote.root, str)
    assert all(f.startswith(f"{remote.root}/train/") for f in remote.files("train"))
    assert _uri_bytes(remote) == _shard_bytes(built.root)
    assert remote.read_bytes("preprocessor.json") == (built.root / "preprocessor.json").read_bytes()
    for key in ("config_hash", "encoding_hash", "counts", "files", "splits"):
        assert remote.manifest[key] == built.manifest[key], key
    assert remote.quarantine_rows() == built.quarantine_rows()
    assert list(remote.iter_rows("valid")) == list(built.iter_rows("valid"))

    again = prepare(cfg.replace(num_encode_actors=1), progress=False)
    assert again.root == remote.root and again.manifest == remote.manifest
    assert "reusing" in capsys.readouterr().out
    with pytest.raises(QuarantineError, match=f"see {remote.root}/quarantine"):
        prepare(cfg, strict=True, progress=False)

    derived = prepare(cfg.replace(gamma=0.55), progress=False)
    assert set(derived.manifest["timings_s"]) == {"derive_from_sibling", "build"}  # no Ray Data job
    assert "only in its preprocessor: sharing its shards" in capsys.readouterr().out
    assert derived.root == f"{output_root}/{cfg.replace(gamma=0.55).data_hash()}"
    assert derived.manifest["derived_from"] == built.root.name
    assert _uri_bytes(derived) == _uri_bytes(remote)
    assert derived.preprocessor.to_dict() == built.preprocessor.with_gamma(0.55).to_dict()
    assert derived.spec.shortlist_size < remote.spec.shortlist_size
    return remote


def test_prepare_into_a_file_uri(built, tmp_path, capsys):
    remote = _check_uri_output(built, f"file://{tmp_path}/prepared", capsys)
    assert not list(tmp_path.glob("prepared/.*"))  # no lock or temporary folder in the store
    from pipelines.train import read_split

    # what train.build_trainer does: Ray Data reads the URIs, the filesystem travels with them
    read = read_split(remote, "train")
    assert read.count() == remote.num_documents("train") == built.num_documents("train")


def test_prepare_into_s3(built, s3_bucket, capsys):
    remote = _check_uri_output(built, s3_bucket, capsys)
    assert remote.filesystem.type_name == "s3"
