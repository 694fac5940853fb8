"""WikiText-2: static LM vs. dynamic evaluation (Krause et al., 2018) vs. the meta-learned
dynamical LM (Wolf et al., 2018), with one budget, in one run.

    python benchmarks/reproduce_dynamical.py                       # small CPU budget (~10 min)
    python benchmarks/reproduce_dynamical.py --device cuda --train-articles 600 --eval-articles 60 \
        --vocab-size 33000 --hidden 256 --static-epochs 6 --meta-steps 600 --compile-update

Articles (level-1 headings) are documents. An LSTM LM is trained on the first
``--train-articles`` training articles for ``--static-epochs`` epochs (theta_0). (c) a DynamicalLM
whose theta starts from theta_0 and whose update rule starts as dynamic evaluation of the
output layer (RMS statistics of theta_0, eta / lambda picked on validation: row (c0), equal to
that dynamic evaluation before any meta-training), then theta and phi are meta-trained for
``--meta-steps`` document batches (theta at lr 3e-4, unroll ``--unroll-steps``; the gate
statistics of every step are kept). So that all three share one theta training budget, (a) is
theta_0 trained further on theta alone for the same ``--meta-steps`` batches (same batches, same
lr, a fresh Adam like (c)'s) before evaluation, and (b) is (a)'s weights with dynamic evaluation,
eta and lambda picked on validation over a small grid. Validation/test use the first
``--eval-articles`` articles of each split. Writes one dated report section to ``--out``
(default: a scratch file; benchmarks/results/dynamical_wikitext2.md collects the sections).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from dynlm.data.batching import batch_documents
from dynlm.data.config import DataConfig
from dynlm.data.preprocessor import Preprocessor
from dynlm.data.readers import parse_file
from dynlm.dynamic_eval import choose_dynamic_eval, collect_grad_stats, dynamic_evaluate
from dynlm.models.config import ModelConfig
from dynlm.models.dynamical_lm import DynamicalLM
from dynlm.models.rnn_lm import RNNLM
from dynlm.training import TrainConfig, evaluate, fit, train_step

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "wikitext-2"
META_THETA_LR = 3e-4  # theta's lr during meta-training (c), and in (a)'s matching extra training
DYNEVAL_ETAS = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1]  # (b)'s and (c0)'s grid, tuned on validation; wide
DYNEVAL_LAMBDAS = [0.0, 0.01]                        # enough that the best eta is not at its edge (see the report)


def read_articles(split: str, limit: int, data_dir: Path = DATA) -> list[dict]:
    path = Path(data_dir) / f"{split}.txt.gz"
    docs = [d for d in parse_file(path.read_bytes(), str(path), "text") if isinstance(d, dict)]
    return docs[:limit]


def timed_eval(fn):
    start = time.perf_counter()
    metrics = fn()
    seconds = time.perf_counter() - start
    return metrics, metrics["tokens"] / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=DATA, help="folder with WikiText-2 {train,valid,test}.txt.gz")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--train-articles", type=int, default=20)
    parser.add_argument("--eval-articles", type=int, default=3)
    parser.add_argument("--max-lines", type=int, default=6, help="paragraphs kept per article (0: all)")
    parser.add_argument("--vocab-size", type=int, default=3000)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--static-epochs", type=int, default=2)
    parser.add_argument("--meta-steps", type=int, default=20)
    parser.add_argument("--segment-len", type=int, default=32)
    parser.add_argument("--unroll-steps", type=int, default=4)
    parser.add_argument("--meta-lr", type=float, default=3e-3, help="(c)'s outer learning rate of phi")
    parser.add_argument("--compile-update", action="store_true", help="(c): torch.compile'd update at evaluation")
    parser.add_argument("--first-order", action="store_true", help="(c): meta-gradients without second derivatives")
    parser.add_argument("--out", default=str(REPO / "runs" / "dynamical_wikitext2.section.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    t_start = time.perf_counter()

    def clip(docs):
        if args.max_lines:
            for d in docs:
                d["sentences"] = d["sentences"][: args.max_lines]
        return docs

    train_docs = clip(read_articles("train", args.train_articles, args.data_dir))
    valid_docs = clip(read_articles("valid", args.eval_articles, args.data_dir))
    test_docs = clip(read_articles("test", args.eval_articles, args.data_dir))
    counts = Counter(w for d in train_docs for s in d["sentences"] for w in s)
    pre = Preprocessor.fit(dict(counts), DataConfig(inputs=["wikitext-2"], vocab_size=args.vocab_size,
                                                   gamma=1.0, bpe_merges=0, max_chains=1))
    spec = pre.spec

    def encode(docs):
        return [{"doc_id": d["doc_id"], "source_file": d["source_file"], **pre.encode_document(d["sentences"])}
                for d in docs]

    train_rows, valid_rows, test_rows = encode(train_docs), encode(valid_docs), encode(test_docs)
    train_batches = lambda epoch: [b.to(device) for b in batch_documents(train_rows, spec, args.batch_size, seed=epoch)]
    valid = [b.to(device) for b in batch_documents(valid_rows, spec, args.batch_size, seed=None)]
    test = [b.to(device) for b in batch_documents(test_rows, spec, args.batch_size, seed=None)]
    tokens = {name: sum(r["num_tokens"] - len(r["sentence_lengths"]) for r in rows)
              for name, rows in (("train", train_rows), ("valid", valid_rows), ("test", test_rows))}
    print(f"data: {tokens} target tokens, vocab {spec.output_size}", flush=True)

    meta_batches = 0  # document batches of the extra training on theta, counted once for (a) and (c)

    def extra_training(model, optimizer, cfg, gate_steps=None):
        """``--meta-steps`` more document batches (epoch seeds 100, 101, ...), one train_step each;
        ``gate_steps`` receives each step's gate statistics (the dynamical LM)."""
        nonlocal meta_batches
        step, epoch = 0, 0
        while step < args.meta_steps:
            for batch in train_batches(100 + epoch):
                out = train_step(model, batch, optimizer, cfg)
                if gate_steps is not None:
                    gate_steps.append({k: v for k, v in out.items() if k.startswith("gate_")})
                step += 1
                if step >= args.meta_steps:
                    break
            epoch += 1
        meta_batches = step

    # (a) static LM: theta_0 after fit, then the extra batches on theta alone (the budget (c) gets)
    model_cfg = ModelConfig.from_dict(dict(type="rnn", embed_dim=args.hidden, hidden_dim=args.hidden,
                                           num_layers=1, dropout=0.2, embedding="word"))
    static = RNNLM(model_cfg, spec).to(device)
    train_cfg = TrainConfig(lr=3e-3, epochs=args.static_epochs, batch_size=args.batch_size, bptt_sentences=2,
                            early_stopping_patience=0)
    fit(static, train_batches, lambda: valid, train_cfg)
    theta_0 = copy.deepcopy(static.state_dict())  # (c) starts here
    meta_cfg = train_cfg.replace(bptt_sentences=2)
    extra_training(static, torch.optim.Adam(static.parameters(), lr=META_THETA_LR), meta_cfg)
    results = {}
    results["static"] = [timed_eval(lambda: evaluate(static, valid)), timed_eval(lambda: evaluate(static, test))]
    print("static", [(m["ppl"], speed) for m, speed in results["static"]], flush=True)

    # (b) dynamic evaluation, eta / lambda tuned on validation
    stats = collect_grad_stats(static, train_batches(0)[:4], segment_len=args.segment_len, max_segments=200)
    best_cfg, grid = choose_dynamic_eval(static, valid, stats, etas=DYNEVAL_ETAS, lambdas=DYNEVAL_LAMBDAS,
                                         segment_len=args.segment_len)
    print("dyneval grid", [(g["eta"], g["lambda"], round(g["ppl"], 2)) for g in grid], flush=True)
    results["dyneval"] = [timed_eval(lambda: dynamic_evaluate(static, valid, best_cfg, stats)),
                          timed_eval(lambda: dynamic_evaluate(static, test, best_cfg, stats))]
    print("dyneval", [(m["ppl"], speed) for m, speed in results["dyneval"]], flush=True)

    # (c) meta-learned dynamical LM, theta from theta_0 (before (a)'s extra batches), its rule
    # started at dynamic evaluation of the output layer of theta_0 (eta / lambda on validation)
    dyn_cfg = model_cfg.replace(type="dynamical", dynamical=dict(
        fast_params=["output"], meta_hidden_dim=0, segment_len=args.segment_len, unroll_steps=args.unroll_steps,
        meta_lr=args.meta_lr, compile_update=args.compile_update, first_order=args.first_order))
    dynamical = DynamicalLM(dyn_cfg, spec).to(device)
    dynamical.lm.load_state_dict(theta_0)
    output_names = list(dynamical.adapted_parameter_names().values())
    stats_0 = collect_grad_stats(dynamical.lm, train_batches(0)[:4], segment_len=args.segment_len, max_segments=200)
    init_cfg, init_grid = choose_dynamic_eval(dynamical.lm, valid, stats_0, etas=DYNEVAL_ETAS,
                                              lambdas=DYNEVAL_LAMBDAS, segment_len=args.segment_len,
                                              names=output_names)
    dynamical.init_from_dynamic_eval(init_cfg, stats_0)
    if args.compile_update:  # compile once, outside the timed evaluations
        start = time.perf_counter()
        evaluate(dynamical, valid[:1])
        compile_seconds = time.perf_counter() - start
    results["init"] = [timed_eval(lambda: evaluate(dynamical, valid)), timed_eval(lambda: evaluate(dynamical, test))]
    check = dynamic_evaluate(dynamical.lm, test, init_cfg, stats_0, names=output_names)
    print("dynamical at init", [(m["ppl"], speed) for m, speed in results["init"]],
          "output-layer dynamic evaluation", check["ppl"], flush=True)
    gate_steps = []
    extra_training(dynamical, torch.optim.Adam(dynamical.param_groups(META_THETA_LR)), meta_cfg, gate_steps)
    results["dynamical"] = [timed_eval(lambda: evaluate(dynamical, valid)), timed_eval(lambda: evaluate(dynamical, test))]
    print("dynamical", [(m["ppl"], speed) for m, speed in results["dynamical"]], flush=True)
    total = time.perf_counter() - t_start

    command = "python benchmarks/reproduce_dynamical.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        f"## {time.strftime('%Y-%m-%d')}: meta-learner started at dynamic evaluation",
        "",
        f"Command: `{command.strip()}` (device {device}, {args.threads} threads, total {total:.0f} s).",
        "",
        f"Budget: first {args.train_articles} train articles, first {args.eval_articles} valid / test articles, "
        f"each cut to its first {args.max_lines or 'all'} paragraphs; target tokens {tokens}; vocabulary "
        f"{spec.output_size} (words off the {args.vocab_size}-word list are `<unk>`). LSTM 1x{args.hidden}, "
        f"{args.static_epochs} epochs (lr 3e-3) give theta_0. Same theta budget for all three: (c) starts "
        f"from theta_0 and meta-trains theta (lr {META_THETA_LR:g}) and phi (lr {args.meta_lr:g}) for "
        f"{meta_batches} batches of {args.batch_size} articles; (a) is theta_0 trained on theta alone for the "
        f"same {meta_batches} batches at lr {META_THETA_LR:g} (fresh Adam, as for (c)), and (b) uses (a)'s "
        f"weights. (c): fast output layer, segment {args.segment_len} tokens, K={args.unroll_steps}, linear "
        f"gates, {'first' if args.first_order else 'second'}-order meta-gradients; its rule starts as dynamic evaluation of theta_0's output layer with eta={init_cfg.lr:g}, "
        f"lambda={init_cfg.decay:g} (picked on validation over the same grid; row (c0)). Dynamic evaluation "
        f"(b), all weights: eta x lambda grid {{{', '.join(f'{e:g}' for e in DYNEVAL_ETAS)}}} x "
        f"{{{', '.join(f'{d:g}' for d in DYNEVAL_LAMBDAS)}}} on validation, best eta={best_cfg.lr:g}, "
        f"lambda={best_cfg.decay:g}, segment {best_cfg.segment_len}; RMS statistics from 4 train batches"
        + (f". (c) uses compile_update (compiled in {compile_seconds:.0f} s, not in its speed)." if args.compile_update else "."),
        "",
        "| model | valid ppl | test ppl | eval tokens/s (test) | speed vs. static |",
        "|---|---|---|---|---|",
    ]
    base_speed = results["static"][1][1]
    for name, label in (("static", "(a) static LSTM"), ("dyneval", "(b) static + dynamic evaluation"),
                        ("init", "(c0) dynamical LM before meta-training (= output-layer dynamic evaluation of theta_0)"),
                        ("dynamical", "(c) meta-learned dynamical LM")):
        (v, _), (t, speed) = results[name]
        lines.append(f"| {label} | {v['ppl']:.2f} | {t['ppl']:.2f} | {speed:.0f} | {speed / base_speed:.2f}x |")
    fmt_grid = lambda g: ", ".join(f"eta={p['eta']:g}/lambda={p['lambda']:g}: {p['ppl']:.2f}" for p in g)  # noqa: E731
    first, last = gate_steps[0], gate_steps[-1]
    lines += ["", f"Check (c0): `dynamic_evaluate` of theta_0's output layer with the same rule gives test ppl "
              f"{check['ppl']:.4f} (row (c0): {results['init'][1][0]['ppl']:.4f}).",
              "", "(b) grid (valid ppl): " + fmt_grid(grid),
              "", "(c0) grid, output layer of theta_0 (valid ppl): " + fmt_grid(init_grid),
              "", "Gates during meta-training (mean / std over coordinates and updates), first -> last step: "
              f"input {first['gate_input_mean']:.3f}/{first['gate_input_std']:.3f} -> "
              f"{last['gate_input_mean']:.3f}/{last['gate_input_std']:.3f}, forget "
              f"{first['gate_forget_mean']:.3f}/{first['gate_forget_std']:.3f} -> "
              f"{last['gate_forget_mean']:.3f}/{last['gate_forget_std']:.3f}.",
              "", "Dynamic evaluation reads each article alone (batch 1, weights reset per article), so its "
              "speed is not comparable to the batched (a)/(c)."]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
