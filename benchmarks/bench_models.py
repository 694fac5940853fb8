"""Training throughput (tokens/s) of the language models vs a bare nn.LSTM + Linear loop.

All variants train on the same document batches (one optimizer step per truncated-BPTT chunk),
so the ratios show the cost of the library's batching, packing, locked dropout and (for the
DNTM) the entity memory. Every dynlm variant is built by the runner (:func:`dynlm.runner.build_rank_run`:
its model, optimizer and batches, as ``dynlm train`` builds them) and stepped by
:func:`dynlm.training.train_step`; the references keep their own loops. Run from the repository
root::

    python -m benchmarks.bench_models              # synthetic documents, CPU, 1 thread
    python -m benchmarks.bench_models --device cuda --threads 0
    python -m benchmarks.bench_models --corpus litbank      # real, ragged documents (../shared/data)
    python -m benchmarks.bench_models --corpus wikitext2

``--corpus litbank|wikitext2`` (issue 11) trains on real documents, whose ragged sentences the
synthetic ones hide (prepared by the library: :mod:`benchmarks.litbank`, :mod:`benchmarks.wikitext`),
in three batch layouts (sentence lockstep, ``train.bptt_tokens=0``; chunks of ``--chunk-tokens``
positions, :class:`dynlm.data.batching.ChunkLayout`, one document a row, ``train.pack_documents=false``;
the same with ``pack_documents``, several documents a row, ``--max-docs`` larger than
``--batch-size``), against the
**plain-stream reference** (:mod:`benchmarks.plain_stream`): a pytorch/examples-style LSTM LM of the same size (embedding ->
dropout -> LSTM -> dropout -> linear) over the same tokens concatenated into one stream,
``--stream-batch`` columns x ``--chunk-tokens`` tokens a step. Targets there: RNNLM (chunks)
>= 0.9x the plain stream, DNTM both/gru (chunks) >= 0.5x the RNNLM (chunks), padding <= 0.1.

Targets: baseline RNNLM >= 0.9x the bare loop; DNTM dynamic=both/gru >= 0.4x the baseline.

Two references: "bare nn.LSTM+Linear" feeds each padded sentence batch to the LSTM as is (what
the target is measured against), "bare, packed" packs each sentence by row length first, the
price of carrying every document's exact state across sentences of different lengths (on the
CPU a packed LSTM runs PyTorch's per-step kernel, not the fused oneDNN one). The column
"x packed" therefore shows the library's own overhead.
"""

from __future__ import annotations

import argparse
import random
import time
from argparse import Namespace

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from benchmarks.common import generated_rows_job, prepared_job, rows_run
from benchmarks.litbank import DEFAULT_DATA as LITBANK_DATA
from benchmarks.litbank import prepare_litbank
from benchmarks.plain_stream import PlainStreamLM, plain_stream_train, token_stream
from benchmarks.wikitext import DATA as WIKITEXT_DATA
from benchmarks.wikitext import prepare_articles, read_articles, rows_in_order
from dynlm.data.batching import DocumentBatch
from dynlm.models import needs_whole_sentences
from dynlm.models.config import DNTMSettings, ModelConfig
from dynlm.models.dntm import PAPER_DNTM
from dynlm.runner import RankRun
from dynlm.train_config import TrainConfig
from dynlm.training import train_step
from dynlm.vocab_spec import VocabSpec

MERGE_FNS = ["max", "gru", "gru_relu", "latest", "attention"]


