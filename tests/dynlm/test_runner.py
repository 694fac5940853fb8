"""dynlm.runner: the one way a rank's model, optimizer, schedule and batches are built (the Ray
worker, ``dynlm train --local`` and the benchmarks all use it)."""

from __future__ import annotations

import pytest
import torch

from dynlm.data.config import DataConfig
from dynlm.data.synth import SynthConfig, write_conll
from dynlm.job import JobConfig
from dynlm.runner import build_rank_run, local_run, total_steps, train_shuffle_seed
from dynlm.tasks.local import prepare_local


@pytest.fixture(scope="module")
def job_and_prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("runner")
    write_conll(SynthConfig(num_documents=30, seed=4, docs_per_file=10), root / "corpus")
    data = DataConfig(inputs=[str(root / "corpus")], output_root=str(root / "prepared"), vocab_size=60, bpe_merges=30,
                      max_chains=8)
    job = JobConfig.from_dict({"data": data.to_dict(), "model": {"type": "rnn", "embed_dim": 8, "hidden_dim": 8},
                               "train": {"epochs": 2, "batch_size": 4, "lr_schedule": "cosine", "bptt_tokens": 20}})
    return job, prepare_local(job.data, log=lambda _: None)


def _weights(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_ranks_start_from_the_same_weights_and_read_their_own_validation_rows(job_and_prepared):
    job, prepared = job_and_prepared
    valid = list(prepared.iter_rows("valid"))
    runs = [build_rank_run(job, prepared.spec, train_rows=lambda _n: prepared.iter_rows("train"),
                           valid_rows=lambda _n: iter(valid), steps=10, rank=rank, world_size=2) for rank in (0, 1)]
    assert torch.equal(_weights(runs[0].model), _weights(runs[1].model))
    documents = [sum(batch.num_documents for batch in run.valid_batches()) for run in runs]
    assert documents == [(len(valid) + 1) // 2, len(valid) // 2]  # rows index % 2 == rank
    assert runs[0].schedule.total_steps == 10
    assert train_shuffle_seed(3, 2, 1) == 3 * 7919 + 2 * 31 + 1


def test_local_run_trains_with_the_schedule_its_epochs_take(job_and_prepared):
    job, prepared = job_and_prepared
    run = local_run(job, prepared)
    counted = sum(run.task.steps_per_batch(batch, job.train) for batch in run.train_batches(1))
    one = job.replace(run=job.run.replace(num_workers=1))  # packed documents: the count is exact
    assert run.schedule.total_steps == total_steps(one, prepared) == job.train.epochs * counted
    summary = run.fit()
    assert [record["train_steps_per_rank"] for record in summary["history"]] == [counted, counted]
    halved = one.replace(train=job.train.replace(accumulate_steps=2))
    assert total_steps(halved, prepared) == job.train.epochs * -(-counted // 2)
    assert local_run(halved, prepared).fit()["history"][0]["train_steps_per_rank"] == -(-counted // 2)
