"""Evaluation speed of the meta-learned dynamical LM vs. the static LM, on the same batches.

    python -m benchmarks.bench_dynamical_speed                      # ~4 min on one CPU thread
    python -m benchmarks.bench_dynamical_speed --corpus wikitext2   # ragged real sentences

Documents: seeded random ones (``--corpus synthetic``: sentences of 30 words, Zipf-like ids) or
WikiText-2 validation articles (``--corpus wikitext2``, from ``../shared/data/wikitext-2``, skipped
when absent; prepared by the library, :mod:`benchmarks.wikitext`), vocabulary ``--vocab``, LSTM 1 x ``--hidden``, fast output layer, segment
``--segment-len``, batches of ``--batch-size`` documents. Two layouts of the same documents:
sentence lockstep, and chunks of ``--segment-len`` positions (``ChunkLayout``: each segment is one
chunk), batched as evaluation batches them (``batch_documents``: similar lengths together). Rows
(``dynlm.tasks.lm_evaluation.evaluate_lm`` tokens/s):

1. static LSTM (no fast weights);
2. dynamical LM with ``compile_update`` (the update and the softmax gradient fused);
3. dynamical LM, eager;
   rows 2 and 3 again with ``gate_form="rational"`` (no logarithm or exponential per coordinate);
4. dynamic evaluation (Krause et al.) of the output layer, for reference (one document at a time,
   lockstep layout only).

Method (these machines are shared and noisy): ``--rounds`` rounds, each measures every row once,
in turn, for at least ``--seconds`` (whole evaluations, repeated); a row's figure is its median
over the rounds, and its ratio to static is the median of the per-round ratios. The minor page
faults of one evaluation are printed too: a large count means the allocator returned memory to
the system and took it back (each fault costs microseconds).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import torch

from benchmarks.wikitext import prepare_articles, read_articles, rows_in_order
from dynlm.data.batching import ChunkLayout, batch_documents
from dynlm.dynamic_eval import DynamicEvalConfig, collect_grad_stats, dynamic_evaluate
from dynlm.models.config import ModelConfig
from dynlm.models.dynamical_lm import DynamicalLM
from dynlm.models.rnn_lm import RNNLM
from dynlm.tasks.lm_evaluation import evaluate_lm
from dynlm.vocab_spec import VocabSpec


def synthetic_rows(spec: VocabSpec, num_docs: int, sentences: int, length: int, seed: int = 0) -> list[dict]:
    """Seeded documents of ``sentences`` sentences of ``length`` words, Zipf-like word ids."""
    g = torch.Generator().manual_seed(seed)
    ranks = torch.arange(1, spec.num_words - 3, dtype=torch.float)
    probs = (1.0 / ranks) / (1.0 / ranks).sum()
    rows = []
    for d in range(num_docs):
        words, lengths = [], []
        for _ in range(sentences):
            sentence = (torch.multinomial(probs, length, replacement=True, generator=g) + 4).tolist()
            words += [spec.bos_id, *sentence, spec.eos_id]
            lengths.append(length + 2)
        n = len(words)
        rows.append(dict(doc_id=f"d{d}", source_file="bench", num_tokens=n, sentence_lengths=lengths,
                         word_ids=words, entity_ids=[0] * n, subword_ids=[1] * n, subword_lengths=[1] * n))
    return rows


def wikitext_rows(num_docs: int, vocab_size: int, max_lines: int) -> tuple[VocabSpec, list[dict]]:
    """The first ``num_docs`` WikiText-2 validation articles (``max_lines`` paragraphs each), prepared
    as the train split of their own folder, so the vocabulary of ``vocab_size`` words is fitted on
    them (speed does not depend on a held-out vocabulary)."""
    articles = read_articles("valid", num_docs)
    prepared = prepare_articles({"train": articles}, vocab_size=vocab_size, max_lines=max_lines)
    return prepared.spec, rows_in_order(prepared, "train", articles)


def measure(fn, seconds: float) -> float:
    """Tokens/s of ``fn`` (an evaluation), repeated whole for at least ``seconds``."""
    start, tokens = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        tokens += fn()["tokens"]
    return tokens / (time.perf_counter() - start)


def page_faults(fn) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=["synthetic", "wikitext2"], default="synthetic")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="least time per row and round")
    parser.add_argument("--vocab", type=int, default=5005)
    parser.add_argument("--hidden", type=int, default=96)
    parser.add_argument("--docs", type=int, default=64)
    parser.add_argument("--max-lines", type=int, default=12, help="wikitext2: paragraphs kept per article")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--segment-len", type=int, default=32)
    args = parser.parse_args(argv)
    load = os.getloadavg()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.corpus == "wikitext2":
        spec, rows = wikitext_rows(args.docs, args.vocab, args.max_lines)
    else:
        spec = VocabSpec(num_words=args.vocab, num_entities=0, shortlist_size=args.vocab, num_subwords=4)
        rows = synthetic_rows(spec, args.docs, sentences=8, length=30)
    layouts = {"sentence lockstep": None, f"chunks of {args.segment_len}": ChunkLayout(args.segment_len)}
    # as evaluation batches them: documents of similar length together, in that order
    batches = {name: list(batch_documents(rows, spec, args.batch_size, seed=None, layout=layout))
               for name, layout in layouts.items()}
    base = dict(type="rnn", embed_dim=args.hidden, hidden_dim=args.hidden, num_layers=1, dropout=0.0,
                embedding="word")
    static = RNNLM(ModelConfig.from_dict(base), spec)
    dyn = dict(fast_params=["output"], meta_hidden_dim=0, segment_len=args.segment_len, eta=3e-3)
    eager = DynamicalLM(ModelConfig.from_dict({**base, "type": "dynamical", "dynamical": dyn}), spec)
    eager.lm.load_state_dict(static.state_dict())
    lockstep = batches["sentence lockstep"]
    stats = collect_grad_stats(static, lockstep[:1], segment_len=args.segment_len, max_segments=20)
    rule = DynamicEvalConfig(lr=3e-3, decay=0.0, segment_len=args.segment_len)
    eager.init_from_dynamic_eval(rule, stats)
    with torch.no_grad():
        eager.meta_learner.gates.weight.normal_(0.0, 0.1)  # a trained-looking meta-learner
    fused = DynamicalLM(ModelConfig.from_dict({**base, "type": "dynamical", "dynamical": {**dyn, "compile_update": True}}),
                        spec)
    fused.load_state_dict(eager.state_dict())
    rational = {}  # the same weights with the rational gate form, eager and compiled
    for label, compiled in (("eager", False), ("compile_update", True)):
        settings = {**dyn, "compile_update": compiled, "gate_form": "rational"}
        rational[label] = DynamicalLM(ModelConfig.from_dict({**base, "type": "dynamical", "dynamical": settings}), spec)
        rational[label].load_state_dict(eager.state_dict())
    start = time.perf_counter()
    for layout_batches in batches.values():
        for model in (fused, rational["compile_update"]):
            evaluate_lm(model, layout_batches[:1])  # compiles (chunk lengths vary: a dynamic-shape kernel too)
    compile_seconds = time.perf_counter() - start
    names = list(eager.adapted_parameter_names().values())
    rows_to_run = []
    for layout, layout_batches in batches.items():
        rows_to_run += [(layout, "static LSTM", lambda b=layout_batches: evaluate_lm(static, b)),
                        (layout, "dynamical LM, compile_update", lambda b=layout_batches: evaluate_lm(fused, b)),
                        (layout, "dynamical LM, eager", lambda b=layout_batches: evaluate_lm(eager, b)),
                        (layout, "dynamical LM, rational gates, compile_update",
                         lambda b=layout_batches: evaluate_lm(rational["compile_update"], b)),
                        (layout, "dynamical LM, rational gates, eager",
                         lambda b=layout_batches: evaluate_lm(rational["eager"], b))]
    rows_to_run.append(("sentence lockstep", "dynamic evaluation, output layer (batch 1)",
                        lambda: dynamic_evaluate(static, lockstep, rule, stats, names=names)))
    speeds = {(layout, label): [] for layout, label, _ in rows_to_run}
    for _ in range(args.rounds):
        for layout, label, fn in rows_to_run:
            speeds[(layout, label)].append(measure(fn, args.seconds))
    faults = {(layout, label): page_faults(fn) for layout, label, fn in rows_to_run}
    tokens = sum(b.num_tokens for b in lockstep)
    print(f"{args.corpus}: {len(rows)} documents, {tokens} tokens, batches of {args.batch_size}, V={spec.output_size}, "
          f"H={args.hidden}, segment {args.segment_len}, {args.threads} thread(s); {args.rounds} rounds of >= "
          f"{args.seconds} s per row; compile {compile_seconds:.1f} s (not timed); load average at the start "
          f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}, at the end " + " / ".join(f"{x:.2f}" for x in os.getloadavg()))
    print("| layout | evaluation | tokens/s (median) | vs. static (median of rounds) | per round | page faults |")
    print("|---|---|---|---|---|---|")
    for (layout, label), values in speeds.items():
        reference = speeds[(layout, "static LSTM")]
        ratios = [v / s for v, s in zip(values, reference)]
        print(f"| {layout} | {label} | {statistics.median(values):.0f} | {statistics.median(ratios):.2f}x | "
              + " ".join(f"{r:.2f}" for r in ratios) + f" | {faults[(layout, label)]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