def synthetic_rows(spec: VocabSpec, num_docs: int, sentences: int, tokens: int, seed: int = 0) -> list[dict]:
    """Documents of ~``sentences`` sentences of ~``tokens`` tokens; ~5% entity mentions."""
    rng = random.Random(seed)
    rows = []
    for d in range(num_docs):
        words, entities, lengths = [], [], []
        for _ in range(rng.randint(sentences // 2, sentences)):
            sentence = [spec.bos_id]
            for _ in range(rng.randint(tokens // 2, tokens)):
                if rng.random() < 0.05:
                    sentence.append(spec.entity_word_id(rng.randint(1, min(10, spec.num_entities))))
                else:
                    sentence.append(min(spec.num_words - 1, 4 + int(rng.paretovariate(1.0))))
            sentence.append(spec.eos_id)
            words += sentence
            entities += [w - spec.num_words + 1 if w >= spec.num_words else 0 for w in sentence]
            lengths.append(len(sentence))
        sub_lengths = [1 + w % 3 for w in words]
        sub_ids = [1 + (w * 7 + k) % (spec.num_subwords - 1) for w, n in zip(words, sub_lengths) for k in range(n)]
        rows.append({"doc_id": f"d{d}", "num_tokens": len(words), "sentence_lengths": lengths, "word_ids": words,
                     "entity_ids": entities, "subword_ids": sub_ids, "subword_lengths": sub_lengths})
    return rows


class BareLM(nn.Module):
    """The reference: nn.Embedding -> nn.LSTM -> nn.Linear, no packing, no dropout masks."""

    def __init__(self, vocab: int, embed_dim: int, hidden_dim: int, num_layers: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed_dim)
        self.rnn = nn.LSTM(embed_dim, hidden_dim, num_layers, batch_first=True)
        self.decoder = nn.Linear(hidden_dim, vocab)


def bare_train(model: BareLM, batch: DocumentBatch, optimizer, bptt: int, device, packed: bool = False) -> int:
    """Truncated BPTT over sentence steps, like ``train_step``.

    ``packed=False`` runs the padded sentence through the LSTM as is (the cheapest call, but
    the carried state of a short row has then also read its padding); ``packed=True`` packs
    by row length, which carries each row's exact state, as every dynlm model must.
    """
    hidden = None
    for start in range(0, len(batch.sentences), bptt):
        optimizer.zero_grad(set_to_none=True)
        loss_sum, count = 0.0, 0
        for s in batch.sentences[start : start + bptt]:
            tokens, targets = s.tokens.to(device), s.targets.to(device)
            if packed:
                lengths = s.lengths.cpu().clamp(min=1)
                packed_in = pack_padded_sequence(model.embedding(tokens), lengths, batch_first=True,
                                                 enforce_sorted=False)
                packed_out, hidden = model.rnn(packed_in, hidden)
                out, _ = pad_packed_sequence(packed_out, batch_first=True, total_length=tokens.size(1))
            else:
                out, hidden = model.rnn(model.embedding(tokens), hidden)
            logits = model.decoder(out)
            loss_sum = loss_sum + nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=0, reduction="sum")
            count += s.num_tokens
        (loss_sum / count).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        hidden = tuple(h.detach() for h in hidden)
    return batch.num_tokens


def corpus_rows(args) -> tuple:
    """Real documents prepared by the library, sentences as the corpus has them (no cutting), the
    first ``--max-sentences`` of each: LitBank (anonymized, gold chains; every split) or the first
    ``--max-docs`` WikiText-2 training articles (the vocabulary fitted on them). Returns the
    prepared folder and its rows."""
    if args.corpus == "litbank":
        options = Namespace(data_dir=args.data_dir or LITBANK_DATA, max_chains=args.entities, vocab_size=args.vocab,
                            split_seed=0, valid_fraction=0.1, test_fraction=0.1, max_sentence_len=0,
                            max_sentences=args.max_sentences)
        prepared, splits = prepare_litbank(options)
        return prepared, [row for split in ("train", "valid", "test") for row in splits[split]]
    articles = read_articles("train", args.max_docs, args.data_dir or WIKITEXT_DATA)
    prepared = prepare_articles({"train": articles}, vocab_size=args.vocab, max_lines=args.max_sentences)
    return prepared, rows_in_order(prepared, "train", articles)


def step_variant(run: RankRun):
    """One dynlm variant's step: ``train_step`` of the run's model and optimizer on a batch (its tokens)."""
    return lambda batch: train_step(run.task, run.model, batch, run.optimizer, run.job.train,
                                    scheduler=run.schedule)["tokens"]


def run_corpus(args, device) -> None:
    """Real documents: plain stream vs RNNLM / DNTM in both layouts (see the module docstring)."""
    prepared, rows = corpus_rows(args)
    spec = prepared.spec
    rows = rows[: args.max_docs]
    warm_rows = [dict(r, sentence_lengths=r["sentence_lengths"][:3], num_tokens=None,
                      **_first_tokens(r, sum(r["sentence_lengths"][:3]))) for r in rows[: args.batch_size]]
    sizes = dict(embed_dim=args.embed_dim, hidden_dim=args.hidden_dim, num_layers=args.num_layers,
                 dropout=args.dropout)
    models = {"RNNLM": ModelConfig(type="rnn", **sizes)}
    for merge_fn in args.merge_fns.split(","):
        models[f"DNTM both/{merge_fn}"] = ModelConfig(type="dntm", dntm=DNTMSettings(**{**PAPER_DNTM, "merge_fn": merge_fn}),
                                                      **sizes)
    variants: dict[str, tuple[callable, list, list]] = {}
    padding: dict[str, float] = {}
    collate_rate: dict[str, float] = {}
    for model_name, model_cfg in models.items():
        tokens = chunk_tokens(args, model_cfg)
        chunked = TrainConfig(lr=1e-3, batch_size=args.batch_size, bptt_tokens=tokens)
        for layout_name, cfg in (
                ("lockstep", TrainConfig(lr=1e-3, batch_size=args.batch_size, bptt_tokens=0, bptt_sentences=args.bptt)),
                ("chunks", chunked.replace(pack_documents=False)), ("packed", chunked.replace(pack_documents=True))):
            if layout_name not in args.layouts.split(","):
                continue
            run = rows_run(prepared_job(prepared, model_cfg, cfg), spec, rows, device=device)
            layout = run.task.batch_layout(cfg, model_cfg)
            started = time.perf_counter()
            timed = list(run.train_batches(1))
            seconds = time.perf_counter() - started
            key = layout_name if layout is None else f"chunks of {layout.tokens}" + (
                ", whole sentences" if layout.whole_sentences else "") + (", packed rows" if layout.pack_documents else "")
            padding[key] = sum(b.num_padded for b in timed) / sum(b.num_padded + b.num_tokens for b in timed)
            collate_rate[key] = sum(b.num_tokens for b in timed) / seconds
            warm = list(run.task.batches(warm_rows, spec, args.batch_size, seed=0, layout=layout))
            variants[f"{model_name} ({layout_name})"] = (step_variant(run), warm, timed)
    # The plain stream reads the same target tokens: every document's inputs, concatenated.
    stream = token_stream(rows, args.stream_batch)
    torch.manual_seed(0)
    plain = PlainStreamLM(spec.output_size, args.embed_dim, args.hidden_dim, args.num_layers, args.dropout).to(device)
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-3)
    plain_name = f"plain stream ({args.stream_batch} x {args.chunk_tokens})"
    variants = {plain_name: (lambda b: plain_stream_train(plain, b, plain_opt, args.chunk_tokens, device),
                             [stream[:, : 4 * args.chunk_tokens + 1]], [stream]), **variants}
    best = time_variants(variants, args.rounds, device)
    some_rnn = next(v for name, v in variants.items() if name.startswith("RNNLM"))
    print(f"corpus={args.corpus} documents={len(rows)} tokens={sum(b.num_tokens for b in some_rnn[2]):,} "
          f"device={device} threads={torch.get_num_threads()} vocab={spec.output_size} E={args.embed_dim} "
          f"H={args.hidden_dim} layers={args.num_layers} batch={args.batch_size} documents, lockstep bptt={args.bptt} "
          f"sentences, chunks of {args.chunk_tokens} tokens ({args.whole_chunk_tokens} for whole sentences)")
    reference = "RNNLM (packed)" if "RNNLM (packed)" in best else "RNNLM (chunks)"
    base, rnn = best[plain_name], best[reference]
    print(f"| variant | tokens/s | x plain stream | x {reference} |\n|---|---|---|---|")
    for name, rate in best.items():
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f} | {rate / rnn:.2f} |")
    print("\n| layout | padding fraction | collate tokens/s |\n|---|---|---|")
    for key in padding:
        print(f"| {key} | {padding[key]:.3f} | {collate_rate[key]:,.0f} |")


def chunk_tokens(args, model_cfg: ModelConfig) -> int:
    """The chunk length of a model: ``--whole-chunk-tokens`` for one that reads whole sentences."""
    return args.whole_chunk_tokens if needs_whole_sentences(model_cfg) else args.chunk_tokens


def _first_tokens(row: dict, n: int) -> dict:
    """The per-token columns of ``row`` cut to its first ``n`` tokens (a warm-up document)."""
    sub_lengths = list(row["subword_lengths"][:n])
    return {"word_ids": list(row["word_ids"][:n]), "entity_ids": list(row["entity_ids"][:n]),
            "subword_lengths": sub_lengths, "subword_ids": list(row["subword_ids"][: sum(sub_lengths)])}


def time_variants(variants: dict, rounds: int, device) -> dict[str, float]:
    """Best tokens/s of each ``name -> (run, warm-up batches, timed batches)``, round robin."""
    for run, warm, _ in variants.values():
        for b in warm:
            run(b)
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, (run, _, timed) in variants.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            tokens = sum(run(b) for b in timed)
            if device.type == "cuda":
                torch.cuda.synchronize()
            rate = tokens / (time.perf_counter() - started)
            best[name] = max(best.get(name, 0.0), rate)
            print(f"  {name}: {rate:,.0f} tokens/s", flush=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=["synthetic", "litbank", "wikitext2"], default="synthetic")
    parser.add_argument("--data-dir", default=None, help="the corpus folder (default: ../shared/data/<corpus>)")
    parser.add_argument("--max-docs", type=int, default=32, help="real corpora: documents timed")
    parser.add_argument("--max-sentences", type=int, default=40, help="real corpora: first N sentences of each (0: all)")
    parser.add_argument("--chunk-tokens", type=int, default=35, help="real corpora: chunk layout / plain stream step")
    parser.add_argument("--whole-chunk-tokens", type=int, default=140,
                        help="real corpora: chunk layout of a whole-sentence model (the DNTM; sentences packed up to it)")
    parser.add_argument("--layouts", default="lockstep,chunks,packed",
                        help="real corpora: batch layouts timed (lockstep, chunks: one document a row, packed: "
                             "several documents a row, ChunkLayout.pack_documents)")
    parser.add_argument("--stream-batch", type=int, default=16, help="plain stream: columns")
    parser.add_argument("--dropout", type=float, default=0.3, help="real corpora")
    parser.add_argument("--merge-fns", default="gru", help="real corpora: DNTM merges (comma list)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: leave default)")
    parser.add_argument("--vocab", type=int, default=10000)
    parser.add_argument("--entities", type=int, default=50)
    parser.add_argument("--embed-dim", type=int, default=128)
    parser.add_argument("--hidden-dim", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batches", type=int, default=2, help="timed batches per variant and round")
    parser.add_argument("--rounds", type=int, default=2, help="round-robin repeats; the best round counts")
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--bptt", type=int, default=4)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.corpus != "synthetic":
        run_corpus(args, device)
        return
    spec = VocabSpec(num_words=args.vocab, num_entities=args.entities, shortlist_size=int(args.vocab * 0.9),
                     num_subwords=1000)
    rows = synthetic_rows(spec, args.batch_size * (args.batches + 1), args.sentences, args.tokens)
    cfg = TrainConfig(bptt_tokens=0, lr=1e-3, batch_size=args.batch_size, bptt_sentences=args.bptt)
    sizes = dict(embed_dim=args.embed_dim, hidden_dim=args.hidden_dim, num_layers=args.num_layers, dropout=0.2)

    def lm_run(model_cfg: ModelConfig) -> RankRun:
        job = generated_rows_job("lm", model_cfg, cfg, generated_by="benchmarks.bench_models.synthetic_rows")
        return rows_run(job, spec, rows, device=device)

    runs = {"RNNLM (word)": lm_run(ModelConfig(type="rnn", **sizes)),
            "RNNLM (word+subword)": lm_run(ModelConfig(type="rnn", embedding="word+subword", **sizes))}
    for merge_fn in MERGE_FNS:
        runs[f"DNTM both/{merge_fn}"] = lm_run(
            ModelConfig(type="dntm", dntm=DNTMSettings(**{**PAPER_DNTM, "merge_fn": merge_fn}), **sizes))
    # every variant reads the same batches (sentence lockstep for all: the first run's epoch 1)
    batches = list(runs["RNNLM (word)"].train_batches(1))
    warmup, timed = batches[0], batches[1:]

    variants: dict[str, callable] = {}
    torch.manual_seed(0)
    bare = BareLM(spec.output_size, args.embed_dim, args.hidden_dim, args.num_layers).to(device)
    bare_opt = torch.optim.Adam(bare.parameters(), lr=1e-3)
    variants["bare nn.LSTM+Linear"] = lambda b: bare_train(bare, b, bare_opt, args.bptt, device)
    torch.manual_seed(0)
    bare_packed = BareLM(spec.output_size, args.embed_dim, args.hidden_dim, args.num_layers).to(device)
    packed_opt = torch.optim.Adam(bare_packed.parameters(), lr=1e-3)
    variants["bare, packed"] = lambda b: bare_train(bare_packed, b, packed_opt, args.bptt, device, packed=True)
    variants.update({name: step_variant(run) for name, run in runs.items()})

    best = time_variants({name: (run, [warmup], timed) for name, run in variants.items()}, args.rounds, device)

    base = best["bare nn.LSTM+Linear"]
    rnn = best["RNNLM (word)"]
    padded = sum(b.num_padded for b in timed) / sum(b.num_padded + b.num_tokens for b in timed)
    print(f"device={device} threads={torch.get_num_threads()} vocab={spec.output_size} E={args.embed_dim} "
          f"H={args.hidden_dim} layers={args.num_layers} batch={args.batch_size} docs bptt={args.bptt} "
          f"padding={padded:.1%}")
    packed = best["bare, packed"]
    print(f"{'variant':28s} {'tokens/s':>10s} {'x bare':>8s} {'x packed':>9s} {'x RNNLM':>8s}")
    for name, rate in best.items():
        print(f"{name:28s} {rate:10.0f} {rate / base:8.2f} {rate / packed:9.2f} {rate / rnn:8.2f}")


if __name__ == "__main__":
    main()
