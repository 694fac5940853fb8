"""Reader for CoNLL-2012-style coreference files (LitBank 13 columns, OntoNotes ``*_conll``).

Layout: ``#begin document (name); part N`` ... ``#end document``; one token per line, columns
separated by tabs (LitBank) or runs of spaces (OntoNotes); column 4 is the word and the LAST
column the coreference marks: ``(N`` opens a mention of chain N, ``N)`` closes it, ``(N)`` is a
one-token mention, several marks are joined with ``|``; ``-``, ``_`` or empty means none. A blank
line ends a sentence. Every part is its own document with ``doc_id = "name/part_N"``.

A malformed document becomes a :class:`Quarantined` record (first problem found); the
following documents of the file are read normally.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from dynlm.data.schema import Quarantined

MIN_COLUMNS = 12  # CoNLL-2012: 11 fixed columns (+ predicate arguments) + coreference; LitBank has 13
_BEGIN = re.compile(r"^#begin document\s*\(?(?P<name>[^);]*?)\)?\s*(?:;\s*part\s+(?P<part>\d+))?\s*$")
_MARK = re.compile(r"^(?P<open>\()?(?P<chain>[^()|\s]+)(?P<close>\))?$")
_NO_MARK = ("", "-", "_")


class _DocumentError(Exception):
    """Internal: the current document is malformed (line, reason)."""

    def __init__(self, line: int, reason: str):
        super().__init__(reason)
        self.line = line
        self.reason = reason


def document_id(name: str, part: int) -> str:
    """The stable id of one part of a CoNLL document."""
    return f"{name}/part_{part}"


class _DocumentBuilder:
    """Accumulates the sentences and mentions of one ``#begin document`` ... ``#end document``."""

    def __init__(self, doc_id: str, begin_line: int):
        self.doc_id = doc_id
        self.begin_line = begin_line
        self.sentences: list[list[str]] = []
        self.mentions: list[tuple[int, int, int, str]] = []  # (sentence, start, end, chain)
        self.tokens: list[str] = []
        self.num_columns = 0
        self.open: dict[str, list[tuple[int, int]]] = {}  # chain -> stack of (start token, line)
        self.error: _DocumentError | None = None

    def add_token(self, line_no: int, line: str) -> None:
        columns = line.split("\t") if "\t" in line else line.split()
        if len(columns) < MIN_COLUMNS:
            raise _DocumentError(
                line_no, f"wrong column count: {len(columns)} columns, at least {MIN_COLUMNS} expected"
            )
        if self.tokens and len(columns) != self.num_columns:
            raise _DocumentError(
                line_no,
                f"wrong column count: {len(columns)} columns, the sentence's other rows have {self.num_columns}",
            )
        self.num_columns = len(columns)
        word = columns[3].strip()
        if not word:
            raise _DocumentError(line_no, "empty word in column 4")
        position = len(self.tokens)
        self.tokens.append(word)
        marks = columns[-1].strip()
        if marks in _NO_MARK:
            return
        parsed = []
        for mark in marks.split("|"):
            match = _MARK.match(mark.strip())
            if match is None:
                raise _DocumentError(line_no, f"malformed coreference mark {mark!r} in {marks!r}")
            parsed.append(match)
        # Opens first, then closes: "(5|5)" on one token is a one-token mention.
        for match in parsed:
            if match["open"] and not match["close"]:
                self.open.setdefault(match["chain"], []).append((position, line_no))
        for match in parsed:
            chain = match["chain"]
            if match["open"] and match["close"]:
                self.mentions.append((len(self.sentences), position, position, chain))
            elif match["close"]:
                stack = self.open.get(chain)
                if not stack:
                    raise _DocumentError(
                        line_no, f"unbalanced brackets: '{chain})' closes chain {chain} which is not open"
                    )
                start, _ = stack.pop()
                self.mentions.append((len(self.sentences), start, position, chain))
            elif not match["open"]:
                raise _DocumentError(line_no, f"malformed coreference mark {match.group(0)!r}: no bracket")

    def end_sentence(self, line_no: int) -> None:
        for chain, stack in self.open.items():
            if stack:
                _, opened_at = stack[0]
                raise _DocumentError(
                    line_no,
                    f"mention outside its sentence: chain {chain} opened at line {opened_at} "
                    "is not closed before the sentence ends",
                )
        if self.tokens:
            self.sentences.append(self.tokens)
        self.tokens = []
        self.num_columns = 0

    def finish(self, source_file: str, end_line: int) -> dict | Quarantined:
        if self.error is None:
            try:
                self.end_sentence(end_line)
            except _DocumentError as exc:
                self.error = exc
        if self.error is not None:
            return Quarantined(source_file, self.doc_id, self.error.line, self.error.reason)
        if not self.sentences:
            return Quarantined(source_file, self.doc_id, self.begin_line, "empty document: no tokens")
        mentions = sorted(self.mentions, key=lambda m: (m[0], m[1], -m[2], m[3]))
        return {
            "doc_id": self.doc_id,
            "source_file": source_file,
            "sentences": self.sentences,
            "mentions": [
                {"sentence": s, "start": b, "end": e, "chain": c} for s, b, e, c in mentions
            ],
        }


