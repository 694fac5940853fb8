"""WikiText-2: static LM vs. dynamic evaluation (Krause et al., 2018) vs. the meta-learned
dynamical LM (Wolf et al., 2018), with one budget, in one run.

    python benchmarks/reproduce_dynamical.py                       # small CPU budget (~10 min)
    python benchmarks/reproduce_dynamical.py --device cuda --train-articles 600 --eval-articles 60 \
        --vocab-size 33000 --hidden 256 --static-epochs 6 --meta-steps 600

Articles (level-1 headings) are documents. An LSTM LM is trained on the first
``--train-articles`` training articles for ``--static-epochs`` epochs (theta_0). (c) a DynamicalLM
whose theta starts from theta_0, then theta and phi are meta-trained for ``--meta-steps``
document batches (theta at lr 3e-4). So that all three share one theta training budget, (a) is
theta_0 trained further on theta alone for the same ``--meta-steps`` batches (same batches, same
lr, a fresh Adam like (c)'s) before evaluation, and (b) is (a)'s weights with dynamic evaluation,
eta and lambda picked on validation over a small grid. Validation/test use the first
``--eval-articles`` articles of each split. Writes benchmarks/results/dynamical_wikitext2.md.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from dynlm.data.batching import batch_documents
from dynlm.data.config import DataConfig
from dynlm.data.preprocessor import Preprocessor
from dynlm.data.readers import parse_file
from dynlm.dynamic_eval import DynamicEvalConfig, collect_grad_stats, dynamic_evaluate
from dynlm.models.config import ModelConfig
from dynlm.models.dynamical_lm import DynamicalLM
from dynlm.models.rnn_lm import RNNLM
from dynlm.training import TrainConfig, evaluate, fit, train_step

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "wikitext-2"
META_THETA_LR = 3e-4  # theta's lr during meta-training (c), and in (a)'s matching extra training
DYNEVAL_ETAS = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2]  # (b)'s grid, tuned on validation; wide enough that
DYNEVAL_LAMBDAS = [0.0, 0.01]                  # the best eta is not at its edge (checked in the report)


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
    parser.add_argument("--input-gate-bias", type=float, default=-3.0, help="(c)'s initial input-gate bias")
    parser.add_argument("--forget-gate-bias", type=float, default=3.0, help="(c)'s initial forget-gate bias")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "dynamical_wikitext2.md"))
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

    def extra_training(model, optimizer, cfg):
        """``--meta-steps`` more document batches (epoch seeds 100, 101, ...), one train_step each."""
        nonlocal meta_batches
        step, epoch = 0, 0
        while step < args.meta_steps:
            for batch in train_batches(100 + epoch):
                train_step(model, batch, optimizer, cfg)
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
    print("static", results["static"], flush=True)

    # (b) dynamic evaluation, eta / lambda tuned on validation
    stats = collect_grad_stats(static, train_batches(0)[:4], segment_len=args.segment_len, max_segments=200)
    grid = []
    for lr, decay in itertools.product(DYNEVAL_ETAS, DYNEVAL_LAMBDAS):
        cfg = DynamicEvalConfig(lr=lr, decay=decay, segment_len=args.segment_len)
        grid.append((dynamic_evaluate(static, valid, cfg, stats)["ppl"], cfg))
        print("dyneval grid", lr, decay, grid[-1][0], flush=True)
    best_cfg = min(grid, key=lambda item: item[0])[1]
    results["dyneval"] = [timed_eval(lambda: dynamic_evaluate(static, valid, best_cfg, stats)),
                          timed_eval(lambda: dynamic_evaluate(static, test, best_cfg, stats))]
    print("dyneval", results["dyneval"], flush=True)

    # (c) meta-learned dynamical LM, theta from theta_0 (before (a)'s extra batches)
    dyn_cfg = model_cfg.replace(type="dynamical", dynamical=dict(
        fast_params=["output"], meta_hidden_dim=0, segment_len=args.segment_len, unroll_steps=args.unroll_steps,
        input_gate_bias=args.input_gate_bias, forget_gate_bias=args.forget_gate_bias, meta_lr=3e-3))
    dynamical = DynamicalLM(dyn_cfg, spec).to(device)
    dynamical.lm.load_state_dict(theta_0)
    extra_training(dynamical, torch.optim.Adam(dynamical.param_groups(META_THETA_LR)), meta_cfg)
    results["dynamical"] = [timed_eval(lambda: evaluate(dynamical, valid)), timed_eval(lambda: evaluate(dynamical, test))]
    print("dynamical", results["dynamical"], flush=True)
    total = time.perf_counter() - t_start

    gates = dynamical.meta_learner.gates.bias.detach().cpu().tolist()
    command = "python benchmarks/reproduce_dynamical.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# Dynamical LM on WikiText-2 (static vs. dynamic evaluation vs. meta-learned fast weights)",
        "",
        f"Command: `{command.strip()}` (device {device}, {args.threads} threads, total {total:.0f} s).",
        "",
        f"Budget: first {args.train_articles} train articles, first {args.eval_articles} valid / test articles, "
        f"each cut to its first {args.max_lines or 'all'} paragraphs; target tokens {tokens}; vocabulary "
        f"{spec.output_size} (words off the {args.vocab_size}-word list are `<unk>`). LSTM 1x{args.hidden}, "
        f"{args.static_epochs} epochs (lr 3e-3) give theta_0. Same theta budget for all three: (c) starts "
        f"from theta_0 and meta-trains theta (lr {META_THETA_LR:g}) and phi (lr 3e-3) for {meta_batches} "
        f"batches of {args.batch_size} articles; (a) is theta_0 trained on theta alone for the same "
        f"{meta_batches} batches at lr {META_THETA_LR:g} (fresh Adam, as for (c)), and (b) uses (a)'s "
        f"weights. (c): fast output layer, segment {args.segment_len} tokens, K={args.unroll_steps}, initial "
        f"gate biases {args.input_gate_bias:g} (input) / {args.forget_gate_bias:g} (forget). "
        f"Dynamic evaluation (b): "
        f"eta x lambda grid {{{', '.join(f'{e:g}' for e in DYNEVAL_ETAS)}}} x "
        f"{{{', '.join(f'{d:g}' for d in DYNEVAL_LAMBDAS)}}} on validation, best eta={best_cfg.lr:g}, "
        f"lambda={best_cfg.decay}, segment {best_cfg.segment_len}; RMS statistics from 4 train batches.",
        "",
        "| model | valid ppl | test ppl | eval tokens/s (test) | speed vs. static |",
        "|---|---|---|---|---|",
    ]
    base_speed = results["static"][1][1]
    for name, label in (("static", "(a) static LSTM"), ("dyneval", "(b) static + dynamic evaluation"),
                        ("dynamical", "(c) meta-learned dynamical LM")):
        (v, _), (t, speed) = results[name]
        lines.append(f"| {label} | {v['ppl']:.2f} | {t['ppl']:.2f} | {speed:.0f} | {speed / base_speed:.2f}x |")
    lines += ["", "Dynamic-evaluation grid (valid ppl): " + ", ".join(
        f"eta={c.lr:g}/lambda={c.decay:g}: {p:.2f}" for p, c in grid),
        "", f"Meta-learner gate biases after training (input, forget): {gates[0]:.3f}, {gates[1]:.3f}.",
        "", "Dynamic evaluation reads each article alone (batch 1, weights reset per article), so its "
        "speed is not comparable to the batched (a)/(c)."]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
