"""Evaluation speed of the meta-learned dynamical LM, one change at a time, vs. the static LM.

    python benchmarks/bench_dynamical_speed.py                 # ~2 min on one CPU thread

Seeded random documents (no corpus needed) at the size of the 60-article WikiText-2 setting of
``reproduce_dynamical.py``: vocabulary 5005, LSTM 1x96, fast output layer, segment 32, batches
of ``--batch-size`` documents (8; the static LM and the dynamical LM alike). Each row is ``dynlm.training.evaluate`` tokens/s (best of ``--repeats``):

1. static LSTM (no fast weights);
2. dynamical LM as before this change: output layer through ``theta + theta_hat`` per document
   and an autograd graph built for the update;
3. + output layer as ``decoder(x) + functional_call(decoder, theta_hat)(x)`` (vmap over documents);
4. + the update under ``torch.no_grad``;
5. + the segment's gradient of the output layer in closed form, ``(softmax - onehot)^T h``, no
   autograd at evaluation (the default now; rows 2-4 set ``closed_form_grad_at_eval = False``);
6. + ``compile_update`` (the element-wise update fused by ``torch.compile``; compile time
   excluded, printed apart);
7. + the evaluation update computes the new weights alone: no gate tensors written, and no
   forget gate at all when lambda is 0 (here; it only scales the decay) — the default now; rows
   2-6 compute and return both gates, as the update did before;
8. + the fast output product as one ``baddbmm`` onto ``decoder(x)`` instead of vmap over
   ``functional_call`` (the default now; rows 3-7 use the vmap form);
9. the same without ``compile_update`` (eager);
10. dynamic evaluation (Krause et al.) of the output layer alone, for reference (one document at a time).

Rows 2, 3, rows 3-7's output layer and rows 2-6's update re-create the former code paths by patching this process only.
Every row has two later changes that are not toggled: a segment's later chunks add their
gradient inside the product (``baddbmm``), and no zero gradient tensors are made per segment.
"""

from __future__ import annotations

import argparse
import os
import time
from contextlib import contextmanager
from unittest import mock

import torch
from torch.func import functional_call, vmap

import dynlm.models.dynamical_lm as dynamical_module
from dynlm.data.batching import collate_documents
from dynlm.dynamic_eval import DynamicEvalConfig, collect_grad_stats, dynamic_evaluate
from dynlm.models.config import ModelConfig
from dynlm.models.dynamical_lm import DynamicalLM
from dynlm.models.rnn_lm import RNNLM
from dynlm.modules.fast_weights import per_document_call
from dynlm.training import evaluate
from dynlm.vocab_spec import VocabSpec


def random_batches(spec: VocabSpec, num_docs: int, sentences: int, length: int, batch_size: int, seed: int = 0):
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
    return [collate_documents(rows[i:i + batch_size], spec) for i in range(0, num_docs, batch_size)]


