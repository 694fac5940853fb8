"""A tiny character-level LM task: the proof that a new task is one module behind ``Task``
(docs/ARCHITECTURE.md, "Tasks", walks through it role by role).

It shares nothing with the LM task but the readers (it reads the synthetic CoNLL corpus) and
the split function: its own record schemas, preprocessor (a character vocabulary), batches
(``[B, T]`` character ids of whole documents), model (embedding + GRU), loss and metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pyarrow as pa
import torch
from torch import nn

from dynlm.config import Config
from dynlm.data.config import CorpusConfig
from dynlm.data.readers import parse_file
from dynlm.data.schema import Quarantined
from dynlm.data.sequences import PAD, NextUnitBatch, UnitSpec, UnitVocabulary
from dynlm.data.split import assign_split
from dynlm.losses import token_nll
from dynlm.metrics import NllSums
from dynlm.tasks.base import Task
from dynlm.tasks.data_role import document_record, parsed_schema, quarantine_record
from dynlm.training import StepLoss


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


# ---- data role: CoNLL files -> one record per document (its words joined by spaces, sentences by newlines)
def parse_files(batch: pa.Table, cfg_dict: dict) -> pa.Table:
    cfg, rows = CharDataConfig.from_dict(cfg_dict), []
    for data, path in zip(batch["bytes"].to_pylist(), batch["path"].to_pylist()):
        for item in parse_file(data, path, "conll"):
            if isinstance(item, Quarantined):
                rows.append(quarantine_record(item.doc_id, path, item.line, item.reason, text=""))
                continue
            split = assign_split(item["doc_id"], seed=cfg.split_seed, valid_fraction=cfg.valid_fraction,
                                 test_fraction=cfg.test_fraction)
            text = "\n".join(" ".join(sentence) for sentence in item["sentences"])
            rows.append(document_record(item["doc_id"], path, split, text=text))
    return pa.Table.from_pylist(rows, schema=CharTask.parsed_schema)


class CharLM(nn.Module):
    def __init__(self, cfg: CharModelConfig, spec: UnitSpec):
        super().__init__()
        self.embed = nn.Embedding(spec.num_units, cfg.embed_dim, padding_idx=PAD)
        self.rnn = nn.GRU(cfg.embed_dim, cfg.hidden_dim, batch_first=True)
        self.out = nn.Linear(cfg.hidden_dim, spec.num_units)

    def forward(self, batch: NextUnitBatch) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(batch.inputs))  # [B, T, H]
        return self.out(hidden)  # [B, T, num_units]


class CharMetrics(NllSums):
    def compute(self) -> dict:
        return {**super().compute(), "bits_per_char": self.nll_sum / max(self.count, 1) / math.log(2)}


class CharTask(Task):
    name = "char"
    parsed_schema = parsed_schema(pa.field("text", pa.string()))
    payload_columns = ("text",)
    encoded_schema = pa.schema([pa.field("doc_id", pa.string()), pa.field("source_file", pa.string()),
                                pa.field("char_ids", pa.list_(pa.int32()))])
    data_config, model_config, spec_class, preprocessor_class = CharDataConfig, CharModelConfig, UnitSpec, UnitVocabulary
    metrics = CharMetrics
    parse_files = staticmethod(parse_files)

    def fit_preprocessor(self, counts, data_cfg):
        return UnitVocabulary.fit(counts, data_cfg.max_chars)

    def train_units(self, record):
        return record["text"]  # its characters

    def encode_document(self, vocab, record):
        return {"doc_id": record["doc_id"], "source_file": record["source_file"], "char_ids": vocab.encode(record["text"])}

    def row_length(self, row):
        return len(row["char_ids"])

    def collate(self, rows, spec):
        return NextUnitBatch.collate([row["char_ids"] for row in rows])

    def build_model(self, model_cfg, spec):
        return CharLM(model_cfg, spec)

    def loss(self, model, chunk, state):
        chunk = chunk.to(next(model.parameters()).device)
        nll = token_nll(model(chunk), chunk.targets, chunk.mask)  # [B, T]
        count = chunk.mask.sum()
        return StepLoss(nll.sum() / count.clamp(min=1), nll.sum().detach(), count)

    def metric_table(self, metrics, title):
        return (f"{title}\n  {'characters':<16}{int(metrics['count_all']):>10}\n"
                f"  {'perplexity':<16}{metrics['ppl']:>10.3f}\n  {'bits/char':<16}{metrics['bits_per_char']:>10.3f}")
