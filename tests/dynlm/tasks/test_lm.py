"""The LM task: the folder prepare_local writes holds exactly its stages' rows, and its
evaluation carries the accumulation analysis, counted here independently from the rows."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from dynlm.data.config import DataConfig
from dynlm.data.synth import SynthConfig, write_conll
from dynlm.models import rnn_lm_small
from dynlm.tasks import get_task
from dynlm.tasks.lm import ACCUMULATION_FIGURE
from dynlm.tasks.local import files_table, prepare_in_memory, prepare_local
from dynlm.training import TrainConfig, train_step

SETTINGS = dict(vocab_size=60, bpe_merges=40, max_chains=8)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    files = write_conll(SynthConfig(num_documents=24, seed=3, docs_per_file=6), root / "corpus")
    cfg = DataConfig(inputs=[str(root / "corpus")], output_root=str(root / "prepared"), **SETTINGS)
    return cfg, files, prepare_in_memory(get_task("lm"), files_table(files), cfg)


def test_the_written_folder_holds_the_lm_task_stages_rows(prepared):
    cfg, _files, in_memory = prepared
    local = prepare_local(cfg)
    assert in_memory.preprocessor.to_json() == local.preprocessor.to_json()
    for split in ("train", "valid", "test"):
        expected = sorted(local.iter_rows(split), key=lambda row: row["doc_id"])
        assert in_memory.splits[split] == expected and expected
    assert in_memory.rejected() == local.quarantine_rows() == []


def _reappearance_bins(rows) -> Counter:
    """Re-appearing entity tokens per bin of earlier mentions, counted with a plain loop."""
    bins: Counter = Counter()
    for row in rows:
        seen: Counter = Counter()
        for chain in row["entity_ids"]:
            if chain:
                before = seen[chain]
                if before:
                    bins["1" if before == 1 else "2" if before == 2 else "3_5" if before <= 5 else "6_plus"] += 1
                seen[chain] += 1
    return bins


def test_lm_task_evaluation_counts_the_accumulation_bins(prepared):
    _cfg, _files, in_memory = prepared
    task = get_task("lm")
    spec, rows = in_memory.preprocessor.spec, in_memory.splits["train"]
    torch.manual_seed(0)
    model = task.build_model(rnn_lm_small(embed_dim=16, hidden_dim=16, dropout=0.0), spec)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = train_step(task, model, task.collate(rows[:4], spec), optimizer, TrainConfig(bptt_tokens=0, bptt_sentences=4))
    assert step["tokens"] == sum(r["num_tokens"] - len(r["sentence_lengths"]) for r in rows[:4])

    metrics = task.evaluate(model, task.batches(rows, spec, 4, seed=None))
    bins = _reappearance_bins(rows)
    assert min(bins.values()) > 0  # the synthetic corpus re-mentions its people up to 6+ times
    for name in ("1", "2", "3_5", "6_plus"):
        assert metrics[f"count_reappearing_{name}"] == bins[name]
    assert sum(metrics[f"nll_sum_reappearing_{n}"] for n in ("1", "2", "3_5", "6_plus")) == pytest.approx(
        metrics["nll_sum_reappearing"], rel=1e-9)
    table = task.metric_table(metrics, "lm")
    assert f"  {'  6+ earlier mentions':<28}{bins['6_plus']:>10}" in table
    figures = task.metric_figures(metrics, "lm")
    assert list(figures) == [ACCUMULATION_FIGURE]
    assert [bar.get_height() for bar in figures[ACCUMULATION_FIGURE].axes[0].patches] == [
        metrics[f"ppl_reappearing_{n}"] for n in ("1", "2", "3_5", "6_plus")]


def test_the_prepare_table_shows_drops_only_when_there_are_some(prepared):
    _cfg, _files, in_memory = prepared
    task = get_task("lm")
    meta = in_memory.parsed.drop_columns(list(task.payload_columns))
    counts = task.summarize(meta, task.split_stats(in_memory.tables, in_memory.preprocessor.spec), in_memory.preprocessor)
    labels = [label for label, _ in task.summary_lines({**counts, **{k: 0 for k in
                                                         ("dropped_nested", "dropped_overlapping",
                                                          "dropped_docs_too_many_chains", "truncated_chains")}})]
    assert labels == ["chains", "anonymized mentions", "dropped or truncated", "quarantined records",
                      "OOV rate (valid)", "subwords per word"]
    rows = dict(task.summary_lines({**counts, "dropped_nested": 2, "truncated_chains": 0}))
    assert rows["dropped nested mentions"] == "2" and "truncated chains" not in rows and "dropped or truncated" not in rows
    assert counts["documents"] == {s: len(in_memory.splits[s]) for s in ("train", "valid", "test")}


@pytest.mark.parametrize("bptt_tokens, model_type, pack", [(0, "rnn", False), (30, "rnn", False), (30, "dntm", False),
                                                           (30, "rnn", True), (30, "dntm", True)])
def test_steps_per_epoch_counts_the_steps_the_batches_take(prepared, bptt_tokens, model_type, pack):
    """The cosine schedule's length, read from the Parquet metadata only, is the number of
    optimizer steps the epoch's batches take, in either layout (chunks: one step each)."""
    cfg, _files, _in_memory = prepared
    local = prepare_local(cfg)
    task = get_task("lm")
    train_cfg = TrainConfig(batch_size=4, bptt_tokens=bptt_tokens, pack_documents=pack)
    layout = task.batch_layout(train_cfg, rnn_lm_small(type=model_type))
    assert layout is None or layout.pack_documents == pack
    assert (layout is None) == (bptt_tokens == 0)
    assert layout is None or layout.whole_sentences == (model_type == "dntm")
    rows = list(local.iter_rows("train"))
    estimate = task.steps_per_epoch(local, train_cfg, 1, layout=layout)

    def steps(seed):
        batches = list(task.batches(rows, local.spec, 4, seed=seed, layout=layout))
        assert all(batch.layout == layout for batch in batches)
        if layout is not None:
            assert sum(task.steps_per_batch(b, train_cfg) for b in batches) == sum(len(b.sentences) for b in batches)
        return sum(task.steps_per_batch(batch, train_cfg) for batch in batches)

    if pack:  # packed groups: the same steps in any order
        assert estimate == steps(1)
    else:  # sorted by size: exact for the exact sort; a training epoch's jittered sizes
        # (batching.SIZE_JITTER) mix neighbouring sizes and may take a few more steps
        assert estimate == steps(None)
        assert 0.9 * estimate <= steps(1) <= 1.15 * estimate


