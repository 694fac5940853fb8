"""WikiText-2: static LM vs. dynamic evaluation (Krause et al., 2018) vs. the meta-learned
dynamical LM (Wolf et al., 2018), with one budget, in one run.

    python -m benchmarks.reproduce_dynamical                       # small CPU budget (~1.5 min, 1 thread)
    python -m benchmarks.reproduce_dynamical --seed 1               # another static fit and batch order
    python -m benchmarks.reproduce_dynamical --train-articles 60 --max-lines 12 --eval-articles 6 \
        --vocab-size 5000 --hidden 96 --meta-steps 40                # 60 articles (~15 min, 1 thread)
    python -m benchmarks.reproduce_dynamical --train-articles 200 --meta-articles 320 --max-lines 12 \
        --eval-articles 10 --vocab-size 8000 --hidden 128 --meta-steps 40  # 200 articles, held-out meta-training (~45 min)
    python -m benchmarks.reproduce_dynamical --device cuda --train-articles 600 --eval-articles 60 \
        --vocab-size 33000 --hidden 256 --meta-steps 600

(c) uses the rational gate form and the compiled update by default (``--gate-form log_sigmoid``,
``--no-compile-update``: the former rule and the eager update).

Articles (level-1 headings) are documents. An LSTM LM is trained on the first
``--train-articles`` training articles for at most ``--static-epochs`` epochs; the best valid
epoch is theta_0 (early stopping, ``--patience``). (c) a DynamicalLM whose theta starts from
theta_0 and whose update rule starts as dynamic evaluation of its ``--fast-params`` weights
(RMS statistics of theta_0, eta / lambda picked on validation: row (c0), equal to that dynamic
evaluation before any meta-training), then phi (and theta at lr 3e-4 unless ``--freeze-theta``)
is meta-trained on the documents of ``--meta-steps`` batches of ``--batch-size``, read in
batches of ``--meta-batch-size`` (default 1: lockstep batches over padded paragraphs would update
less often per token than evaluation does), unroll ``--unroll-steps``; the gate statistics of
every step are kept. With ``--meta-articles N`` the meta-training documents are the next N
training articles, which theta_0 never saw (otherwise theta_0's own articles, which it already
fits better than valid: the rule then learns to adapt to text it knows). So that all three share
one theta budget, (a) is theta_0 trained further on theta alone on the same documents in the
same batches (same lr, a fresh Adam like (c)'s) before evaluation, and (b) is (a)'s weights with dynamic evaluation, eta and lambda picked on
validation over a small grid. With ``--select-every N`` (default) (a) and (c) keep the weights of
their best valid ppl among step 0 and every N batches (validation-based selection, also of phi).
Validation/test use the first ``--eval-articles`` articles of each split, read one article at a
time by all three (``--eval-batch-size 1``). The articles are prepared by the library
(:mod:`benchmarks.wikitext`: the vocabulary fitted on the train articles, ``--max-lines``
paragraphs each); theta_0's fit, (a)'s extra training and (c)'s meta-training are built by the
runner (:func:`dynlm.runner.local_run`: model, optimizer, schedule and batches, as ``dynlm train
--local`` builds them). Writes one dated report section to ``--out``
(default: a scratch file; benchmarks/results/dynamical_wikitext2.md collects the sections).
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from itertools import islice
from pathlib import Path

import torch

from benchmarks.common import REPO, command_line, evaluation_batches, prepared_job
from benchmarks.wikitext import DATA, prepare_articles, read_articles, rows_in_order
from dynlm.data.batching import ChunkLayout
from dynlm.dynamic_eval import choose_dynamic_eval, collect_grad_stats, dynamic_evaluate
from dynlm.models.config import ModelConfig
from dynlm.runner import RankRun, local_run
from dynlm.tasks.lm import LMTask
from dynlm.tasks.lm_evaluation import evaluate_lm
from dynlm.train_config import TrainConfig
from dynlm.training import train_step

LM_TASK = LMTask()

META_THETA_LR = 3e-4  # theta's lr during meta-training (c), and in (a)'s matching extra training
# (b)'s and (c0)'s grid, tuned on validation: wide enough that the best eta is not at its edge, and
# fine around the best values seen (3e-3, 4e-3), so that (c) is not ahead for want of a better eta of (b)
DYNEVAL_ETAS = [3e-4, 1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3, 8e-3, 1e-2, 3e-2, 1e-1]
DYNEVAL_LAMBDAS = [0.0, 0.01]


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
    parser.add_argument("--batch-size", type=int, default=8, help="documents per training batch")
    parser.add_argument("--eval-batch-size", type=int, default=1,
                        help="documents per evaluation batch of (a) and (c); 1 = each article alone, as dynamic "
                             "evaluation reads them (batched documents move in lockstep over padded positions, "
                             "so a batched (c) updates less often per token than (b))")
    parser.add_argument("--meta-batch-size", type=int, default=1,
                        help="documents per meta-training batch of (c); the same documents are read as in "
                             "(a)'s --meta-steps batches of --batch-size (1: segments fall where they fall at evaluation)")
    parser.add_argument("--fast-params", default="output",
                        help="(c)'s fast weights, comma-separated from output, embedding, recurrent")
    parser.add_argument("--static-epochs", type=int, default=12,
                        help="at most this many epochs give theta_0 (the best valid epoch is kept)")
    parser.add_argument("--patience", type=int, default=2, help="theta_0's early stopping (epochs without a better valid ppl)")
    parser.add_argument("--meta-steps", type=int, default=40)
    parser.add_argument("--meta-articles", type=int, default=0,
                        help="the extra training of (a) and (c) reads the next N training articles, held out from "
                             "theta_0's fit (0: the --train-articles that theta_0 was fitted on)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the runs' train.seed: the initial weights and the order of the batches "
                             "(dynlm.runner's seeds; the reports before the runner drew other batch orders)")
    parser.add_argument("--segment-len", type=int, default=32)
    parser.add_argument("--eval-layout", choices=["segments", "sentences"], default="segments",
                        help="valid / test read in chunks of --segment-len positions, or sentence by sentence")
    parser.add_argument("--dyneval-etas", type=lambda text: [float(x) for x in text.split(",")], default=DYNEVAL_ETAS,
                        help="comma-separated eta grid of (b) and (c0), picked on validation")
    parser.add_argument("--unroll-steps", type=int, default=4)
    parser.add_argument("--meta-bptt", type=int, default=2,
                        help="(c): paragraphs per meta-training chunk (one optimizer step; the unroll is cut there too)")
    parser.add_argument("--meta-lr", type=float, default=3e-3, help="(c)'s outer learning rate of phi")
    parser.add_argument("--compile-update", action=argparse.BooleanOptionalAction, default=True,
                        help="(c): torch.compile'd update at evaluation (needs a C compiler on a CPU; the "
                             "perplexities are the same without it)")
    parser.add_argument("--gate-form", choices=["log_sigmoid", "rational"], default="rational",
                        help="(c): the meta-learner's gates (model.dynamical.gate_form); both gave the same "
                             "perplexities at the small size (seed 0); rational evaluates 1.25-1.45x faster compiled")
    parser.add_argument("--first-order", action="store_true", help="(c): meta-gradients without second derivatives")
    parser.add_argument("--freeze-theta", action="store_true",
                        help="(c): meta-train phi alone, theta stays theta_0 (and (a) gets no extra training)")
    parser.add_argument("--meta-dropout", type=float, default=None,
                        help="(c): dropout during meta-training (default: the static LM's 0.2)")
    parser.add_argument("--select-every", type=int, default=5,
                        help="evaluate valid every N extra / meta-steps (and at step 0) and keep the best "
                             "weights, for (a) and (c) alike (0: keep the last)")
    parser.add_argument("--out", default=str(REPO / "runs" / "dynamical_wikitext2.section.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    t_start = time.perf_counter()

    train_articles = read_articles("train", args.train_articles + args.meta_articles, args.data_dir)
    train_articles, held_out_articles = train_articles[: args.train_articles], train_articles[args.train_articles:]
    prepared = prepare_articles({"train": train_articles, "valid": read_articles("valid", args.eval_articles, args.data_dir),
                                 "test": read_articles("test", args.eval_articles, args.data_dir)},
                                vocab_size=args.vocab_size, max_lines=args.max_lines)
    spec = prepared.spec
    # what the extra training of (a) and (c) reads: theta_0's own articles, or articles it never saw
    # (then the train split of a folder of their own, encoded with theta_0's vocabulary)
    meta_articles = held_out_articles if args.meta_articles else train_articles
    meta_prepared = prepare_articles({"train": held_out_articles}, vocab_size=args.vocab_size, max_lines=args.max_lines,
                                     preprocessor=prepared.preprocessor) if args.meta_articles else prepared
    meta_rows = rows_in_order(meta_prepared, "train", meta_articles)
    rows = {split: list(prepared.iter_rows(split)) for split in ("train", "valid", "test")}
    # evaluation reads each article in chunks of one segment (a segment that spans sentences is then
    # one product with the fast weights, not one per sentence), or sentence by sentence
    eval_layout = ChunkLayout(args.segment_len) if args.eval_layout == "segments" else None
    valid = evaluation_batches(LM_TASK, rows["valid"], spec, args.eval_batch_size, layout=eval_layout, device=device)
    test = evaluation_batches(LM_TASK, rows["test"], spec, args.eval_batch_size, layout=eval_layout, device=device)
    tokens = {name: sum(r["num_tokens"] - len(r["sentence_lengths"]) for r in split_rows)
              for name, split_rows in (*rows.items(), *((("meta", meta_rows),) if args.meta_articles else ()))}
    print(f"data: {prepared.root}, {tokens} target tokens, vocab {spec.output_size}", flush=True)

    meta_batches = 0  # document batches of the extra training on theta, counted once for (a) and (c)
    # the extra training's objective, measured in eval mode (no dropout) on the first 2 x --batch-size
    # articles that it reads
    train_probe = evaluation_batches(LM_TASK, meta_rows[: 2 * args.batch_size], spec, 1, device=device)

    def extra_training(run: RankRun, gate_steps=None, curve=None):
        """``--meta-steps`` more document batches of ``run`` (its train epochs 1, 2, ... in turn), one
        train_step each of its model, optimizer and schedule; ``gate_steps`` receives each step's
        gate statistics (the dynamical LM). With ``--select-every N`` the model is evaluated on
        valid (and on ``train_probe``) at step 0 and every N steps; it ends with the weights of the
        best valid ppl (step 0 included), and ``curve`` receives ``(step, train-probe ppl, valid
        ppl, train_step loss)`` rows."""
        nonlocal meta_batches
        model, cfg = run.model, run.job.train
        batch_size = cfg.batch_size
        total = args.meta_steps * args.batch_size // batch_size  # the same number of documents
        every = max(1, args.select_every * args.batch_size // batch_size)
        step, epoch, losses = 0, 0, []
        best = [float("inf"), 0, None]  # valid ppl, step, state dict

        def checkpoint_on_valid():
            v = evaluate_lm(model, valid)["ppl"]
            per_doc = [evaluate_lm(model, [b]) for b in train_probe]  # one article per batch (eval batch 1)
            tr = math.exp(sum(m["loss"] * m["tokens"] for m in per_doc) / sum(m["tokens"] for m in per_doc))
            doc_mean = sum(m["loss"] for m in per_doc) / len(per_doc)  # what a step of a whole article minimises
            recent = sum(losses[-every:]) / len(losses[-every:]) if losses else float("nan")
            if curve is not None:
                curve.append((step, tr, v, recent, doc_mean))
            print(f"  step {step}: train-probe ppl {tr:.2f} (mean loss per article {doc_mean:.4f}) valid ppl {v:.2f} "
                  f"train_step loss {recent:.3f}", flush=True)
            if v < best[0]:
                best[:] = [v, step, copy.deepcopy(model.state_dict())]

        if args.select_every:
            checkpoint_on_valid()
        while step < total:
            epoch += 1
            for batch in run.train_batches(epoch):
                out = train_step(run.task, model, batch.to(device), run.optimizer, cfg, scheduler=run.schedule)
                losses.append(out["loss"])
                gates = out["stats"]  # the dynamical LM's gate statistics
                if gate_steps is not None and gates:  # a short document may end before its first update
                    gate_steps.append(gates)
                step += 1
                if args.select_every and (step % every == 0 or step >= total):
                    checkpoint_on_valid()
                if step >= total:
                    break
        meta_batches = step * batch_size // args.batch_size
        if args.select_every:
            model.load_state_dict(best[2])
        return best[1]

    # (a) static LM: theta_0 after fit, then the extra batches on theta alone (the budget (c) gets)
    model_cfg = ModelConfig.from_dict(dict(type="rnn", embed_dim=args.hidden, hidden_dim=args.hidden,
                                           num_layers=1, dropout=0.2, embedding="word"))
    train_cfg = TrainConfig(bptt_tokens=0, lr_schedule="cosine", lr=3e-3, epochs=args.static_epochs, batch_size=args.batch_size,
                            bptt_sentences=2, early_stopping_patience=args.patience, seed=args.seed)
    static_run = local_run(prepared_job(prepared, model_cfg, train_cfg), prepared, device=device)
    fitted = static_run.fit()  # the best valid epoch's weights kept
    static = static_run.model
    print(f"theta_0: epoch {fitted['best_epoch']} of {fitted['epochs_run']} (best valid ppl)", flush=True)
    theta_0 = copy.deepcopy(static.state_dict())  # (c) starts here
    # the extra training of (a) and (c): a fresh Adam at a constant rate, in batches of --meta-batch-size
    meta_cfg = train_cfg.replace(lr=META_THETA_LR, lr_schedule="constant", batch_size=args.meta_batch_size,
                                 early_stopping_patience=0)
    static_curve = []
    static_pick = 0
    if not args.freeze_theta:
        extra_run = local_run(prepared_job(meta_prepared, model_cfg, meta_cfg), meta_prepared, device=device)
        extra_run.model.load_state_dict(theta_0)
        static_pick = extra_training(extra_run, curve=static_curve)
        static = extra_run.model
    results = {}
    results["static"] = [timed_eval(lambda: evaluate_lm(static, valid)), timed_eval(lambda: evaluate_lm(static, test))]
    print("static", [(m["ppl"], speed) for m, speed in results["static"]], flush=True)
    # RMS statistics of (b) and (c0): the first 4 batches of the static fit's first epoch
    statistics_batches = [batch.to(device) for batch in islice(static_run.train_batches(1), 4)]

    # (b) dynamic evaluation, eta / lambda tuned on validation
    stats = collect_grad_stats(static, statistics_batches, segment_len=args.segment_len, max_segments=200)
    best_cfg, grid = choose_dynamic_eval(static, valid, stats, etas=args.dyneval_etas, lambdas=DYNEVAL_LAMBDAS,
                                         segment_len=args.segment_len)
    print("dyneval grid", [(g["eta"], g["lambda"], round(g["ppl"], 2)) for g in grid], flush=True)
    results["dyneval"] = [timed_eval(lambda: dynamic_evaluate(static, valid, best_cfg, stats)),
                          timed_eval(lambda: dynamic_evaluate(static, test, best_cfg, stats))]
    print("dyneval", [(m["ppl"], speed) for m, speed in results["dyneval"]], flush=True)

    # (c) meta-learned dynamical LM, theta from theta_0 (before (a)'s extra batches), its rule
    # started at dynamic evaluation of the output layer of theta_0 (eta / lambda on validation)
    meta_dropout = model_cfg.dropout if args.meta_dropout is None else args.meta_dropout
    dyn_cfg = model_cfg.replace(type="dynamical", dropout=meta_dropout, dynamical=dict(
        fast_params=args.fast_params.split(","), meta_hidden_dim=0, segment_len=args.segment_len, unroll_steps=args.unroll_steps,
        meta_lr=args.meta_lr, compile_update=args.compile_update, first_order=args.first_order,
        gate_form=args.gate_form))
    dynamical_run = local_run(prepared_job(meta_prepared, dyn_cfg, meta_cfg.replace(bptt_sentences=args.meta_bptt)),
                              meta_prepared, device=device)
    dynamical = dynamical_run.model  # its optimizer: theta at META_THETA_LR, phi at --meta-lr (param_groups)
    dynamical.lm.load_state_dict(theta_0)
    output_names = list(dynamical.adapted_parameter_names().values())
    stats_0 = collect_grad_stats(dynamical.lm, statistics_batches, segment_len=args.segment_len, max_segments=200)
    init_cfg, init_grid = choose_dynamic_eval(dynamical.lm, valid, stats_0, etas=args.dyneval_etas,
                                              lambdas=DYNEVAL_LAMBDAS, segment_len=args.segment_len,
                                              names=output_names)
    dynamical.init_from_dynamic_eval(init_cfg, stats_0)
    if args.compile_update:  # compile outside the timed evaluations: every shape the kernels meet
        start = time.perf_counter()  # (a fixed shape first, then a dynamic one: one pass over both splits)
        evaluate_lm(dynamical, valid)
        evaluate_lm(dynamical, test)
        compile_seconds = time.perf_counter() - start
    results["init"] = [timed_eval(lambda: evaluate_lm(dynamical, valid)), timed_eval(lambda: evaluate_lm(dynamical, test))]
    check = dynamic_evaluate(dynamical.lm, test, init_cfg, stats_0, names=output_names)
    print("dynamical at init", [(m["ppl"], speed) for m, speed in results["init"]],
          "output-layer dynamic evaluation", check["ppl"], flush=True)
    gate_steps, meta_curve = [], []
    if args.freeze_theta:  # theta gets no gradient, so the optimizer leaves it as it is
        for p in dynamical.lm.parameters():
            p.requires_grad_(False)
    meta_pick = extra_training(dynamical_run, gate_steps, meta_curve)
    for p in dynamical.lm.parameters():
        p.requires_grad_(True)
    results["dynamical"] = [timed_eval(lambda: evaluate_lm(dynamical, valid)), timed_eval(lambda: evaluate_lm(dynamical, test))]
    print("dynamical", [(m["ppl"], speed) for m, speed in results["dynamical"]], flush=True)
    total = time.perf_counter() - t_start

    command = command_line("reproduce_dynamical", argv)
    lines = [
        f"## {time.strftime('%Y-%m-%d')}: meta-learner started at dynamic evaluation",
        "",
        f"Command: `{command.strip()}` (device {device}, {args.threads} threads, seed {args.seed}, total {total:.0f} s).",
        "",
        f"Budget: first {args.train_articles} train articles, first {args.eval_articles} valid / test articles, "
        f"each cut to its first {args.max_lines or 'all'} paragraphs; target tokens {tokens}; vocabulary "
        f"{spec.output_size} (words off the {args.vocab_size}-word list are `<unk>`). LSTM 1x{args.hidden}, "
        f"the best valid epoch ({fitted['best_epoch']} of {fitted['epochs_run']} run, at most {args.static_epochs}, lr 3e-3) gives theta_0; evaluation batches of {args.eval_batch_size} article(s), read {'in chunks of one segment' if args.eval_layout == 'segments' else 'sentence by sentence'}. Same theta budget for all three: "
        + (f"theta stays theta_0 for (a), (b) and (c); (c) meta-trains phi alone (lr {args.meta_lr:g}) "
           if args.freeze_theta else
           f"(c) starts from theta_0 and meta-trains theta (lr {META_THETA_LR:g}) and phi (lr {args.meta_lr:g}) "
           f"jointly; (a) is theta_0 trained on theta alone on the same documents at lr {META_THETA_LR:g} "
           f"(fresh Adam, as for (c)), and (b) uses (a)'s weights; (a) and (c) ")
        + f"read the {meta_batches * args.batch_size} documents of {meta_batches} batches of {args.batch_size} "
        + (f"(drawn from training articles {args.train_articles + 1}-{args.train_articles + args.meta_articles}, "
           "held out from theta_0's fit) " if args.meta_articles else "(drawn from theta_0's training articles) ")
        + f"in batches of {args.meta_batch_size} (one Adam step per chunk of {args.meta_bptt} paragraphs for (c), 2 for (a)). Valid ppl every {args.select_every} batches of {args.batch_size} "
        f"(and at step 0) picks the weights kept, for (a) and (c) alike. "
        f"(c): fast weights {args.fast_params}, segment {args.segment_len} tokens, K={args.unroll_steps}, "
        f"meta-training chunks of {args.meta_bptt} paragraphs, linear "
        f"gates, {'first' if args.first_order else 'second'}-order meta-gradients; its rule starts as dynamic evaluation of theta_0's {args.fast_params} weights with eta={init_cfg.lr:g}, "
        f"lambda={init_cfg.decay:g} (picked on validation over the same grid; row (c0)). Dynamic evaluation "
        f"(b), all weights: eta x lambda grid {{{', '.join(f'{e:g}' for e in args.dyneval_etas)}}} x "
        f"{{{', '.join(f'{d:g}' for d in DYNEVAL_LAMBDAS)}}} on validation, best eta={best_cfg.lr:g}, "
        f"lambda={best_cfg.decay:g}, segment {best_cfg.segment_len}; RMS statistics from 4 train batches"
        + (f". (c0) and (c) use compile_update (compiled in {compile_seconds:.0f} s, with one untimed pass over valid and test, not in their speed)." if args.compile_update else "."),
        "",
        "| model | valid ppl | test ppl | eval tokens/s (test) | speed vs. static |",
        "|---|---|---|---|---|",
    ]
    base_speed = results["static"][1][1]
    for name, label in (("static", "(a) static LSTM"), ("dyneval", "(b) static + dynamic evaluation"),
                        ("init", f"(c0) dynamical LM before meta-training (= dynamic evaluation of theta_0's {args.fast_params} weights)"),
                        ("dynamical", "(c) meta-learned dynamical LM")):
        (v, _), (t, speed) = results[name]
        lines.append(f"| {label} | {v['ppl']:.2f} | {t['ppl']:.2f} | {speed:.0f} | {speed / base_speed:.2f}x |")
    fmt_grid = lambda g: ", ".join(f"eta={p['eta']:g}/lambda={p['lambda']:g}: {p['ppl']:.2f}" for p in g)  # noqa: E731
    gate_line = ("Gates during meta-training (mean / std over coordinates and updates), first -> last step: "
                 + ", ".join(f"{gate} {gate_steps[0][f'gate_{gate}_mean']:.3f}/{gate_steps[0][f'gate_{gate}_std']:.3f} -> "
                             f"{gate_steps[-1][f'gate_{gate}_mean']:.3f}/{gate_steps[-1][f'gate_{gate}_std']:.3f}"
                             for gate in ("input", "forget")) + "."
                 if gate_steps else "Gates: no meta-training step reached an update (documents shorter than a segment).")
    lines += ["", f"Check (c0): `dynamic_evaluate` of theta_0's {args.fast_params} weights with the same rule gives test ppl "
              f"{check['ppl']:.4f} (row (c0): {results['init'][1][0]['ppl']:.4f}).",
              "", "(b) grid (valid ppl): " + fmt_grid(grid),
              "", f"(c0) grid, {args.fast_params} weights of theta_0 (valid ppl): " + fmt_grid(init_grid),
              "", gate_line,
              "", f"(c) meta-training: theta {'frozen at theta_0' if args.freeze_theta else f'trained at lr {META_THETA_LR:g}'}, "
              f"dropout {meta_dropout:g}; " + (f"kept step {meta_pick} of {meta_batches * args.batch_size // args.meta_batch_size} (best valid; (a) kept step "
              f"{static_pick}). Curve (step: train-probe ppl / valid ppl, eval mode; train-probe = the first "
              f"{sum(b.batch_size for b in train_probe)} {'held-out ' if args.meta_articles else ''}training articles that it reads): "
              + ", ".join(f"{st}: {tr:.1f} / {v:.1f}" for st, tr, v, *_ in meta_curve)
              + ". Mean loss per train-probe article (the objective of a meta-step over one whole article): "
              + ", ".join(f"{st}: {dm:.4f}" for st, _, _, _, dm in meta_curve)
              + ". (a)'s curve: " + ", ".join(f"{st}: {tr:.1f} / {v:.1f}" for st, tr, v, *_ in static_curve)
              if args.select_every else "the last step is kept") + ".",
              "", f"Dynamic evaluation reads each article alone (batch 1, weights reset per article); (a) and (c) "
              f"are evaluated in batches of {args.eval_batch_size}."]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
