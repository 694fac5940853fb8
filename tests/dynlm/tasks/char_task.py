"""A tiny character-level LM task: the proof that a new task is one module behind ``Task``.

It shares nothing with the LM task but the readers (it reads the synthetic CoNLL corpus) and
the split function: its own record schemas, preprocessor (a character vocabulary), batches
(``[B, T]`` character ids of whole documents), model (embedding + GRU), loss and metrics.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch import nn

from dynlm.config import Config
from dynlm.data.config import CorpusConfig
from dynlm.data.readers import parse_file
from dynlm.data.schema import Quarantined
from dynlm.data.split import assign_split
from dynlm.losses import token_nll
from dynlm.metrics import perplexity
from dynlm.tasks.base import Task
from dynlm.training import StepLoss

PAD, UNK, EOS = 0, 1, 2  # character ids; real characters from 3 on, most frequent first

PARSED = pa.schema([pa.field("kind", pa.string()), pa.field("doc_id", pa.string()),
                    pa.field("source_file", pa.string()), pa.field("input_file", pa.string()),
                    pa.field("split", pa.string()),
                    pa.field("text", pa.string()), pa.field("line", pa.int64()), pa.field("reason", pa.string())])
ENCODED = pa.schema([pa.field("doc_id", pa.string()), pa.field("source_file", pa.string()),
                     pa.field("char_ids", pa.list_(pa.int32()))])


@dataclass
class CharDataConfig(CorpusConfig):
    max_chars: int = 40  # character types kept (the rest read as UNK)
    valid_fraction: float = 0.2
    test_fraction: float = 0.2
    split_seed: int = 0


@dataclass
class CharModelConfig(Config):
    embed_dim: int = 16
    hidden_dim: int = 32


@dataclass
class CharSpec(Config):
    num_chars: int  # output size, specials included


def parse_files(batch: pa.Table, cfg_dict: dict) -> pa.Table:
    """CoNLL files -> one row per document: its words joined by spaces, sentences by newlines."""
    cfg = CharDataConfig.from_dict(cfg_dict)
    rows = []
    for data, path in zip(batch["bytes"].to_pylist(), batch["path"].to_pylist()):
        for item in parse_file(data, path, "conll"):
            if isinstance(item, Quarantined):
                rows.append(dict(kind="quarantine", doc_id=item.doc_id, source_file=path, input_file=path, split="", text="",
                                 line=item.line, reason=item.reason))
                continue
            split = assign_split(item["doc_id"], seed=cfg.split_seed, valid_fraction=cfg.valid_fraction,
                                 test_fraction=cfg.test_fraction)
            text = "\n".join(" ".join(sentence) for sentence in item["sentences"])
            rows.append(dict(kind="document", doc_id=item["doc_id"], source_file=path, input_file=path, split=split, text=text,
                             line=0, reason=""))
    return pa.Table.from_pylist(rows, schema=PARSED)


def count_train(batch: pa.Table) -> pa.Table:
    """Character counts of the batch's train documents (``word`` = one character)."""
    train = batch.filter(pc.and_(pc.equal(batch["kind"], "document"), pc.equal(batch["split"], "train")))
    characters = pa.array([c for text in train["text"].to_pylist() for c in text], pa.string())
    counts = pc.value_counts(characters)
    return pa.table({"word": counts.field("values"), "count": pc.cast(counts.field("counts"), pa.int64())})


class CharVocab:
    """The preprocessor: character -> id; ``spec`` gives the model its output size."""

    def __init__(self, chars: list[str]):
        self.chars = chars
        self.ids = {c: 3 + i for i, c in enumerate(chars)}
        self.spec = CharSpec(num_chars=3 + len(chars))

    @classmethod
    def fit(cls, counts: dict[str, int], cfg: CharDataConfig) -> "CharVocab":
        ordered = sorted(counts, key=lambda c: (-counts[c], c))  # by count, ties by character
        return cls(ordered[: cfg.max_chars])

    def to_json(self) -> str:
        return json.dumps({"chars": self.chars})

    @classmethod
    def from_json(cls, text: str) -> "CharVocab":
        return cls(json.loads(text)["chars"])

    def encode(self, text: str) -> list[int]:
        return [self.ids.get(c, UNK) for c in text] + [EOS]


class EncodeChars:
    """Encode stage: parsed rows -> ENCODED rows plus ``split``."""

    def __init__(self, preprocessor_json: str):
        self.vocab = CharVocab.from_json(preprocessor_json)

    def __call__(self, batch: pa.Table) -> pa.Table:
        docs = batch.filter(pc.equal(batch["kind"], "document"))
        ids = [self.vocab.encode(text) for text in docs["text"].to_pylist()]
        table = pa.table({"doc_id": docs["doc_id"], "source_file": docs["source_file"],
                          "char_ids": pa.array(ids, pa.list_(pa.int32()))}, schema=ENCODED)
        return table.append_column("split", docs["split"])