@pytest.mark.parametrize("model_type", ["rnn", "dntm", "dynamical"])
def test_evaluation_reads_a_dynamical_lm_in_segments_as_documents_read_alone(model_type, tiny_spec, random_rows):
    """The evaluation layout: chunks of one segment for the meta-learned LM, whose metrics on a
    batch of documents are then those of each document read alone (in lockstep, where padded
    columns count towards a segment, they are not); None for the others."""
    from dynlm.data.batching import ChunkLayout
    from dynlm.models import build_model
    from dynlm.models.dynamical_lm import dynamical_lm_small

    task = get_task("lm")
    cfg = dynamical_lm_small(embed_dim=16, hidden_dim=16, dynamical={"segment_len": 5}) if model_type == "dynamical" \
        else rnn_lm_small(type=model_type, embed_dim=16, hidden_dim=16)
    layout = task.evaluation_layout(cfg)
    if model_type != "dynamical":
        assert layout is None
        return
    assert layout == ChunkLayout(5)
    torch.manual_seed(0)
    model = build_model(cfg, tiny_spec).double()  # float64: the differences below are not rounding
    rows = random_rows(7, seed=4, max_sentences=6)  # ragged sentences of 1..8 tokens: segments cross them
    batched = task.evaluate(model, task.batches(rows, tiny_spec, 3, seed=None, layout=layout))
    alone = task.evaluate(model, task.batches(rows, tiny_spec, 1, seed=None, layout=layout))
    lockstep = task.evaluate(model, task.batches(rows, tiny_spec, 3, seed=None))
    assert batched.keys() == alone.keys()
    for key, value in alone.items():
        assert batched[key] == pytest.approx(value, rel=1e-12, nan_ok=True), key
    assert abs(lockstep["ppl"] / alone["ppl"] - 1) > 1e-6
