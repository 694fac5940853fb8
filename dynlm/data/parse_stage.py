"""Parse stage of the LM task: binary input files -> anonymized documents with their split.

:func:`parse_files` runs on one Arrow batch of ``{bytes, path}`` rows (what Ray Data's
``read_binary_files(include_paths=True)`` gives, or a table built by hand) and returns
:data:`PARSED_SCHEMA` rows: one per document (``kind="document"``, with its split), per dropped
document (``kind="dropped"``: too many chains) and per quarantine record (``kind="quarantine"``,
with ``line`` and ``reason``). Nothing is skipped silently. Pure pyarrow; no Ray.
"""

from __future__ import annotations

import pyarrow as pa

from dynlm.data.anonymize import STAT_KEYS, anonymize
from dynlm.data.config import DataConfig
from dynlm.data.readers import parse_file
from dynlm.data.schema import Quarantined
from dynlm.data.split import assign_split, file_split

DOC_STATS = tuple(k for k in STAT_KEYS if k != "documents")

# One row per parsed document or quarantine record (internal to this job).
PARSED_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string()),  # "document" | "dropped" | "quarantine"
        pa.field("doc_id", pa.string()),
        pa.field("source_file", pa.string()),  # the document's own (a Parquet row keeps its original)
        pa.field("input_file", pa.string()),  # the file it was read from (its split is read from this path)
        pa.field("split", pa.string()),  # "" unless kind == "document"
        pa.field("sentences", pa.list_(pa.list_(pa.string()))),  # anonymized; [] unless a document
        pa.field("num_sentences", pa.int64()),
        pa.field("num_tokens", pa.int64()),
        *[pa.field(k, pa.int64()) for k in DOC_STATS],
        pa.field("line", pa.int64()),
        pa.field("reason", pa.string()),
    ]
)


def parse_files(batch: pa.Table, cfg_dict: dict) -> pa.Table:
    """Binary files -> PARSED_SCHEMA rows (anonymized documents with their split, quarantine).

    ``cfg_dict``'s ``inputs`` and ``splits`` must be resolved like the rows' paths (absolute local
    paths or URIs: see pipelines.prepare), since a file's split is read from its path below its
    input. The driver checks afterwards that all files follow one rule (``check_split_rule``).
    """
    cfg = DataConfig.from_dict(cfg_dict)
    rows: dict[str, list] = {f.name: [] for f in PARSED_SCHEMA}

    def add(kind, doc_id, source_file, split="", sentences=(), stats=None, line=0, reason=""):
        values = dict(kind=kind, doc_id=doc_id, source_file=source_file, input_file=path, split=split,
                      sentences=list(sentences), num_sentences=len(sentences),
                      num_tokens=sum(len(s) for s in sentences), line=line, reason=reason)
        values.update({k: (stats or {}).get(k, 0) for k in DOC_STATS})
        for key, value in values.items():
            rows[key].append(value)

    for data, path in zip(batch.column("bytes").to_pylist(), batch.column("path").to_pylist()):
        try:  # a file is either parsed or quarantined as a whole when its reader fails
            items = list(parse_file(data, path, cfg.format, lines_per_document=cfg.lines_per_document))
        except Exception as exc:  # noqa: BLE001 - recorded with its reason, never dropped
            add("quarantine", "", path, reason=f"reader failed: {type(exc).__name__}: {exc}")
            continue
        _, file_level_split = file_split(path, cfg.inputs, cfg.splits)  # None: hash each document
        for item in items:
            if isinstance(item, Quarantined):
                add("quarantine", item.doc_id, item.source_file, line=item.line, reason=item.reason)
                continue
            try:
                doc, stats = anonymize(item, max_chains=cfg.max_chains, min_chain_mentions=cfg.min_chain_mentions,
                                       too_many_chains=cfg.too_many_chains)
            except ValueError as exc:
                add("quarantine", item["doc_id"], item["source_file"], reason=f"anonymize: {exc}")
                continue
            if doc is None:
                add("dropped", item["doc_id"], item["source_file"], stats=stats,
                    reason=f"more than max_chains={cfg.max_chains} entity chains")
                continue
            split = file_level_split or assign_split(doc["doc_id"], seed=cfg.split_seed,
                                                     valid_fraction=cfg.valid_fraction, test_fraction=cfg.test_fraction)
            sentences = shorten_document(doc["sentences"], max_sentence_tokens=cfg.max_sentence_tokens,
                                         max_document_sentences=cfg.max_document_sentences)
            add("document", doc["doc_id"], doc["source_file"], split, sentences, stats)
    return pa.Table.from_pydict(rows, schema=PARSED_SCHEMA)


def shorten_document(sentences: list[list[str]], *, max_sentence_tokens: int,
                     max_document_sentences: int) -> list[list[str]]:
    """An anonymized document's sentences as ``data.max_sentence_tokens`` and
    ``data.max_document_sentences`` keep them: every sentence longer than ``max_sentence_tokens``
    cut into consecutive pieces of at most that many tokens, then the first
    ``max_document_sentences`` sentences (0 turns either off)."""
    if max_sentence_tokens > 0:
        sentences = [sentence[start : start + max_sentence_tokens]
                     for sentence in sentences for start in range(0, max(len(sentence), 1), max_sentence_tokens)]
    return sentences[:max_document_sentences] if max_document_sentences > 0 else sentences