def tokens_per_second(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        metrics = fn()
        best = min(best, time.perf_counter() - start)
    return metrics["tokens"] / best


@contextmanager
def former_output_layer():
    """The output layer as it was: ``functional_call(decoder, theta + theta_hat[b])(x[b])``."""
    def theta_plus_delta(linear, x, delta_weight, delta_bias):
        return per_document_call(linear, {"weight": delta_weight, "bias": delta_bias}, x)
    with mock.patch.object(dynamical_module, "fast_linear", theta_plus_delta):
        yield


@contextmanager
def vmap_output_layer():
    """The output layer as it was before the direct product: ``decoder(x) + vmap(functional_call(
    decoder, theta_hat[b]))(x[b])``."""
    def vmapped(linear, x, delta_weight, delta_bias):
        def one_document(deltas_b, x_b):
            return functional_call(linear, deltas_b, (x_b,))
        return linear(x) + vmap(one_document)({"weight": delta_weight, "bias": delta_bias}, x)
    with mock.patch.object(dynamical_module, "fast_linear", vmapped):
        yield


@contextmanager
def update_with_graph():
    """The update as it was at evaluation: under autograd (a graph that is then dropped)."""
    original = DynamicalLM._update

    def with_graph(self, *args, **kwargs):
        with torch.enable_grad():
            return original(self, *args, **kwargs)
    with mock.patch.object(DynamicalLM, "_update", with_graph):
        yield


@contextmanager
def former_update():
    """The evaluation update as it was: both gates computed and returned (eager, or compiled with
    the gates as outputs of the fused kernel), the forget gate even when lambda is 0."""
    compiled = torch.compile(dynamical_module._update_tensors)

    def eager(meta_learner, fast, summed_grad, tokens, loss, prior, decays):
        return dynamical_module._update_tensors(meta_learner, fast, summed_grad, tokens, loss, prior)[0]

    def fused(meta_learner, fast, summed_grad, tokens, loss, prior, decays):
        return compiled(meta_learner, fast, summed_grad, tokens, loss, prior)[0]
    with (mock.patch.object(dynamical_module, "_updated_tensor", eager),
          mock.patch.object(DynamicalLM, "_compiled_update", lambda self: fused)):
        yield


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=5005)
    parser.add_argument("--hidden", type=int, default=96)
    parser.add_argument("--docs", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)
    load = os.getloadavg()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    spec = VocabSpec(num_words=args.vocab, num_entities=0, shortlist_size=args.vocab, num_subwords=4)
    batches = random_batches(spec, args.docs, sentences=8, length=30, batch_size=args.batch_size)
    base = dict(type="rnn", embed_dim=args.hidden, hidden_dim=args.hidden, num_layers=1, dropout=0.0,
                embedding="word")
    static = RNNLM(ModelConfig.from_dict(base), spec)
    dyn_cfg = ModelConfig.from_dict({**base, "type": "dynamical", "dynamical": dict(
        fast_params=["output"], meta_hidden_dim=0, segment_len=32, eta=3e-3)})
    model = DynamicalLM(dyn_cfg, spec)
    model.lm.load_state_dict(static.state_dict())
    stats = collect_grad_stats(static, batches[:1], segment_len=32, max_segments=20)
    rule = DynamicEvalConfig(lr=3e-3, decay=0.0, segment_len=32)
    model.init_from_dynamic_eval(rule, stats)
    with torch.no_grad():
        model.meta_learner.gates.weight.normal_(0.0, 0.1)  # a trained-looking meta-learner
    rows = [("static LSTM", tokens_per_second(lambda: evaluate(static, batches), args.repeats))]
    fused = DynamicalLM(dyn_cfg.replace(dynamical={**dyn_cfg.dynamical.to_dict(), "compile_update": True}), spec)
    fused.load_state_dict(model.state_dict())
    with former_update():
        model.closed_form_grad_at_eval = False  # rows 2-4: the gradient through autograd, as before
        with former_output_layer(), update_with_graph():
            rows.append(("dynamical, former: theta + theta_hat, update with graph",
                         tokens_per_second(lambda: evaluate(model, batches), args.repeats)))
        with vmap_output_layer():
            with update_with_graph():
                rows.append(("+ decoder(x) + functional_call(decoder, theta_hat)(x)",
                             tokens_per_second(lambda: evaluate(model, batches), args.repeats)))
            rows.append(("+ update under no_grad",
                         tokens_per_second(lambda: evaluate(model, batches), args.repeats)))
            model.closed_form_grad_at_eval = True
            rows.append(("+ closed-form output-layer gradient, no autograd",
                         tokens_per_second(lambda: evaluate(model, batches), args.repeats)))
            evaluate(fused, batches[:1])  # compiles the former fused update
            rows.append(("+ compile_update (fused update, both gates returned)",
                         tokens_per_second(lambda: evaluate(fused, batches), args.repeats)))
    start = time.perf_counter()
    with vmap_output_layer():
        evaluate(fused, batches[:1])
        compile_seconds = time.perf_counter() - start
        rows.append(("+ the new weights alone, no forget gate at lambda = 0",
                     tokens_per_second(lambda: evaluate(fused, batches), args.repeats)))
    rows.append(("+ the fast output product as one baddbmm (default)",
                 tokens_per_second(lambda: evaluate(fused, batches), args.repeats)))
    rows.append(("the same without compile_update (eager)",
                 tokens_per_second(lambda: evaluate(model, batches), args.repeats)))
    names = list(model.adapted_parameter_names().values())
    rows.append(("dynamic evaluation, output layer (batch 1)", tokens_per_second(
        lambda: dynamic_evaluate(static, batches, rule, stats, names=names), args.repeats)))
    print(f"{args.docs} documents x 8 sentences x 32 positions, batches of {args.batch_size}, V={args.vocab}, H={args.hidden}, "
          f"{args.threads} thread(s), best of {args.repeats}; compile_update compiled in {compile_seconds:.1f} s; "
          f"load average at the start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}, at the end "
          + " / ".join(f"{x:.2f}" for x in os.getloadavg()))
    print("| evaluation | tokens/s | vs. static |")
    print("|---|---|---|")
    for label, speed in rows:
        print(f"| {label} | {speed:.0f} | {speed / rows[0][1]:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
