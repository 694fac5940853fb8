"""Which weights give dynamic evaluation its gain on an LM checkpoint (issue 18), per metric category.

Dynamic evaluation (Krause et al.) of one group of weights at a time: none (static), the output
layer alone (``lm.decoder.*``), every adapted weight but the output layer. The checkpoints are
the ones ``python -m benchmarks.dntm_quality --save-dir DIR`` writes; the LitBank split and batches come
from the same flags as that script (pass the ones the checkpoints were trained with), the
gradient statistics from the training documents, the scores from the validation documents.
Weights a model declares static under dynamic evaluation (the DNTM's W_dy) stay static.

    python -m benchmarks.dntm_dyneval_groups --checkpoint ck/rnn.pt \
        --checkpoint ck/dntm_both___new_entity_logit.pt --eta 3e-3 \
        --epochs 6 --embed-dim 256 --hidden-dim 256 --num-layers 2 --max-sentences 0 \
        --vocab-size 10000 --dropout 0.3 --batch-size 16 --seed 1 --lr-schedule cosine
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks import dntm_quality
from benchmarks.litbank import prepare_litbank
from dynlm import checkpoint
from dynlm.dynamic_eval import DynamicEvalConfig, collect_grad_stats, default_adapted_names, dynamic_evaluate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " Every other flag is "
                                     "benchmarks.dntm_quality's (see its --help).")
    parser.add_argument("--checkpoint", type=Path, action="append", required=True, help="a dynlm checkpoint (repeatable)")
    parser.add_argument("--eta", type=float, default=3e-3)
    parser.add_argument("--lam", type=float, default=0.0)
    own, rest = parser.parse_known_args(argv)
    args = dntm_quality.parse_args(rest)  # the split, vocabulary and batches of the checkpoints' run
    torch.set_num_threads(args.threads)
    _, rows = prepare_litbank(args)
    print(f"| checkpoint | weights adapted (eta {own.eta:g}, lambda {own.lam:g}) | overall | first mention | "
          "re-appearing | after entity |\n|---|---|---|---|---|---|", flush=True)
    for path in own.checkpoint:
        model, _, spec, _ = checkpoint.load(path)
        stats = collect_grad_stats(model, dntm_quality.document_batches(rows["train"], spec, args))
        valid = dntm_quality.document_batches(rows["valid"], spec, args)
        adapted = default_adapted_names(model)
        output_layer = [n for n in adapted if n.split(".")[-2:-1] == ["decoder"]]  # lm.decoder.weight / .bias
        groups = {"none": None, "the output layer only": output_layer,
                  "all but the output layer": [n for n in adapted if n not in output_layer]}
        for label, names in groups.items():
            rule = DynamicEvalConfig(lr=0.0 if names is None else own.eta, decay=0.0 if names is None else own.lam)
            m = dynamic_evaluate(model, valid, rule, stats, names=names)
            print(f"| {path.stem} | {label} | {m['ppl']:.2f} | {m['ppl_first_mention']:.2f} | "
                  f"{m['ppl_reappearing']:.2f} | {m['ppl_after_entity']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
