"""A trained model's files and what a served model does: parse documents, score every token.

``pipelines/pyfunc_model.py`` (the MLflow pyfunc, logged as *models from code*) calls these;
``pipelines/tracking.py`` writes the artifacts with the logged model and reads them back. The
artifacts are plain files::

    weights.pt          the state_dict (torch.save of tensors; loaded with weights_only=True)
    model.json          {"format": "dynlm-pyfunc", "version": 2, "task": "lm", "model_config": {...}, "vocab_spec": {...}}
    preprocessor.json   the task's preprocessor of the prepared data (the LM: vocabulary, short list, BPE)

The model is rebuilt through its task (:func:`dynlm.tasks.get_task`), so a model of any task is
logged, registered and loaded the same way; scoring documents (:func:`score_documents`) is the
LM task's.

Input (:func:`parse_input`): documents, either raw text (one sentence per line,
whitespace-separated tokens; blank lines are skipped) or pre-tokenized (a list of sentences,
each a list of strings). Words the vocabulary lacks become ``<unk>`` on the output side and
keep their subword segmentation on the input side; ``<unkN>`` tokens are read as entity N. Bad
input is an :class:`InputError` that names the document.

Output (:func:`score_documents`): one dict per document: ``tokens`` (the predicted tokens: each
sentence's words then ``<eos>``), ``token_log_probs`` (natural log-probability of each),
``num_tokens``, ``num_unknown`` (tokens scored as ``<unk>``), ``log_prob`` (their sum) and
``perplexity`` (``exp(-log_prob / num_tokens)``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from dynlm.data.batching import collate_documents
from dynlm.data.preprocessor import Preprocessor
from dynlm.losses import token_nll
from dynlm.models.config import ModelConfig
from dynlm.tasks import DEFAULT_TASK, get_task
from dynlm.vocab_spec import VocabSpec

FORMAT_NAME = "dynlm-pyfunc"
FORMAT_VERSION = 2  # 2: model.json names the task
WEIGHTS_FILE = "weights.pt"
CONFIG_FILE = "model.json"
PREPROCESSOR_FILE = "preprocessor.json"
ARTIFACT_KEYS = {"weights": WEIGHTS_FILE, "model_config": CONFIG_FILE, "preprocessor": PREPROCESSOR_FILE}
EOS_TOKEN = "<eos>"
MAX_DOCUMENTS_PER_BATCH = 16


class InputError(ValueError):
    """Bad input documents (an empty document, a wrong column); the message says which document."""


# ---------------------------------------------------------------------------------------------
# Files <-> model
# ---------------------------------------------------------------------------------------------


def write_artifacts(folder: str | Path, model: torch.nn.Module, model_cfg, spec, preprocessor_path: str | Path,
                    *, task: str = DEFAULT_TASK) -> dict[str, str]:
    """Write the three artifact files of a model of ``task`` into ``folder``; return ``{artifact key: path}``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state_dict = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    torch.save(state_dict, folder / WEIGHTS_FILE)
    meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "task": task,
            "model_config": model_cfg.to_dict(), "vocab_spec": spec.to_dict()}
    (folder / CONFIG_FILE).write_text(json.dumps(meta, indent=1), encoding="utf-8")
    (folder / PREPROCESSOR_FILE).write_bytes(Path(preprocessor_path).read_bytes())
    return {key: str(folder / name) for key, name in ARTIFACT_KEYS.items()}


def load_artifacts(weights_path: str | Path, config_path: str | Path, preprocessor_path: str | Path):
    """Rebuild the model from its artifact files, through its task.

    Returns:
        ``(task, model, model_cfg, spec, preprocessor)``; the model is in eval mode on the CPU.
    """
    meta = json.loads(Path(config_path).read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT_NAME or meta.get("version") != FORMAT_VERSION:
        raise ValueError(f"{config_path}: not a {FORMAT_NAME} v{FORMAT_VERSION} config "
                         f"(format={meta.get('format')!r}, version={meta.get('version')!r})")
    task = get_task(meta["task"])
    model_cfg = task.model_config.from_dict(meta["model_config"])
    spec = task.spec_class.from_dict(meta["vocab_spec"])
    preprocessor = task.load_preprocessor(Path(preprocessor_path).read_text(encoding="utf-8"))
    if preprocessor.spec.to_dict() != spec.to_dict():
        raise ValueError(f"{preprocessor_path} does not match the model's vocabulary: "
                         f"{preprocessor.spec.to_dict()} != {spec.to_dict()}")
    model = task.build_model(model_cfg, spec)
    state_dict = torch.load(weights_path, map_location="cpu", weights_only=True)
    model.load_state_dict(state_dict)
    model.eval()
    return task, model, model_cfg, spec, preprocessor


def load_model_dir(model_dir: str | Path):
    """Load from a downloaded MLflow model folder (its ``artifacts/`` subfolder)."""
    folder = Path(model_dir) / "artifacts"
    missing = [name for name in ARTIFACT_KEYS.values() if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{model_dir} is not a dynlm pyfunc model: missing artifacts/{missing}")
    return load_artifacts(folder / WEIGHTS_FILE, folder / CONFIG_FILE, folder / PREPROCESSOR_FILE)


# ---------------------------------------------------------------------------------------------
# Input parsing and scoring
# ---------------------------------------------------------------------------------------------


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


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


def request_frame(request: Any, *, columns: tuple[str, ...], required_any: tuple[str, ...], hint: str,
                  rows_are: str = "rows"):
    """A served model's request as a pandas DataFrame, checked for its columns.

    ``request`` is a DataFrame, a dict of columns, a list of row dicts, a list of strings (one row
    each, in column ``required_any[0]``) or one string (one such row).

    Raises:
        InputError: another type, a column not in ``columns``, none of ``required_any`` (the
            message adds ``hint``), or no rows (``no <rows_are>``).
    """
    import pandas as pd  # lazy: only the pyfunc input needs it

    first = required_any[0]
    if isinstance(request, str):
        request = pd.DataFrame({first: [request]})
    elif isinstance(request, dict):
        request = pd.DataFrame(request)
    elif isinstance(request, list):
        request = pd.DataFrame({first: request}) if all(isinstance(x, str) for x in request) else pd.DataFrame(request)
    needed = " or ".join(repr(c) for c in required_any)
    if not isinstance(request, pd.DataFrame):
        raise InputError(f"expected a DataFrame with a {needed} column, got {type(request).__name__}")
    unknown = sorted(set(request.columns) - set(columns))
    if unknown:
        raise InputError(f"unknown input column(s) {unknown}: use {' or '.join(repr(c) for c in columns)}")
    if not set(required_any) & set(request.columns):
        raise InputError(f"the input has no {needed} column: {hint}")
    if len(request) == 0:
        raise InputError(f"no {rows_are}: the input has no rows")
    return request


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
        if not _missing(text) and not _missing(tokens):
            raise InputError(f"document {index}: give 'text' or 'tokens', not both")
        value = tokens if _missing(text) else text
        if _missing(value):
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
