"""Tests of dynlm.training: truncated BPTT step, evaluate, fit, and real 2-process DDP with join()."""

from __future__ import annotations

import math
import os
import textwrap

import pytest
import torch
from linear_task import LinearTask, PointBatch, linear_model, point_batches  # this folder (pytest rootdir import)

from dynlm.config import ConfigError
from dynlm.data.batching import batch_documents, collate_documents
from dynlm.models import RNNLM, build_model, rnn_lm_small
from dynlm.tasks.lm import LMTask
from dynlm.tasks.lm_evaluation import evaluate_lm
from dynlm.training import TrainConfig, fit, train_step

LM_TASK = LMTask()


def _model(spec, **overrides):
    torch.manual_seed(0)
    return build_model(rnn_lm_small(**{"embed_dim": 16, "hidden_dim": 16, "dropout": 0.0, **overrides}), spec)


def test_train_step_lowers_loss_on_repeated_corpus(tiny_spec, random_rows):
    batch = collate_documents(random_rows(4, seed=1), tiny_spec)
    model = _model(tiny_spec)
    cfg = TrainConfig(bptt_tokens=0, lr=3e-2, bptt_sentences=2)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    first = train_step(LM_TASK, model, batch, optimizer, cfg)
    for _ in range(12):
        last = train_step(LM_TASK, model, batch, optimizer, cfg)
    assert first["tokens"] == last["tokens"] == batch.num_tokens
    assert first["steps"] == math.ceil(len(batch.sentences) / 2)
    assert first["num_padded"] == batch.num_padded
    assert last["loss"] < 0.5 * first["loss"]
    assert evaluate_lm(model, [batch])["loss"] < 0.5 * first["loss"]