def parse_conll(text: str, source_file: str, *, first_line: int = 1,
                seen_ids: dict[str, int] | None = None) -> Iterator[dict | Quarantined]:
    """Parse CoNLL-2012-style text into documents (DOCUMENT_SCHEMA dicts) or Quarantined records.

    Args:
        text: the decoded file (or a slice of it).
        source_file: recorded in every output.
        first_line: line number of ``text``'s first line in the file (for error messages).
        seen_ids: doc_id -> line of the documents already read from this file (filled in; pass
            the same dict when a file is parsed in slices so duplicates are still found).

    Returns:
        An iterator over one item per document part, in file order.
    """
    builder: _DocumentBuilder | None = None
    seen = {} if seen_ids is None else seen_ids
    stray_start = 0  # first line of a run of token lines outside any document
    stray_count = 0
    line_no = first_line - 1

    def stray_record() -> Quarantined:
        return Quarantined(
            source_file, "", stray_start,
            f"{stray_count} token line(s) outside any '#begin document' ... '#end document' block",
        )

    for line_no, raw in enumerate(text.splitlines(), start=first_line):
        line = raw.rstrip("\r\n")
        if line.startswith("#begin document"):
            if stray_count:
                yield stray_record()
                stray_count = 0
            if builder is not None:
                yield Quarantined(
                    source_file, builder.doc_id, line_no,
                    f"missing '#end document' (document began at line {builder.begin_line})",
                )
            match = _BEGIN.match(line.strip())
            name = match["name"].strip() if match and match["name"] else ""
            part = int(match["part"]) if match and match["part"] else 0
            builder = _DocumentBuilder(document_id(name, part), line_no)
            if not name:
                builder.error = _DocumentError(line_no, f"cannot read the document name in {line!r}")
            elif builder.doc_id in seen:
                builder.error = _DocumentError(
                    line_no, f"duplicate document id {builder.doc_id!r} (first at line {seen[builder.doc_id]})"
                )
            else:
                seen[builder.doc_id] = line_no
            continue
        if line.startswith("#end document"):
            if builder is None:
                yield Quarantined(source_file, "", line_no, "'#end document' without '#begin document'")
            else:
                yield builder.finish(source_file, line_no)
            builder = None
            continue
        if line.startswith("#"):
            continue  # other comment lines
        if builder is None:
            if line.strip():
                stray_start = stray_start if stray_count else line_no
                stray_count += 1
            continue
        if builder.error is not None:
            continue  # skip to the end of the malformed document
        try:
            if line.strip():
                builder.add_token(line_no, line)
            else:
                builder.end_sentence(line_no)
        except _DocumentError as exc:
            builder.error = exc
    if stray_count:
        yield stray_record()
    if builder is not None:
        yield Quarantined(
            source_file, builder.doc_id, line_no,
            f"missing '#end document' at the end of the file (document began at line {builder.begin_line})",
        )
