"""The language-model task's served model: documents in, per-token log-probabilities out.

Input (:func:`parse_input`): documents, either raw text (one sentence per line,
whitespace-separated tokens; blank lines are skipped) or pre-tokenized (a list of sentences,
each a list of strings). Words the vocabulary lacks become ``<unk>`` on the output side and
keep their subword segmentation on the input side; ``<unkN>`` tokens are read as entity N. Bad
input is an :class:`~dynlm.requests.InputError` that names the document.

Output (:func:`score_documents`): one dict per document: ``tokens`` (the predicted tokens: each
sentence's words then ``<eos>``), ``token_log_probs`` (natural log-probability of each),
``num_tokens``, ``num_unknown`` (tokens scored as ``<unk>``), ``log_prob`` (their sum) and
``perplexity`` (``exp(-log_prob / num_tokens)``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dynlm.data.batching import collate_documents
from dynlm.data.preprocessor import Preprocessor
from dynlm.losses import token_nll
from dynlm.models.config import ModelConfig
from dynlm.requests import InputError, is_missing, request_frame
from dynlm.vocab_spec import VocabSpec

EOS_TOKEN = "<eos>"
MAX_DOCUMENTS_PER_BATCH = 16


def _as_sentences(value: Any, index: int) -> list[list[str]]:
    if isinstance(value, str):
        sentences = [line.split() for line in value.splitlines()]
    else:
        try:
            sentences = [list(sentence) for sentence in value]
        except TypeError:
            raise InputError(f"document {index}: 'tokens' must be a list of sentences "
                               f"(lists of strings), got {type(value).__name__}") from None
        for sentence in sentences:
            if not all(isinstance(token, str) for token in sentence):
                raise InputError(f"document {index}: 'tokens' must be a list of sentences, each a "
                                   f"list of strings; got {sentence[:5]!r}")
        sentences = [[t for t in sentence if t.strip()] for sentence in sentences]
    sentences = [s for s in sentences if s]
    for sentence in sentences:
        for token in sentence:
            try:
                token.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate (JSON "\ud800"): not text
                raise InputError(f"document {index}: token {token!r} is not valid Unicode text "
                                 "(a lone surrogate); send UTF-8 text") from None
    if not sentences:
        raise InputError(f"document {index} is empty: give at least one line with a word "
                           "('text') or one non-empty sentence ('tokens')")
    return sentences


def parse_input(model_input: Any) -> list[list[list[str]]]:
    """Documents as lists of token sentences from a DataFrame, a dict, a list or a string.

    Raises:
        InputError: the input is not one of those, has another column or neither ``text`` nor
            ``tokens``, no rows, or a document that is empty, is not text (a lone surrogate) or
            gives both ``text`` and ``tokens``; the message names the document or the column.
    """
    model_input = request_frame(model_input, columns=("text", "tokens"), required_any=("text", "tokens"),
                                hint="give one document per row, as raw text in column 'text' or as a "
                                     "list of sentences in column 'tokens'", rows_are="documents")
    documents = []
    for index, row in enumerate(model_input.to_dict("records")):
        text, tokens = row.get("text"), row.get("tokens")
        if not is_missing(text) and not is_missing(tokens):
            raise InputError(f"document {index}: give 'text' or 'tokens', not both")
        value = tokens if is_missing(text) else text
        if is_missing(value):
            raise InputError(f"document {index} is empty: no 'text' and no 'tokens'")
        documents.append(_as_sentences(value, index))
    return documents


def score_documents(model: torch.nn.Module, model_cfg: ModelConfig, spec: VocabSpec,
                    preprocessor: Preprocessor, documents: list[list[list[str]]]) -> list[dict]:
    """Per-token log-probabilities and perplexity of each document (one output dict each).

    Raises:
        InputError: a document names an entity ``<unkN>`` beyond the model's chains.
    """
    results: list[dict] = []
    for start in range(0, len(documents), MAX_DOCUMENTS_PER_BATCH):
        chunk = documents[start:start + MAX_DOCUMENTS_PER_BATCH]
        rows = []
        for offset, sentences in enumerate(chunk):
            try:
                row = dict(preprocessor.encode_text(sentences))
            except ValueError as exc:  # an entity <unkN> beyond the model's chains
                raise InputError(f"document {start + offset}: {exc} (this model reads the entities "
                                 f"<unk1>..<unk{spec.num_entities}>)") from None
            row["doc_id"], row["source_file"] = f"input-{start + offset}", "<pyfunc input>"
            rows.append(row)
        batch = collate_documents(rows, spec)
        per_doc: list[list[torch.Tensor]] = [[] for _ in chunk]
        unknown: list[list[torch.Tensor]] = [[] for _ in chunk]
        # Models that compute gradients while they read (meta-learned fast weights) say so.
        with torch.set_grad_enabled(bool(getattr(model, "needs_grad_at_eval", False))):
            state = model.init_state(len(chunk))
            for sentence in batch.sentences:
                output, state = model(sentence, state)
                state = model.detach_state(state)
                picked = -token_nll(output.logits.detach(), sentence.targets, sentence.mask, output.positions)  # [B, L]
                for b, length in enumerate(sentence.lengths.tolist()):
                    per_doc[b].append(picked[b, :length])
                    unknown[b].append(sentence.targets[b, :length] == spec.unk_id)
        for b, sentences in enumerate(chunk):
            token_log_probs = torch.cat(per_doc[b]).tolist()
            labels = [token for sentence in sentences for token in (*sentence, EOS_TOKEN)]
            if len(labels) != len(token_log_probs):
                raise RuntimeError(f"document {start + b}: {len(token_log_probs)} scored tokens for "
                                   f"{len(labels)} input tokens (preprocessor tokenization differs)")
            total = float(sum(token_log_probs))
            results.append({
                "tokens": labels,
                "token_log_probs": token_log_probs,
                "num_tokens": len(labels),
                "num_unknown": int(torch.cat(unknown[b]).sum()),
                "log_prob": total,
                "perplexity": math.exp(-total / len(labels)),
            })
    return results
