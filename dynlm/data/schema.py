"""Arrow schemas of the data contract (docs/ARCHITECTURE.md) and the quarantine record.

* DOCUMENT_SCHEMA: one row per parsed document (readers -> anonymization).
* ENCODED_SCHEMA: one row per encoded document (Preprocessor -> Parquet shards -> batching).
* QUARANTINE_SCHEMA: one row per malformed document (never an exception, never silently dropped).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pyarrow as pa

MENTION_TYPE = pa.struct(
    [
        pa.field("sentence", pa.int32()),
        pa.field("start", pa.int32()),
        pa.field("end", pa.int32()),  # inclusive token index
        pa.field("chain", pa.string()),
    ]
)

DOCUMENT_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string()),
        pa.field("source_file", pa.string()),
        pa.field("sentences", pa.list_(pa.list_(pa.string()))),
        pa.field("mentions", pa.list_(MENTION_TYPE)),
    ]
)

ENCODED_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string()),
        pa.field("source_file", pa.string()),
        pa.field("num_tokens", pa.int32()),
        pa.field("sentence_lengths", pa.list_(pa.int32())),
        pa.field("word_ids", pa.list_(pa.int32())),
        pa.field("entity_ids", pa.list_(pa.int32())),
        pa.field("subword_ids", pa.list_(pa.int32())),
        pa.field("subword_lengths", pa.list_(pa.int32())),
    ]
)

QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("source_file", pa.string()),
        pa.field("doc_id", pa.string()),
        pa.field("line", pa.int64()),
        pa.field("reason", pa.string()),
    ]
)


@dataclass(frozen=True)
class Quarantined:
    """A malformed document set aside with the reason (the rest of its file goes on).

    Args:
        source_file: the input file.
        doc_id: the document's id (as far as it could be read; "" when unknown).
        line: 1-based line number of the problem in the (uncompressed) file, 0 when not tied to a line.
        reason: what is wrong, in words.
    """

    source_file: str
    doc_id: str
    line: int
    reason: str

    def to_dict(self) -> dict:
        """Row of QUARANTINE_SCHEMA."""
        return asdict(self)
