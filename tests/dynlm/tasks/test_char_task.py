"""A new task through the Task interface, Ray-free: parse -> fit -> encode -> collate -> model -> loss -> metrics."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from char_task import CharDataConfig, CharMetrics, CharModelConfig, CharTask  # this folder (pytest rootdir import)

from dynlm.data.readers import parse_file
from dynlm.data.sequences import EOS
from dynlm.data.split import assign_split
from dynlm.data.synth import SynthConfig, write_conll
from dynlm.tasks import TASKS, Task, get_task
from dynlm.tasks.local import files_table, prepare_in_memory
from dynlm.training import TrainConfig, train_step


@pytest.fixture(scope="module")
def synth_files(tmp_path_factory):
    return write_conll(SynthConfig(num_documents=20, seed=5, docs_per_file=5), tmp_path_factory.mktemp("synth"))


def _documents(files) -> list[dict]:
    return [doc for path in files for doc in parse_file(path.read_bytes(), str(path), "conll")]


def test_char_task_stages_give_the_expected_records(synth_files, monkeypatch):
    monkeypatch.setitem(TASKS, "char", CharTask)  # registering a task is one dict entry
    task = get_task("char")
    cfg = CharDataConfig(inputs=[str(p) for p in synth_files], max_chars=30)
    prepared = prepare_in_memory(task, files_table(synth_files), cfg)

    texts = {d["doc_id"]: "\n".join(" ".join(s) for s in d["sentences"]) for d in _documents(synth_files)}
    split_of = {doc_id: assign_split(doc_id, seed=0, valid_fraction=0.2, test_fraction=0.2) for doc_id in texts}
    for split, rows in prepared.splits.items():
        assert [r["doc_id"] for r in rows] == sorted(d for d, s in split_of.items() if s == split)
    assert all(prepared.splits[s] for s in ("train", "valid", "test")) and prepared.rejected() == []

    train_chars = Counter(c for doc_id, text in texts.items() if split_of[doc_id] == "train" for c in text)
    vocab = prepared.preprocessor
    assert vocab.units == sorted(train_chars, key=lambda c: (-train_chars[c], c))[:30]
    assert vocab.spec.num_units == 33
    for row in prepared.splits["valid"]:
        assert row["char_ids"] == vocab.encode(texts[row["doc_id"]]) and row["char_ids"][-1] == EOS
    assert task.load_preprocessor(vocab.to_json()).units == vocab.units


def test_char_task_trains_and_its_metrics_reduce_across_ranks(synth_files):
    task = CharTask()
    cfg = CharDataConfig(inputs=[str(p) for p in synth_files], max_chars=30)
    prepared = prepare_in_memory(task, files_table(synth_files), cfg)
    spec, train, valid = prepared.preprocessor.spec, prepared.splits["train"], prepared.splits["valid"]

    batch = task.collate(valid[:2], spec)
    lengths = [len(r["char_ids"]) for r in valid[:2]]
    assert batch.inputs.shape == (2, max(lengths)) and batch.mask.sum(1).tolist() == lengths
    assert torch.equal(batch.inputs[0, 1 : lengths[0]], batch.targets[0, : lengths[0] - 1])

    torch.manual_seed(0)
    model = task.build_model(CharModelConfig(), spec)
    before = task.evaluate(model, task.batches(valid, spec, 4))
    assert before["tokens"] == sum(len(r["char_ids"]) for r in valid)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
    for _ in range(4):
        for train_batch in task.batches(train, spec, 4):
            step = train_step(task, model, train_batch, optimizer, TrainConfig(grad_clip=0.0))
    assert step["tokens"] == int(train_batch.mask.sum()) and step["steps"] == 1
    after = task.evaluate(model, task.batches(valid, spec, 4))
    assert after[task.primary_metric] < 0.6 * before[task.primary_metric]

    # the runner's evaluation (dynlm evaluate, run, retrain): a task with one layout takes no ``layout``
    assert task.evaluate_documents(model, CharModelConfig(), valid, spec, 4) == pytest.approx(after, rel=1e-6)
    with pytest.raises(ValueError, match="no documents to evaluate"):
        task.evaluate_documents(model, CharModelConfig(), [], spec, 4)

    halves = [task.evaluate(model, task.batches(part, spec, 4)) for part in (valid[:2], valid[2:])]
    summed = task.metrics.from_tensor(sum(task.metrics.from_metrics(h).as_tensor() for h in halves))  # all-reduce
    assert summed.compute() == pytest.approx(after, rel=1e-6)  # float32 NLL, batched differently
    table = task.metric_table(after, "char LM on valid")
    assert table.splitlines()[1] == f"  {'characters':<16}{after['tokens']:>10}"


def test_a_task_missing_a_member_cannot_be_built():
    class NoLoss(CharTask):
        loss = Task.loss  # the abstract declaration again

    with pytest.raises(TypeError, match="loss"):
        NoLoss()
    assert sorted(Task.__abstractmethods__) == ["build_model", "collate", "loss", "metric_table", "parse_files"]
    with pytest.raises(ValueError, match=rf"unknown task 'chars' \(known: {', '.join(sorted(TASKS))}, or package.module:Class\)"):
        get_task("chars")
    assert isinstance(CharMetrics().as_tensor(), torch.Tensor)
