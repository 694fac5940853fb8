"""Reader for plain-text LM corpora: one sentence per line (WikiText-2, PTB style).

* Each non-empty line is a sentence of whitespace-separated tokens (kept as they are, e.g. the
  corpus' own ``<unk>``).
* A WikiText level-1 heading line `` = Title = `` starts a new document (the heading is the
  document's first sentence); ``= = Section = =`` headings do not.
* ``lines_per_document > 0`` additionally cuts documents every that many non-empty lines (PTB has
  no headings: the file becomes chunks of N sentences). With 0 and no headings the whole file is
  one document.
* Plain text has no coreference annotation: ``mentions`` is empty.

Document ids are ``"<file name without .gz>/doc_<k>"`` (k = 0, 1, ... in file order).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import PurePath

from dynlm.data.schema import Quarantined


def is_title_heading(line: str) -> bool:
    """True for a WikiText level-1 heading `` = Title = `` (not ``= = Section = =``)."""
    stripped = line.strip()
    return (
        len(stripped) > 4
        and stripped.startswith("= ")
        and stripped.endswith(" =")
        and not stripped.startswith("= =")
    )


def document_prefix(source_file: str) -> str:
    name = PurePath(source_file).name
    return name[:-3] if name.endswith(".gz") else name


def parse_lines(
    lines: Sequence[str],
    source_file: str,
    *,
    lines_per_document: int = 0,
    first_line: int = 1,
    bad_lines: dict[int, str] | None = None,
) -> Iterator[dict | Quarantined]:
    """Group lines into documents (see the module docstring).

    Args:
        lines: the file's lines (without line ends).
        source_file: recorded in every output.
        lines_per_document: >0 cuts documents every that many non-empty lines.
        first_line: line number of ``lines[0]`` in the file.
        bad_lines: line number -> reason for lines that could not be decoded; the document that
            holds one is quarantined.

    Returns:
        An iterator of DOCUMENT_SCHEMA dicts and Quarantined records.
    """
    if lines_per_document < 0:
        raise ValueError(f"lines_per_document must be >= 0, got {lines_per_document}")
    bad_lines = bad_lines or {}
    prefix = document_prefix(source_file)
    index = 0
    sentences: list[list[str]] = []
    start_line = first_line
    bad: tuple[int, str] | None = None

    def flush() -> Iterator[dict | Quarantined]:
        nonlocal index, sentences, bad
        if sentences or bad is not None:
            doc_id = f"{prefix}/doc_{index}"
            index += 1
            if bad is not None:
                yield Quarantined(source_file, doc_id, bad[0], bad[1])
            else:
                yield {"doc_id": doc_id, "source_file": source_file, "sentences": sentences, "mentions": []}
        sentences, bad = [], None

    for line_no, line in enumerate(lines, start=first_line):
        tokens = line.split()
        if line_no in bad_lines:
            if is_title_heading(line):
                yield from flush()
            if bad is None:
                bad = (line_no, bad_lines[line_no])
            continue
        if not tokens:
            continue
        full = lines_per_document > 0 and len(sentences) >= lines_per_document
        if is_title_heading(line) or full:
            yield from flush()
            start_line = line_no
        sentences.append(tokens)
    yield from flush()
    if index == 0:
        yield Quarantined(source_file, f"{prefix}/doc_0", start_line, "empty document: the file has no text")


def parse_text(text: str, source_file: str, *, lines_per_document: int = 0) -> Iterator[dict | Quarantined]:
    """Parse decoded plain text into documents (see the module docstring).

    Args:
        text: the whole file as a string.
        source_file: recorded in every output.
        lines_per_document: >0 cuts documents every that many non-empty lines.

    Returns:
        An iterator of DOCUMENT_SCHEMA dicts (no mentions) and Quarantined records.
    """
    return parse_lines(text.splitlines(), source_file, lines_per_document=lines_per_document)