def test_train_step_seeded_golden_loss(tiny_spec, random_rows):
    batch = collate_documents(random_rows(3, seed=2), tiny_spec)
    model = _model(tiny_spec)
    cfg = TrainConfig(bptt_tokens=0, lr=1e-2, bptt_sentences=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    losses = [train_step(LM_TASK, model, batch, optimizer, cfg)["loss"] for _ in range(2)]
    assert losses == pytest.approx(GOLDEN_LOSSES, rel=1e-5)


# issue 18: random_rows numbers entities in first-appearance order (3.0323, 2.9252 with the mask
# off) and the model masks the entity ids that cannot come next (on by default): lower.
GOLDEN_LOSSES = [2.983415302477385, 2.8734907852975944]


def test_train_step_chunks_state_and_scheduler(tiny_spec, random_rows):
    batch = collate_documents(random_rows(3, seed=3), tiny_spec)
    model = _model(tiny_spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []

    class Counter:
        def step(self):
            steps.append(1)

    out = train_step(LM_TASK, model, batch, optimizer, TrainConfig(bptt_tokens=0, bptt_sentences=2, grad_clip=0.0), scheduler=Counter())
    assert len(steps) == out["steps"] == math.ceil(len(batch.sentences) / 2)
    assert math.isnan(out["grad_norm"])


class GradAtEvalLM(RNNLM):
    """An RNNLM that insists on gradients in eval (like the meta-learned model)."""

    needs_grad_at_eval = True

    def forward(self, batch, state):
        assert torch.is_grad_enabled(), "evaluate must enable gradients for needs_grad_at_eval"
        assert state.h.grad_fn is None, "evaluate must detach the state every sentence"
        return super().forward(batch, state)


def test_evaluate_with_needs_grad_at_eval(tiny_spec, random_rows):
    batches = list(batch_documents(random_rows(5), tiny_spec, 2))
    model = _model(tiny_spec)
    special = GradAtEvalLM(model.cfg, tiny_spec)
    special.load_state_dict(model.state_dict())
    plain, with_grad = evaluate_lm(model, batches), evaluate_lm(special, batches)
    assert plain["tokens"] == with_grad["tokens"] > 0
    for key in ("loss", "ppl", "ppl_first_mention", "ppl_after_entity"):
        assert with_grad[key] == pytest.approx(plain[key], rel=1e-6)
    assert model.training  # mode restored


def test_fit_restores_best_weights_and_callback_stops(tiny_spec, random_rows):
    rows = random_rows(6, seed=4)
    valid = list(batch_documents(random_rows(3, seed=5), tiny_spec, 3))
    model = _model(tiny_spec)
    seen = []
    cfg = TrainConfig(bptt_tokens=0, epochs=4, lr=5e-3, batch_size=2, lr_schedule="cosine", warmup_steps=2)
    result = fit(model, lambda epoch: batch_documents(rows, tiny_spec, 2, seed=epoch), lambda: valid, cfg,
                 on_epoch=lambda epoch, record: seen.append(record) or epoch == 3, task=LM_TASK)
    assert result["epochs_run"] == 3 and len(seen) == 3
    assert [r["epoch"] for r in seen] == [1, 2, 3]  # one numbering everywhere: from 1
    best = min(r["valid_ppl"] for r in result["history"])
    assert result["best_valid_objective"] == best
    assert evaluate_lm(model, valid)["ppl"] == pytest.approx(best, rel=1e-6)
    assert {"train_loss", "valid_ppl_reappearing", "train_padding_fraction", "lr"} <= set(result["history"][0])


def test_fit_early_stopping(tiny_spec, random_rows):
    rows = random_rows(4, seed=6)
    valid = list(batch_documents(random_rows(3, seed=7), tiny_spec, 3))
    model = _model(tiny_spec)
    # a huge SGD step makes validation worse after the first epoch
    cfg = TrainConfig(bptt_tokens=0, epochs=6, lr=50.0, optimizer="sgd", grad_clip=0.0, lr_schedule="constant",
                      early_stopping_patience=2)
    result = fit(model, lambda epoch: batch_documents(rows, tiny_spec, 2, seed=epoch), lambda: valid, cfg, task=LM_TASK)
    assert result["stopped_early"] and result["best_epoch"] == 1
    assert result["epochs_run"] == result["best_epoch"] + 2  # patience 2 after the best epoch


def test_fit_continued_from_its_state_equals_an_uninterrupted_fit(tiny_spec, random_rows):
    """What a resumed Ray run relies on: weights + optimizer + schedule + FitState continue
    the run exactly (per-epoch seeding makes the RNG streams independent of the interruption)."""
    from dynlm.optim import LRSchedule, build_optimizer
    from dynlm.training import FitHooks, FitState

    rows = random_rows(6, seed=4)
    valid = list(batch_documents(random_rows(3, seed=5), tiny_spec, 3))
    cfg = TrainConfig(bptt_tokens=0, epochs=4, lr=5e-3, batch_size=2, lr_schedule="cosine", early_stopping_patience=0)

    def run(stop_at: int | None):
        torch.manual_seed(0)
        model = _model(tiny_spec)
        optimizer = build_optimizer(model, cfg)
        schedule = LRSchedule(optimizer, "cosine", total_steps=40)
        state = FitState()
        train = lambda epoch: batch_documents(rows, tiny_spec, 2, seed=epoch)  # noqa: E731
        hooks = FitHooks(restore_best=False)
        fit(model, train, lambda: valid, cfg, optimizer=optimizer, schedule=schedule, state=state, hooks=hooks,
            on_epoch=(lambda epoch, record: epoch == stop_at) if stop_at else None, task=LM_TASK)
        if stop_at:  # "restore" into fresh objects, as a restarted worker does
            saved = (model.state_dict(), optimizer.state_dict(), schedule.state_dict(), state.to_dict())
            model = _model(tiny_spec)
            optimizer = build_optimizer(model, cfg)
            schedule = LRSchedule(optimizer, "cosine", total_steps=40)
            model.load_state_dict(saved[0])
            optimizer.load_state_dict(saved[1])
            schedule.load_state_dict(saved[2])
            state = FitState.from_dict(saved[3])
            fit(model, train, lambda: valid, cfg, optimizer=optimizer, schedule=schedule, state=state, hooks=hooks, task=LM_TASK)
        return model, state

    straight, straight_state = run(None)
    resumed, resumed_state = run(2)
    assert [r["epoch"] for r in resumed_state.history] == [1, 2, 3, 4]
    assert [r["valid_ppl"] for r in resumed_state.history] == [r["valid_ppl"] for r in straight_state.history]
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name  # bitwise: same ops in the same order on CPU


def test_train_config_is_strict():
    with pytest.raises(ConfigError, match="unknown key"):
        TrainConfig.from_dict({"learning_rate": 1e-3})
    with pytest.raises(ConfigError, match="bptt_sentences"):
        TrainConfig.from_dict({"bptt_sentences": 0})


DDP_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    sys.path.insert(0, sys.argv[2])
    from conftest import TINY_SPEC, random_rows
    from dynlm.data.batching import batch_documents
    from dynlm.models import build_model, rnn_lm_small
    from dynlm.tasks.lm import LMTask
    from dynlm.training import TrainConfig, train_step
    LM_TASK = LMTask()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = build_model(rnn_lm_small(embed_dim=16, hidden_dim=16, embedding="word+subword", subword_dim=8), TINY_SPEC)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    cfg = TrainConfig(bptt_tokens=0, lr=1e-2, bptt_sentences=1)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=cfg.lr)
    # uneven inputs: rank 0 gets 3 batches, rank 1 gets 1 (and different numbers of chunks)
    rows = random_rows(6 if rank == 0 else 2, seed=rank, max_sentences=6)
    results = []
    with ddp.join():
        for batch in batch_documents(rows, TINY_SPEC, 2, seed=0):
            results.append(train_step(LM_TASK, ddp, batch, optimizer, cfg))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as out:
        json.dump({"rank": rank, "steps": sum(r["steps"] for r in results), "loss": results[-1]["loss"],
                   "param_sum": float(flat.double().sum()), "param_abs": float(flat.double().abs().sum())}, out)
    # The results are on disk: leave without interpreter teardown. Gloo's threads can std::terminate
    # while Python finalizes ("terminate called without an active exception", seen once in a full
    # suite run on 2 cores; pytorch/pytorch#190489), which would fail a rank whose results are written.
    os._exit(0)
''')


def test_train_step_under_real_ddp_with_uneven_inputs(tmp_path, gloo_ranks):
    r0, r1 = gloo_ranks(DDP_SCRIPT, tmp_path, os.path.dirname(os.path.abspath(__file__)), timeout=120,
                            hang_message="DDP workers hung (join / one-forward-per-backward broken)")
    assert r0["steps"] > r1["steps"]  # the ranks really had different numbers of steps
    assert math.isfinite(r0["loss"]) and math.isfinite(r1["loss"])
    assert r0["param_sum"] == pytest.approx(r1["param_sum"], rel=1e-6)  # replicas stayed in sync
    assert r0["param_abs"] == pytest.approx(r1["param_abs"], rel=1e-6)


def test_train_one_epoch_averages_the_dynamical_gate_statistics():
    """One process, no DDP: the dynamical LM's per-step gate statistics reach the epoch totals
    (logged as train_gate_*), other models report none."""
    from dynlm.data.batching import collate_documents
    from dynlm.models import build_model
    from dynlm.models.dynamical_lm import dynamical_lm_small
    from dynlm.models.rnn_lm import rnn_lm_small
    from dynlm.optim import LRSchedule
    from dynlm.training import TrainConfig, train_one_epoch
    from dynlm.vocab_spec import VocabSpec

    spec = VocabSpec(num_words=24, num_entities=0, shortlist_size=24, num_subwords=4)
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(4):
        words = [spec.bos_id, *torch.randint(4, 24, (10,), generator=g).tolist(), spec.eos_id]
        rows.append(dict(doc_id=f"d{i}", source_file="t", num_tokens=12, sentence_lengths=[12], word_ids=words,
                         entity_ids=[0] * 12, subword_ids=[1] * 12, subword_lengths=[1] * 12))
    batches = [collate_documents(rows[:2], spec), collate_documents(rows[2:], spec)]
    for model_cfg, expect_gates in ((dynamical_lm_small(embed_dim=8, hidden_dim=8, dynamical=dict(segment_len=4)), True),
                                    (rnn_lm_small(embed_dim=8, hidden_dim=8), False)):
        torch.manual_seed(0)
        model = build_model(model_cfg, spec)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        totals = train_one_epoch(model, optimizer, LRSchedule(optimizer, "constant"), TrainConfig(bptt_tokens=0), iter(batches),
                                 torch.device("cpu"), spec=spec, task=LM_TASK)
        assert totals["steps"] == 2
        if expect_gates:
            assert set(totals["stat_means"]) == {"gate_input_mean", "gate_input_std", "gate_forget_mean",
                                                 "gate_forget_std"}
            assert totals["stat_means"]["gate_input_mean"] == pytest.approx(1.0, abs=0.05)
        else:
            assert totals["stat_means"] == {}


def test_train_one_epoch_calls_its_hook_after_every_chunk(tiny_spec, random_rows):
    """A packed batch holds many chunks (one optimizer step each): the progress and fault hooks
    see every step, with running sums that end at the epoch's totals."""
    from dynlm.data.batching import ChunkLayout
    from dynlm.optim import LRSchedule
    from dynlm.training import train_one_epoch

    layout = ChunkLayout(6, pack_documents=True)
    batches = list(batch_documents(random_rows(6, seed=5), tiny_spec, 3, seed=0, layout=layout))
    model = _model(tiny_spec)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    seen = []
    totals = train_one_epoch(model, optimizer, LRSchedule(optimizer, "constant"), TrainConfig(bptt_tokens=6),
                             iter(batches), torch.device("cpu"), spec=tiny_spec,
                             after_step=lambda t: seen.append((t["steps"], int(t["tokens"]), float(t["nll_sum"]))), task=LM_TASK)
    assert len(batches) == 1 and totals["steps"] == len(batches[0].sentences) > 1
    assert [steps for steps, _, _ in seen] == list(range(1, totals["steps"] + 1))
    assert seen[-1][1] == totals["tokens"] and seen[-1][2] == pytest.approx(totals["nll_sum"])
    assert all(a[1] < b[1] for a, b in zip(seen, seen[1:]))  # tokens grow chunk by chunk


# --- gradient accumulation: train.accumulate_steps chunks per optimizer step -------------------



def _sgd_epoch(batches, accumulate_steps):
    from dynlm.optim import LRSchedule
    from dynlm.training import train_one_epoch

    model = linear_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = TrainConfig(grad_clip=0.0, accumulate_steps=accumulate_steps)
    totals = train_one_epoch(model, optimizer, LRSchedule(optimizer, "constant"), cfg, iter(batches),
                             torch.device("cpu"), task=LinearTask())
    return model, totals


def _concat(*batches):
    return PointBatch(torch.cat([b.x for b in batches]), torch.cat([b.y for b in batches]))


def test_accumulated_steps_equal_steps_on_the_concatenated_batches():
    """accumulate_steps=2 over 3 equal batches: one step on the mean gradient of batches 1-2,
    then the epoch's short last group (batch 3) steps on its own mean: the same weights as
    plain steps on [1+2] and [3]; the loss sums are the batches' own."""
    b1, b2, b3 = point_batches(seed=1, count=3)
    accumulated, totals = _sgd_epoch([b1, b2, b3], accumulate_steps=2)
    reference, reference_totals = _sgd_epoch([_concat(b1, b2), b3], accumulate_steps=1)
    assert totals["steps"] == 2 and totals["tokens"] == 12
    for got, want in zip(accumulated.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    plain, _ = _sgd_epoch([b1, b2, b3], accumulate_steps=1)  # 3 steps: different weights (the test can fail)
    assert not torch.allclose(plain.weight, accumulated.weight)


def test_train_step_alone_steps_on_a_group_its_batch_leaves_unfinished():
    from dynlm.training import optimizer_steps, train_step

    model = linear_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out = train_step(LinearTask(), model, point_batches(seed=2, count=1)[0], optimizer,
                     TrainConfig(grad_clip=0.0, accumulate_steps=4))
    assert out["steps"] == 1  # one chunk of a 4-chunk group: stepped at the batch's end
    assert optimizer_steps(9, 4) == 3 and optimizer_steps(8, 4) == 2 and optimizer_steps(1, 1) == 1
    with pytest.raises(ConfigError, match="accumulate_steps"):
        TrainConfig.from_dict({"accumulate_steps": 0})


ACCUMULATION_DDP_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    sys.path.insert(0, sys.argv[2])
    from linear_task import LinearTask, linear_model, point_batches
    from dynlm.optim import LRSchedule
    from dynlm.training import TrainConfig, train_one_epoch
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = linear_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    synced = []  # DDP's gradient all-reduces (one bucket per synchronised backward: a tiny model)

    def count_hook(state, bucket):
        synced.append(1)
        return torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook(state, bucket)

    import torch.distributed.algorithms.ddp_comm_hooks.default_hooks  # noqa: F401
    ddp.register_comm_hook(None, count_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    cfg = TrainConfig(grad_clip=0.0, accumulate_steps=2)
    totals = train_one_epoch(ddp, optimizer, LRSchedule(optimizer, "constant"), cfg,
                             iter(point_batches(seed=10 + rank, count=3)), torch.device("cpu"), task=LinearTask())
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as out:
        json.dump({"steps": totals["steps"], "synced_backwards": len(synced),
                   "params": [p.detach().reshape(-1).tolist() for p in model.parameters()]}, out)
    os._exit(0)  # see DDP_SCRIPT
''')


def test_accumulation_under_real_ddp_syncs_once_per_step(tmp_path, gloo_ranks):
    """2 gloo ranks, 3 batches each, accumulate_steps=2: DDP all-reduces on the second batch's
    backward only (no_sync on the first), the short last group is all-reduced by the loop; the
    weights equal one process's steps on the union of the ranks' groups."""
    r0, r1 = gloo_ranks(ACCUMULATION_DDP_SCRIPT, tmp_path, os.path.dirname(os.path.abspath(__file__)), timeout=120)
    assert r0["steps"] == r1["steps"] == 2
    assert r0["synced_backwards"] == r1["synced_backwards"] == 1
    assert r0["params"] == r1["params"]  # replicas bit-identical
    a, b = point_batches(seed=10, count=3), point_batches(seed=11, count=3)
    reference, _ = _sgd_epoch([_concat(a[0], a[1], b[0], b[1]), _concat(a[2], b[2])], accumulate_steps=1)
    for got, want in zip(r0["params"], reference.parameters()):
        torch.testing.assert_close(torch.tensor(got), want.detach().reshape(-1), rtol=1e-6, atol=1e-7)
