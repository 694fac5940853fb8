"""Training throughput and suggestion latency of the two naming models at the default config.

Seeded random functions (no corpus needed) at a mid-size vocabulary: 10,000 names, 5,000
subtokens, 20,000 features, 5,000 context tokens, 24 features per function, names of 1-4
subtokens, K_max = 4. Per model (``NamingModelConfig()`` defaults, ``type`` name / subtoken):

* training: functions/s of training steps as ``dynlm train`` takes them, best of ``--repeats``: the
  model and optimizer built by the runner (:func:`dynlm.runner.build_rank_run`, the naming task's
  training defaults: Adam, ``grad_clip`` 5) and :func:`dynlm.training.train_step` (the NCE loss,
  backward, clipping, the optimizer step, and the normalised NLL of the true names the run reports);
* suggest: ms per batch of ``suggest`` (top 5; the subtoken model's beam search of width 8 up to
  6 subtokens), and functions/s.

    python -m benchmarks.bench_naming                 # CPU, 1 thread, ~1 min (from the repository root)
    python -m benchmarks.bench_naming --device cuda --threads 0
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import generated_rows_job, rows_run
from dynlm.models.naming import END, PAD, START, NamingBatch, NamingModelConfig, NamingSpec
from dynlm.tasks.naming import NamingTask
from dynlm.tasks.naming_data import FunctionBatch
from dynlm.train_config import TrainConfig
from dynlm.training import train_step

NUM_NAMES, NUM_SUBTOKENS, NUM_FEATURES, NUM_CONTEXT_TOKENS, K_MAX, FEATURES_PER_FUNCTION = 10_000, 5_000, 20_000, 5_000, 4, 24


def zipf_counts(size: int, first: int, generator: torch.Generator) -> list[int]:
    """Training counts falling like 1/rank from ``first`` (ids below ``first`` are specials, count 0)."""
    counts = (1e5 / torch.arange(1, size - first + 1, dtype=torch.float64)).long() + 1
    return [0] * first + counts[torch.randperm(size - first, generator=generator)].tolist()


def random_batch(batch_size: int, spec: NamingSpec, generator: torch.Generator) -> FunctionBatch:
    """``batch_size`` seeded random functions (no true-name strings: nothing here reads them)."""
    features = torch.randint(2, NUM_FEATURES, (batch_size, FEATURES_PER_FUNCTION), generator=generator)
    context = torch.randint(1, NUM_CONTEXT_TOKENS, (batch_size, 2 * K_MAX), generator=generator)
    names = torch.randint(1, NUM_NAMES, (batch_size,), generator=generator)
    lengths = torch.randint(1, 5, (batch_size,), generator=generator)
    subtokens = torch.full((batch_size, 5), PAD, dtype=torch.long)
    for row, length in enumerate(lengths.tolist()):
        subtokens[row, :length] = torch.randint(START + 1, NUM_SUBTOKENS, (length,), generator=generator)
        subtokens[row, length] = END
    return FunctionBatch(NamingBatch(features, context, names, subtokens), [()] * batch_size, spec,
                         [False] * batch_size)


def best_seconds(run, repeats: int) -> float:
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        timings.append(time.perf_counter() - start)
    return min(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: leave PyTorch's default)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20, help="training steps per timing")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    generator = torch.Generator().manual_seed(0)
    spec = NamingSpec(num_names=NUM_NAMES, num_subtokens=NUM_SUBTOKENS, num_features=NUM_FEATURES,
                      num_context_tokens=NUM_CONTEXT_TOKENS, max_context_size=K_MAX,
                      name_counts=zipf_counts(NUM_NAMES, 1, generator), subtoken_counts=zipf_counts(NUM_SUBTOKENS, 2, generator))
    batches = [random_batch(args.batch_size, spec, generator).to(device) for _ in range(args.steps)]
    task = NamingTask()
    print(f"device={device} threads={torch.get_num_threads()} batch={args.batch_size} names={NUM_NAMES} "
          f"subtokens={NUM_SUBTOKENS} features={NUM_FEATURES} features/function={FEATURES_PER_FUNCTION}")
    print(f"{'model':10s} {'train functions/s':>18s} {'suggest ms/batch':>17s} {'suggest functions/s':>20s}")
    for model_type in ("name", "subtoken"):
        train_cfg = TrainConfig(**{**task.train_defaults, "batch_size": args.batch_size})
        job = generated_rows_job(task.name, NamingModelConfig(type=model_type), train_cfg,
                                 generated_by="benchmarks.bench_naming.random_batch")
        run = rows_run(job, spec, [], device=device)  # its model and optimizer; the batches are the random ones above

        def train(run=run) -> None:  # this iteration's run (bound now)
            for batch in batches:
                train_step(run.task, run.model, batch, run.optimizer, run.job.train, scheduler=run.schedule)
            synchronize()

        def suggest(model=run.model) -> None:
            model.suggest(batches[0].inputs)
            synchronize()

        train()  # warm-up
        train_seconds = best_seconds(train, args.repeats)
        suggest()
        suggest_seconds = best_seconds(suggest, args.repeats)
        print(f"{model_type:10s} {args.steps * args.batch_size / train_seconds:18.0f} {suggest_seconds * 1000:17.1f} "
              f"{args.batch_size / suggest_seconds:20.0f}")


if __name__ == "__main__":
    main()
