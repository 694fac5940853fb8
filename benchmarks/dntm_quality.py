"""DNTM quality where users look (issue 18): first mentions, re-appearing entities, and baselines
as strong as a plain LSTM loop and dynamic evaluation, on a held-out split of LitBank.

Every row has the same budget (epochs, size, lr, documents) and is scored on the same TEST
tokens by ``dynlm.training.evaluate`` (overall, first mention, re-appearing entity, after an
entity); the entity mask of ``model.mask_unseen_entities`` is on everywhere (exact). Rows:

* ``rnn``: the baseline RNNLM as dynlm trains it (documents in sentence lockstep, truncated BPTT
  every ``--bptt-sentences`` sentences, ``--lr-schedule``);
* ``plain-stream reference``: the same network trained by a plain PyTorch LM loop (the train
  documents concatenated into one stream, ``--stream-batch`` columns x ``--stream-bptt`` tokens,
  constant lr, no resets), then scored exactly like the others;
* ``rnn + dynamic evaluation``: eta, lambda picked on the validation documents
  (``dynlm.dynamic_eval.choose_dynamic_eval``, gradient statistics from the train documents);
* ``dntm`` input / output / both (GRU merge), both with the new-entity score (added to the
  static logit of ``<unk{n+1}>``, or, "new-entity logit", in its place), with the gate on the
  dynamic scores, and with both; "entity class": the factored output of
  ``model.entity_class_output`` (P(an entity next) from its own logit, then which entity), also
  for ``rnn``; "mention cache": the hidden states that predicted each chain's mentions, scored
  against the current one (``model.dntm.mention_cache``), also for ``rnn`` (``dynamic: none``);
  "adapted entity rows": the entity output rows stepped per document after every sentence on the
  model's own errors with a learned rate (``model.dntm.adapt_entity_rows``), also for ``rnn``;
  "per token": the same rows also stepped after every position inside a sentence
  (``model.dntm.entity_row_step: token``);
  the best DNTM row again with dynamic evaluation
  (``--no-dynamic-eval``: without the dynamic-evaluation rows).

Every dynlm row prints its validation metrics by epoch (the weights of the best epoch overall
are the ones scored).

LitBank is prepared by the library (:mod:`benchmarks.litbank`) and every dynlm row is trained by
the runner (:func:`dynlm.runner.local_run`, as ``dynlm train --local`` trains it).

Usage (from the repository root; LitBank from ../shared/data; about 15 CPU-minutes at the
defaults, 1 thread; the report: benchmarks/results/dntm_quality.md)::

    python -m benchmarks.dntm_quality
    python -m benchmarks.dntm_quality --epochs 6 --embed-dim 256 --hidden-dim 256 --num-layers 2 \
        --max-sentences 0 --vocab-size 10000 --dropout 0.3 --batch-size 16   # the issue's size: ~10 min a row
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from pathlib import Path

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from benchmarks.common import RESULTS, command_line, evaluation_batches, format_value, prepared_job, write_report
from benchmarks.litbank import METRICS, add_litbank_args, litbank_data_config, prepare_litbank, split_sizes
from dynlm import checkpoint
from dynlm.dynamic_eval import choose_dynamic_eval, collect_grad_stats, dynamic_evaluate
from dynlm.job import JobConfig
from dynlm.losses import token_nll
from dynlm.models import build_model
from dynlm.models.config import ModelConfig
from dynlm.models.dntm import PAPER_DNTM
from dynlm.runner import RankRun, local_run
from dynlm.tasks.lm import LMTask
from dynlm.tasks.lm_evaluation import evaluate_lm
from dynlm.tasks.local import files_table, prepare_in_memory
from dynlm.train_config import TrainConfig
from dynlm.training import FitHooks

LM_TASK = LMTask()

ENTITY_CLASS = "entity_class_output"  # a model-level setting a row may add to its model.dntm settings
DNTM_ROWS = {  # row name -> model.dntm settings (+ ENTITY_CLASS: model.entity_class_output)
    "rnn + new-entity score": {"dynamic": "none", "new_entity_score": True},
    "dntm input": {"dynamic": "input"},
    "dntm output": {"dynamic": "output"},
    "dntm both": {"dynamic": "both"},
    "dntm both + new-entity score": {"dynamic": "both", "new_entity_score": True},
    "dntm both + new-entity logit": {"dynamic": "both", "new_entity_score": True, "new_entity_replaces_static": True},
    "dntm both + gate": {"dynamic": "both", "gate_dynamic_scores": True},
    "dntm both + new-entity score + gate": {"dynamic": "both", "new_entity_score": True, "gate_dynamic_scores": True},
    "rnn + entity class": {"dynamic": "none", ENTITY_CLASS: True},
    "dntm both + entity class": {"dynamic": "both", ENTITY_CLASS: True},
    "dntm both + new-entity logit + entity class": {"dynamic": "both", "new_entity_score": True,
                                                    "new_entity_replaces_static": True, ENTITY_CLASS: True},
    "rnn + mention cache": {"dynamic": "none", "mention_cache": True},
    "dntm both + mention cache": {"dynamic": "both", "mention_cache": True},
    "dntm both + new-entity logit + mention cache": {"dynamic": "both", "new_entity_score": True,
                                                     "new_entity_replaces_static": True, "mention_cache": True},
    "rnn + adapted entity rows": {"dynamic": "none", "adapt_entity_rows": True},
    "dntm both + adapted entity rows": {"dynamic": "both", "adapt_entity_rows": True},
    "dntm both + new-entity logit + adapted entity rows": {"dynamic": "both", "new_entity_score": True,
                                                           "new_entity_replaces_static": True, "adapt_entity_rows": True},
    # "per token": the shift also moves inside a sentence (model.dntm.entity_row_step: token)
    "rnn + adapted entity rows per token": {"dynamic": "none", "adapt_entity_rows": True, "entity_row_step": "token"},
    "dntm both + adapted entity rows per token": {"dynamic": "both", "adapt_entity_rows": True,
                                                  "entity_row_step": "token"},
    "dntm both + new-entity logit + adapted entity rows per token": {
        "dynamic": "both", "new_entity_score": True, "new_entity_replaces_static": True, "adapt_entity_rows": True,
        "entity_row_step": "token"},
}
DYNAMIC_EVAL_ETAS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
DYNAMIC_EVAL_LAMBDAS = (0.0, 2e-3, 2e-2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=RESULTS / "dntm_quality.md")
    add_litbank_args(parser, max_sentences=60)
    parser.add_argument("--embed-dim", type=int, default=64)
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8, help="documents per batch (dynlm rows)")
    parser.add_argument("--bptt-sentences", type=int, default=2)
    parser.add_argument("--stream-batch", type=int, default=20, help="plain-stream loop: columns")
    parser.add_argument("--stream-bptt", type=int, default=35, help="plain-stream loop: tokens per step")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--lr-schedule", default="constant", choices=("constant", "cosine"), help="dynlm rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ema-decay", type=float, default=0.0,
                        help="dynlm rows: validate and test an exponential moving average of the weights "
                             "(updated after every optimizer step; 0: the weights themselves)")
    parser.add_argument("--ood-dir", type=Path, default=None,
                        help="a folder of CoNLL-2012 *.conll files of other genres (e.g. OntoNotes): every "
                             "model is also scored on all of its documents (encoded with the LitBank vocabulary)")
    parser.add_argument("--rows", default="", help="comma list of row names to run (default: all)")
    parser.add_argument("--dynamic-eval", action=argparse.BooleanOptionalAction, default=True,
                        help="add the dynamic-evaluation rows of rnn and of the best DNTM row run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--save-dir", type=Path, default=None,
                        help="write each trained row as a dynlm checkpoint <save-dir>/<row>.pt (dynlm.checkpoint.save; "
                             "the plain-stream row is saved as its RNNLM inside a dntm config with dynamic 'none')")
    parser.add_argument("--load-dir", type=Path, default=None,
                        help="score the checkpoints an earlier --save-dir run wrote (same data flags) instead of "
                             "training: every row run needs its <load-dir>/<row>.pt")
    return parser.parse_args(argv)


def model_config(args, dntm: dict) -> ModelConfig:
    dntm = dict(dntm)
    entity_class = dntm.pop(ENTITY_CLASS, False)
    return ModelConfig.from_dict({
        "type": "dntm", "backbone": "lstm", "embed_dim": args.embed_dim, "hidden_dim": args.hidden_dim,
        "num_layers": args.num_layers, "dropout": args.dropout, ENTITY_CLASS: entity_class,
        "dntm": {**PAPER_DNTM, **dntm}})  # each row changes the paper's DNTM


def document_batches(rows, spec, args):
    """``rows`` in batches of ``--batch-size`` documents, in their order (how every row is scored)."""
    return evaluation_batches(LM_TASK, rows, spec, args.batch_size)


def row_job(args, prepared, dntm: dict) -> JobConfig:
    """The job of a dynlm row: the prepared LitBank folder, the row's model, documents in sentence
    lockstep (``--bptt-sentences`` a step)."""
    return prepared_job(prepared, model_config(args, dntm), TrainConfig(
        bptt_tokens=0, lr=args.lr, epochs=args.epochs, batch_size=args.batch_size, bptt_sentences=args.bptt_sentences,
        grad_clip=0.25, early_stopping_patience=0, seed=args.seed, lr_schedule=args.lr_schedule))


def train_dynlm(args, prepared, dntm: dict):
    """A model trained by the runner (``dynlm.runner.local_run``, as ``dynlm train --local`` trains it)."""
    run = local_run(row_job(args, prepared, dntm), prepared)
    if args.ema_decay > 0:
        return _train_with_weight_average(args, run)
    result = run.fit()
    history = result["history"]
    by_epoch = {key: [round(r[f"valid_{key}"], 2) for r in history] for key, _ in METRICS}
    print(f"  valid by epoch: {by_epoch}, best epoch {result['best_epoch']} (its weights are kept)", flush=True)
    return run.model


def _train_with_weight_average(args, run: RankRun):
    """``run.fit`` with an exponential moving average of the weights after every optimizer step
    (``torch.optim.swa_utils``, decay ``--ema-decay``); validation, the choice of the best epoch
    and the test read the average."""
    model = run.model
    average = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(args.ema_decay))
    seen = {"at": (0, 0)}

    def after_step(epoch: int, totals: dict) -> None:
        if (epoch, totals["steps"]) == seen["at"]:  # the extra call at the end of an epoch
            return
        seen["at"] = (epoch, totals["steps"])
        average.update_parameters(model)

    best = {"ppl": math.inf, "epoch": 0, "weights": None, "history": []}

    def on_epoch(epoch: int, record: dict) -> None:
        valid = evaluate_lm(average.module, run.valid_batches())
        best["history"].append({key: round(valid[key], 2) for key, _ in METRICS})
        if valid["ppl"] < best["ppl"]:
            best.update(ppl=valid["ppl"], epoch=epoch, weights=copy.deepcopy(average.module.state_dict()))

    run.fit(on_epoch=on_epoch, hooks=FitHooks(spec=run.spec, after_step=after_step, restore_best=False))
    by_epoch = {key: [h[key] for h in best["history"]] for key, _ in METRICS}
    print(f"  valid by epoch (weight average, decay {args.ema_decay}): {by_epoch}, best epoch {best['epoch']} "
          "(its averaged weights are kept)", flush=True)
    model.load_state_dict(best["weights"])
    return model


def train_plain_stream(args, prepared, train_rows: list[dict]):
    """The same network trained as a plain PyTorch LM: one token stream, fixed-size chunks, its own
    loop and Adam (the reference; its initial weights are the runner's, as the ``rnn`` row's)."""
    model = local_run(row_job(args, prepared, {"dynamic": "none"}), prepared).model.lm  # the RNNLM inside
    stream = torch.tensor([w for row in train_rows for w in row["word_ids"]], dtype=torch.long)
    columns = stream.numel() // args.stream_batch
    data = stream[: columns * args.stream_batch].view(args.stream_batch, columns)  # [B, T]
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for _ in range(args.epochs):
        model.train()
        state = model.init_state(args.stream_batch)
        for start in range(0, columns - 1, args.stream_bptt):
            end = min(start + args.stream_bptt, columns - 1)
            tokens, targets = data[:, start:end], data[:, start + 1 : end + 1]
            state = model.detach_state(state)
            x = model.input_dropout(model.embedding.word(tokens))
            hidden, state = model.run_rnn(x, state)
            logits = model.output_logits(hidden)
            loss = token_nll(logits, targets, torch.ones_like(targets, dtype=torch.bool)).mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            optimizer.step()
    return model


def with_dynamic_evaluation(model, spec, rows, args) -> tuple[dict, dict]:
    """Test metrics of ``model`` under dynamic evaluation with eta, lambda picked on valid."""
    stats = collect_grad_stats(model, document_batches(rows["train"], spec, args))
    best, grid = choose_dynamic_eval(model, document_batches(rows["valid"], spec, args), stats,
                                     etas=DYNAMIC_EVAL_ETAS, lambdas=DYNAMIC_EVAL_LAMBDAS)
    return dynamic_evaluate(model, document_batches(rows["test"], spec, args), best, stats), {
        "eta": best.lr, "lambda": best.decay, "grid": grid}


def load_out_of_domain(args, prepared) -> list[dict]:
    """Every document of the ``*.conll`` files of ``args.ood_dir``, through the same prepare stages
    (anonymized and cut as LitBank is) and encoded with LitBank's preprocessor."""
    files = sorted(args.ood_dir.glob("*.conll"))
    if not files:
        raise SystemExit(f"--ood-dir {args.ood_dir}: no *.conll file")
    data_cfg = litbank_data_config(args).replace(inputs=[str(args.ood_dir)])
    done = prepare_in_memory(LM_TASK, files_table(files), data_cfg, preprocessor=prepared.preprocessor,
                             require_train=False)
    rows = done.rows()  # every split
    if not rows:
        raise SystemExit(f"--ood-dir {args.ood_dir}: no readable *.conll document")
    return rows