@dataclass
class CharBatch:
    """``inputs``/``targets`` ``[B, T]`` long (targets = inputs shifted by one), ``mask`` ``[B, T]`` bool."""

    inputs: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor

    def to(self, device) -> "CharBatch":
        return CharBatch(self.inputs.to(device), self.targets.to(device), self.mask.to(device))

    @property
    def num_documents(self) -> int:
        return self.inputs.shape[0]

    num_padded = 0


class CharLM(nn.Module):
    def __init__(self, cfg: CharModelConfig, spec: CharSpec):
        super().__init__()
        self.embed = nn.Embedding(spec.num_chars, cfg.embed_dim, padding_idx=PAD)
        self.rnn = nn.GRU(cfg.embed_dim, cfg.hidden_dim, batch_first=True)
        self.out = nn.Linear(cfg.hidden_dim, spec.num_chars)

    def forward(self, batch: CharBatch) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(batch.inputs))  # [B, T, H]
        return self.out(hidden)  # [B, T, num_chars]


class CharMetrics:
    """NLL sum and character count (all-reduce :meth:`as_tensor` with SUM)."""

    def __init__(self, nll_sum: float = 0.0, count: int = 0):
        self.nll_sum, self.count = nll_sum, count

    def update(self, logits: torch.Tensor, batch: CharBatch) -> None:
        self.nll_sum += float(token_nll(logits, batch.targets, batch.mask).double().sum())
        self.count += int(batch.mask.sum())

    def merge(self, other: "CharMetrics") -> "CharMetrics":
        self.nll_sum, self.count = self.nll_sum + other.nll_sum, self.count + other.count
        return self

    def as_tensor(self, device="cpu") -> torch.Tensor:
        return torch.tensor([self.nll_sum, float(self.count)], dtype=torch.float64, device=device)

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> "CharMetrics":
        nll_sum, count = values.tolist()
        return cls(nll_sum, int(round(count)))

    @classmethod
    def from_metrics(cls, metrics: dict) -> "CharMetrics":
        return cls(metrics["nll_sum_all"], int(metrics["count_all"]))

    def compute(self) -> dict:
        loss = self.nll_sum / self.count if self.count else math.nan
        return {"loss": loss, "ppl": perplexity(self.nll_sum, self.count), "bits_per_char": loss / math.log(2),
                "tokens": self.count, "nll_sum_all": self.nll_sum, "count_all": self.count}


class CharTask(Task):
    name = "char"
    parsed_schema = PARSED
    payload_columns = ("text",)
    encoded_schema = ENCODED
    data_config = CharDataConfig
    model_config = CharModelConfig
    metrics = CharMetrics
    primary_metric = "ppl"
    spec_class = CharSpec
    encoder = EncodeChars
    parse_files = staticmethod(parse_files)
    count_train = staticmethod(count_train)

    def fit_preprocessor(self, counts, data_cfg):
        return CharVocab.fit(counts, data_cfg)

    def load_preprocessor(self, text):
        return CharVocab.from_json(text)

    def collate(self, rows, spec):
        width = max(len(r["char_ids"]) for r in rows)  # inputs: <eos> then the text; targets: text then <eos>
        inputs = torch.full((len(rows), width), PAD, dtype=torch.long)
        targets = torch.full((len(rows), width), PAD, dtype=torch.long)
        for b, row in enumerate(rows):
            ids = torch.tensor(row["char_ids"], dtype=torch.long)
            inputs[b, 0], inputs[b, 1 : len(ids)] = EOS, ids[:-1]
            targets[b, : len(ids)] = ids
        return CharBatch(inputs, targets, targets != PAD)

    def batches(self, rows, spec, batch_size, *, sort_by_length=True, seed=0):
        rows = sorted(rows, key=lambda r: len(r["char_ids"])) if sort_by_length else list(rows)
        for start in range(0, len(rows), batch_size):
            yield self.collate(rows[start : start + batch_size], spec)

    def pad_batch(self, batch, size, spec):  # one step per batch; a rank without data: all masked
        if batch is not None:
            return batch
        blank = torch.full((1, 1), PAD, dtype=torch.long)
        return CharBatch(blank, blank, blank != PAD)

    def build_model(self, model_cfg, spec):
        return CharLM(model_cfg, spec)

    def loss(self, model, chunk, state):
        nll = token_nll(model(chunk), chunk.targets, chunk.mask)  # [B, T]
        count = chunk.mask.sum()
        return StepLoss(nll.sum() / count.clamp(min=1), nll.sum().detach(), count)

    def evaluate(self, model, batches):
        model.eval()
        metrics = CharMetrics()
        with torch.no_grad():
            for batch in batches:
                metrics.update(model(batch), batch)
        return metrics.compute()

    def metric_table(self, metrics, title):
        return (f"{title}\n  {'characters':<16}{int(metrics['count_all']):>10}\n"
                f"  {'perplexity':<16}{metrics['ppl']:>10.3f}\n  {'bits/char':<16}{metrics['bits_per_char']:>10.3f}")
