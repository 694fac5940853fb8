"""The plain-stream reference the LM benchmarks compare dynlm's training with: a
pytorch/examples word_language_model LSTM LM (embedding -> dropout -> LSTM -> dropout -> linear)
trained by a plain PyTorch loop over the training tokens concatenated into one stream. It keeps
no per-document state and no masks: one fused LSTM call per step. It is the thing compared
against, so it keeps its own loop and optimizer (not dynlm's runner)."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch
from torch import nn


class PlainStreamLM(nn.Module):
    """The reference network: ``vocab`` ids in, ``vocab`` logits out."""

    def __init__(self, vocab: int, embed_dim: int, hidden_dim: int, num_layers: int, dropout: float):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed_dim)
        self.drop = nn.Dropout(dropout)
        self.rnn = nn.LSTM(embed_dim, hidden_dim, num_layers, dropout=dropout if num_layers > 1 else 0.0,
                           batch_first=True)
        self.decoder = nn.Linear(hidden_dim, vocab)

    def forward(self, tokens, hidden):
        out, hidden = self.rnn(self.drop(self.embedding(tokens)), hidden)
        return self.decoder(self.drop(out)), hidden


def input_word_ids(row: dict) -> Iterator[int]:
    """The input word id of every input position of an encoded LM row (each sentence but its <eos>)."""
    position = 0
    for length in row["sentence_lengths"]:
        yield from row["word_ids"][position : position + length - 1]
        position += length


def token_stream(rows: Iterable[dict], columns: int) -> torch.Tensor:
    """Every row's input word ids, concatenated and cut into ``columns`` equal streams: ``[columns, T]``."""
    stream = torch.tensor([word for row in rows for word in input_word_ids(row)], dtype=torch.long)
    length = stream.numel() // columns
    return stream[: length * columns].view(columns, length)


def plain_stream_train(model: PlainStreamLM, stream: torch.Tensor, optimizer, bptt: int, device) -> int:
    """One pass over ``stream [B, T]`` in steps of ``bptt`` tokens (clip 0.25, the state carried
    and detached between steps); returns the target tokens read."""
    hidden, tokens = None, 0
    for start in range(0, stream.size(1) - 1, bptt):
        end = min(start + bptt, stream.size(1) - 1)
        inputs, targets = stream[:, start:end].to(device), stream[:, start + 1 : end + 1].to(device)
        optimizer.zero_grad(set_to_none=True)
        logits, hidden = model(inputs, hidden)
        nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1)).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        hidden = tuple(h.detach() for h in hidden)
        tokens += targets.numel()
    return tokens