def save_row(args, spec, name: str, model) -> Path:
    """``model`` as a dynlm checkpoint ``<save-dir>/<row name>.pt`` (spaces and '+' made plain)."""
    dntm = DNTM_ROWS.get(name, {"dynamic": "none"})
    if name == "plain-stream reference":  # an RNNLM: rebuild the dntm wrapper around its weights
        wrapper = build_model(model_config(args, dntm), spec)
        wrapper.lm.load_state_dict(model.state_dict())
        model = wrapper
    return checkpoint.save(args.save_dir / row_file(name), model, model_config(args, dntm), spec,
                           {"row": name, "seed": args.seed, "lr_schedule": args.lr_schedule})


def row_file(name: str) -> str:
    """The checkpoint file of a row: its name with spaces and '+' made plain."""
    return "".join(c if c.isalnum() else "_" for c in name).strip("_") + ".pt"


def load_row(args, spec, name: str):
    """The model (in eval mode) an earlier ``--save-dir`` run saved for row ``name`` (its vocabulary
    must be this run's)."""
    model, _, saved_spec, _ = checkpoint.load(args.load_dir / row_file(name))
    if saved_spec != spec:
        raise SystemExit(f"{args.load_dir / row_file(name)} was trained with another vocabulary: pass its data flags")
    return model


