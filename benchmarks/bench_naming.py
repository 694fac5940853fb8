"""Training throughput and suggestion latency of the two naming models at the default config.

Seeded random functions (no corpus needed) at a mid-size vocabulary: 10,000 names, 5,000
subtokens, 20,000 features, 5,000 context tokens, 24 features per function, names of 1-4
subtokens, K_max = 4. Per model (``NamingModelConfig()`` defaults, ``type`` name / subtoken):

* training: functions/s of NCE steps (forward, ``nce_loss``, backward, Adam), best of ``--repeats``;
* suggest: ms per batch of ``suggest`` (top 5; the subtoken model's beam search of width 8 up to
  6 subtokens), and functions/s.

    python benchmarks/bench_naming.py                 # CPU, 1 thread, ~1 min
    python benchmarks/bench_naming.py --device cuda --threads 0
"""

from __future__ import annotations

import argparse
import time

import torch

from dynlm.models.naming import END, PAD, START, NamingBatch, NamingModelConfig, NamingSpec, build_naming_model
from dynlm.modules.nce import nce_loss

NUM_NAMES, NUM_SUBTOKENS, NUM_FEATURES, NUM_CONTEXT_TOKENS, K_MAX, FEATURES_PER_FUNCTION = 10_000, 5_000, 20_000, 5_000, 4, 24


def zipf_counts(size: int, first: int, generator: torch.Generator) -> list[int]:
    """Training counts falling like 1/rank from ``first`` (ids below ``first`` are specials, count 0)."""
    counts = (1e5 / torch.arange(1, size - first + 1, dtype=torch.float64)).long() + 1
    return [0] * first + counts[torch.randperm(size - first, generator=generator)].tolist()


def random_batch(batch_size: int, generator: torch.Generator) -> NamingBatch:
    features = torch.randint(2, NUM_FEATURES, (batch_size, FEATURES_PER_FUNCTION), generator=generator)
    context = torch.randint(1, NUM_CONTEXT_TOKENS, (batch_size, 2 * K_MAX), generator=generator)
    names = torch.randint(1, NUM_NAMES, (batch_size,), generator=generator)
    lengths = torch.randint(1, 5, (batch_size,), generator=generator)
    subtokens = torch.full((batch_size, 5), PAD, dtype=torch.long)
    for row, length in enumerate(lengths.tolist()):
        subtokens[row, :length] = torch.randint(START + 1, NUM_SUBTOKENS, (length,), generator=generator)
        subtokens[row, length] = END
    return NamingBatch(features, context, names, subtokens)


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
    batches = [random_batch(args.batch_size, generator).to(device) for _ in range(args.steps)]
    print(f"device={device} threads={torch.get_num_threads()} batch={args.batch_size} names={NUM_NAMES} "
          f"subtokens={NUM_SUBTOKENS} features={NUM_FEATURES} features/function={FEATURES_PER_FUNCTION}")
    print(f"{'model':10s} {'train functions/s':>18s} {'suggest ms/batch':>17s} {'suggest functions/s':>20s}")
    for model_type in ("name", "subtoken"):
        torch.manual_seed(0)
        model = build_naming_model(NamingModelConfig(type=model_type), spec).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

        def train(model=model, optimizer=optimizer) -> None:  # this iteration's model (bound now)
            for batch in batches:
                optimizer.zero_grad(set_to_none=True)
                nce_loss(model(batch)).mean().backward()
                optimizer.step()
            synchronize()

        def suggest(model=model) -> None:
            model.suggest(batches[0])
            synchronize()

        train()  # warm-up
        train_seconds = best_seconds(train, args.repeats)
        suggest()
        suggest_seconds = best_seconds(suggest, args.repeats)
        print(f"{model_type:10s} {args.steps * args.batch_size / train_seconds:18.0f} {suggest_seconds * 1000:17.1f} "
              f"{args.batch_size / suggest_seconds:20.0f}")


if __name__ == "__main__":
    main()
