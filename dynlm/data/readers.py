"""Entry point of the readers: bytes of one input file -> documents or Quarantined records.

Three formats: CoNLL-2012 text, plain text, and Parquet files of DOCUMENT_SCHEMA rows
(``*.parquet``: documents already parsed elsewhere, e.g. a retrain's new documents). Decoding is done per document (CoNLL) or per line (plain text), so one document with invalid
UTF-8 is quarantined while the other documents of the same file survive.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator

from dynlm.data.conll import parse_conll
from dynlm.data.plaintext import document_prefix, parse_lines
from dynlm.data.schema import DOCUMENT_SCHEMA, Quarantined

FORMATS = ("auto", "conll", "text")
_BEGIN = b"#begin document"


def _decode_error(chunk: bytes, first_line: int, exc: UnicodeDecodeError) -> tuple[int, str]:
    line = first_line + chunk[: exc.start].count(b"\n")
    return line, f"invalid UTF-8 at line {line}: byte {chunk[exc.start:exc.start + 1]!r} ({exc.reason})"


def _conll_chunks(data: bytes) -> Iterator[tuple[int, bytes]]:
    """Split a CoNLL file into (first line number, bytes) chunks, one per '#begin document'."""
    lines = data.splitlines(keepends=True)
    start = 0
    for i, line in enumerate(lines):
        if line.startswith(_BEGIN) and i > start:
            yield start + 1, b"".join(lines[start:i])
            start = i
    if start < len(lines):
        yield start + 1, b"".join(lines[start:])


def _parse_conll_bytes(data: bytes, source_file: str) -> Iterator[dict | Quarantined]:
    seen_ids: dict[str, int] = {}
    for first_line, chunk in _conll_chunks(data):
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError as exc:
            line, reason = _decode_error(chunk, first_line, exc)
            head = chunk.split(b"\n", 1)[0].decode("utf-8", errors="replace")
            # Read the document name from the header even though the body is undecodable.
            doc_id = ""
            for item in parse_conll(head + "\n#end document\n", source_file, first_line=first_line):
                doc_id = item.doc_id if isinstance(item, Quarantined) else item["doc_id"]
                break
            yield Quarantined(source_file, doc_id, line, reason)
            continue
        yield from parse_conll(text, source_file, first_line=first_line, seen_ids=seen_ids)


def _parse_text_bytes(data: bytes, source_file: str, lines_per_document: int) -> Iterator[dict | Quarantined]:
    lines: list[str] = []
    bad: dict[int, str] = {}
    for line_no, raw in enumerate(data.splitlines(), start=1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            bad[line_no] = _decode_error(raw, line_no, exc)[1]
            lines.append(raw.decode("utf-8", errors="replace"))
    yield from parse_lines(lines, source_file, lines_per_document=lines_per_document, bad_lines=bad)


def detect_format(data: bytes) -> str:
    """``conll`` when a line starts with '#begin document', else ``text``."""
    return "conll" if data.startswith(_BEGIN) or (b"\n" + _BEGIN) in data else "text"


def _parse_parquet_documents(data: bytes, source_file: str) -> Iterator[dict | Quarantined]:
    """DOCUMENT_SCHEMA rows of a Parquet file (other columns are ignored); one Quarantined
    record for the whole file when it is not such a file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(pa.BufferReader(data), columns=DOCUMENT_SCHEMA.names)
        table = table.cast(DOCUMENT_SCHEMA)
    except (pa.ArrowException, ValueError, KeyError) as exc:
        yield Quarantined(source_file, document_prefix(source_file), 0,
                          f"not a Parquet file of documents ({', '.join(DOCUMENT_SCHEMA.names)}): {exc}")
        return
    yield from table.to_pylist()


def parse_file(
    data: bytes, source_file: str, format: str = "auto", *, lines_per_document: int = 0
) -> Iterator[dict | Quarantined]:
    """Parse one input file.

    Args:
        data: the file's bytes, gzip-compressed or not (decided by the gzip magic bytes).
        source_file: the file's path or URI, recorded in every output.
        format: ``conll``, ``text`` or ``auto`` (CoNLL if a line starts with '#begin document');
            a ``*.parquet`` file is read as DOCUMENT_SCHEMA rows whatever the format.
        lines_per_document: plain text only, see :mod:`dynlm.data.plaintext`.

    Returns:
        An iterator of DOCUMENT_SCHEMA dicts and Quarantined records, in file order.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    if source_file.endswith(".parquet"):
        yield from _parse_parquet_documents(data, source_file)
        return
    # Gunzip by the magic bytes, not the name: a reader that already decompressed
    # a ``*.gz`` file (Ray Data does) hands over plain bytes under the same name.
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            yield Quarantined(source_file, document_prefix(source_file), 0, f"cannot gunzip the file: {exc}")
            return
    if format == "auto":
        format = detect_format(data)
    if format == "conll":
        yield from _parse_conll_bytes(data, source_file)
    else:
        yield from _parse_text_bytes(data, source_file, lines_per_document)