def same_sentence_reappearances(split_rows: list[dict]) -> tuple[int, int]:
    """(re-appearing mentions, those whose chain's previous mention is in the same sentence): what a
    per-sentence update of the entity state cannot use (``model.dntm.entity_row_step``)."""
    total = same = 0
    for row in split_rows:
        sentence_of = [s for s, length in enumerate(row["sentence_lengths"]) for _ in range(length)]
        last: dict[int, int] = {}  # chain -> sentence of its latest mention
        for position, chain in enumerate(row["entity_ids"]):
            if chain <= 0:
                continue
            if chain in last:
                total += 1
                same += last[chain] == sentence_of[position]
            last[chain] = sentence_of[position]
    return total, same


def format_table(results: list[tuple[str, dict]]) -> str:
    header = "| model | " + " | ".join(title for _, title in METRICS) + " | seconds |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for name, r in results:
        lines.append(f"| {name} | " + " | ".join(format_value(r[key]) for key, _ in METRICS) + f" | {r['seconds']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    wanted = {name.strip() for name in args.rows.split(",") if name.strip()}
    command = command_line("dntm_quality", argv)
    started = time.perf_counter()
    prepared, rows = prepare_litbank(args)
    spec, stats = prepared.spec, split_sizes(rows)
    print(f"data: {prepared.root}, {stats}", flush=True)
    within = {split: same_sentence_reappearances(rows[split]) for split in ("valid", "test")}
    print("re-appearing mentions after one in the same sentence: " + ", ".join(
        f"{split} {same}/{total}" for split, (total, same) in within.items()), flush=True)
    results: list[tuple[str, dict]] = []
    notes: list[str] = []
    models = {}

    def record(name: str, metrics: dict, since: float) -> None:
        results.append((name, {**metrics, "seconds": time.perf_counter() - since}))
        print(f"{name:>40}: " + "  ".join(f"{key}={format_value(metrics[key])}" for key, _ in METRICS), flush=True)

    def run_row(name: str, build) -> None:
        if wanted and name not in wanted:
            return
        since = time.perf_counter()
        models[name] = load_row(args, spec, name) if args.load_dir is not None else build()
        if args.save_dir is not None and args.load_dir is None:
            save_row(args, spec, name, models[name])
        record(name, evaluate_lm(models[name], document_batches(rows["test"], spec, args)), since)
        if ood_rows is not None:
            since = time.perf_counter()
            ood_results.append((name, {**evaluate_lm(models[name], document_batches(ood_rows, spec, args)),
                                       "seconds": time.perf_counter() - since}))

    ood_rows = load_out_of_domain(args, prepared) if args.ood_dir else None
    ood_results: list[tuple[str, dict]] = []

    run_row("rnn", lambda: train_dynlm(args, prepared, {"dynamic": "none"}))
    run_row("plain-stream reference", lambda: train_plain_stream(args, prepared, rows["train"]))
    for name, dntm in DNTM_ROWS.items():
        run_row(name, lambda dntm=dntm: train_dynlm(args, prepared, dntm))
    dntm_rows = [(n, r) for n, r in results if n.startswith("dntm")]  # the best DNTM overall gets dynamic evaluation
    best_dntm = min(dntm_rows, key=lambda nr: nr[1]["ppl"])[0] if dntm_rows else None
    for base in ("rnn", best_dntm) if args.dynamic_eval else ():
        if base is None or base not in models:
            continue
        since = time.perf_counter()
        metrics, chosen = with_dynamic_evaluation(models[base], spec, rows, args)
        record(f"{base} + dynamic evaluation", metrics, since)
        notes.append(f"- `{base}` + dynamic evaluation: eta {chosen['eta']:g}, lambda {chosen['lambda']:g} "
                     "(lowest validation perplexity of the grid: " + ", ".join(
                         f"{g['eta']:g}/{g['lambda']:g} {g['ppl']:.1f}" for g in chosen["grid"]) + ").")
    table = format_table(results)
    print(table)
    counts = {k: int(results[0][1][f"count_{k}"]) for k in ("all", "first_mention", "reappearing", "after_entity")}
    report = "\n".join([
        "## Run", "", "```", command.strip(), "```", "",
        f"Data: {len(rows['train'])}/{len(rows['valid'])}/{len(rows['test'])} train/valid/test LitBank documents "
        f"({stats['train_tokens']}/{stats['valid_tokens']}/{stats['test_tokens']} tokens; split seed {args.split_seed}, "
        f"first {args.max_sentences or 'all'} sentences, max_chains {args.max_chains}), vocab {spec.num_words}. "
        f"Test target counts {counts}. Model {args.num_layers} x {args.hidden_dim} LSTM, embed {args.embed_dim}, dropout "
        f"{args.dropout}; {args.epochs} epochs, lr {args.lr}; dynlm rows: {args.lr_schedule} schedule, batch {args.batch_size} documents, BPTT "
        f"{args.bptt_sentences} sentences; plain stream: {args.stream_batch} x {args.stream_bptt} tokens. "
        f"{args.threads} thread(s), {(time.perf_counter() - started) / 60:.1f} min. Re-appearing mentions whose "
        "chain's previous mention is in the same sentence: " + ", ".join(
            f"{split} {same} of {total} ({same / max(total, 1):.0%})" for split, (total, same) in within.items()) + ".",
        "", table, "", *notes, ""]
        + (["", f"Out of domain: every document of `{args.ood_dir}` ({len(ood_rows)} documents), static scores:",
            "", format_table(ood_results), ""] if ood_rows is not None else []))
    write_report(args.output, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
