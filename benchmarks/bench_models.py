"""Training throughput (tokens/s) of the language models vs a bare nn.LSTM + Linear loop.

All variants train on the same synthetic document batches (truncated BPTT over sentences, one
optimizer step per chunk), so the ratios show the cost of the library's batching, packing,
locked dropout and (for the DNTM) the entity memory. Run::

    python benchmarks/bench_models.py              # CPU, 1 thread
    python benchmarks/bench_models.py --device cuda --threads 0

Targets: baseline RNNLM >= 0.9x the bare loop; DNTM dynamic=both/gru >= 0.4x the baseline.

Two references: "bare nn.LSTM+Linear" feeds each padded sentence batch to the LSTM as is (what
the target is measured against), "bare, packed" packs each sentence by row length first, the
price of carrying every document's exact state across sentences of different lengths (on the
CPU a packed LSTM runs PyTorch's per-step kernel, not the fused oneDNN one). The column
"x packed" therefore shows the library's own overhead.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import time

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from dynlm.data.batching import DocumentBatch, batch_documents
from dynlm.models import build_model
from dynlm.models.config import DNTMSettings, ModelConfig
from dynlm.training import TrainConfig, train_step
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    spec = VocabSpec(num_words=args.vocab, num_entities=args.entities, shortlist_size=int(args.vocab * 0.9),
                     num_subwords=1000)
    rows = synthetic_rows(spec, args.batch_size * (args.batches + 1), args.sentences, args.tokens)
    batches = list(batch_documents(rows, spec, args.batch_size, seed=0))
    warmup, timed = batches[0], batches[1:]
    cfg = TrainConfig(lr=1e-3, bptt_sentences=args.bptt)
    sizes = dict(embed_dim=args.embed_dim, hidden_dim=args.hidden_dim, num_layers=args.num_layers, dropout=0.2)

    variants: dict[str, callable] = {}
    torch.manual_seed(0)
    bare = BareLM(spec.output_size, args.embed_dim, args.hidden_dim, args.num_layers).to(device)
    bare_opt = torch.optim.Adam(bare.parameters(), lr=1e-3)
    variants["bare nn.LSTM+Linear"] = lambda b: bare_train(bare, b, bare_opt, args.bptt, device)
    torch.manual_seed(0)
    bare_packed = BareLM(spec.output_size, args.embed_dim, args.hidden_dim, args.num_layers).to(device)
    packed_opt = torch.optim.Adam(bare_packed.parameters(), lr=1e-3)
    variants["bare, packed"] = lambda b: bare_train(bare_packed, b, packed_opt, args.bptt, device, packed=True)

    def lm_variant(model_cfg: ModelConfig):
        model = build_model(model_cfg, spec).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        return lambda b: train_step(model, b, optimizer, cfg)["tokens"]

    variants["RNNLM (word)"] = lm_variant(ModelConfig(type="rnn", **sizes))
    variants["RNNLM (word+subword)"] = lm_variant(ModelConfig(type="rnn", embedding="word+subword", **sizes))
    if importlib.util.find_spec("dynlm.models.dntm") is not None:
        for merge_fn in MERGE_FNS:
            variants[f"DNTM both/{merge_fn}"] = lm_variant(
                ModelConfig(type="dntm", dntm=DNTMSettings(dynamic="both", merge_fn=merge_fn), **sizes))

    for run in variants.values():  # warm up allocators / first-call costs
        run(warmup)
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, run in variants.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            tokens = sum(run(b) for b in timed)
            if device.type == "cuda":
                torch.cuda.synchronize()
            best[name] = max(best.get(name, 0.0), tokens / (time.perf_counter() - started))

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
