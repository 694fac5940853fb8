"""Reader for the Children's Book Test format (Hill et al., 2016): 21-line question blocks.

A block is lines ``1 sentence`` ... ``20 sentence`` (the context), then
``21 query-with-XXXXX<TAB>answer<TAB><TAB>cand1|cand2|...|cand10``, then a blank line.

Every block is one record with the keys of :data:`QUESTION_KEYS` (the cloze task's question,
shared with :mod:`dynlm.data.cmrc`): ``doc_id`` ``"<file name without .txt>/<k>"`` (k = 0, 1, ...
in file order), ``line`` (of its first line), ``document`` (the 20 sentences' tokens, one flat
list), ``query``, ``answer``, ``candidates`` and ``answer_class``: from the file name
(``cbtest_NE_*`` named entity, ``CN`` common noun, ``V`` verb, ``P`` preposition; else ``other``).
A malformed block is a :class:`Quarantined` with its reason (the other blocks go on): not 21
lines, a line number out of order, a query line without its tab-separated fields, no candidate,
an answer that is not among the candidates, a query without the ``XXXXX`` blank, invalid UTF-8.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import PurePath

from dynlm.data.schema import Quarantined

QUESTION_KEYS = ("doc_id", "line", "document", "query", "answer", "candidates", "answer_class")
BLANK = "XXXXX"
CONTEXT_LINES = 20
ANSWER_CLASSES = ("named_entity", "common_noun", "verb", "preposition", "other")
_FILE_CLASS = {"NE": "named_entity", "CN": "common_noun", "V": "verb", "P": "preposition"}
_FILE = re.compile(r"cbtest_([A-Z]+)_")


def is_cbt(path: str) -> bool:
    """A CBT file by its name (``cbtest_<class>_<split>.txt``)."""
    return _FILE.match(PurePath(path).name) is not None and path.endswith(".txt")


def file_class(path: str) -> str:
    """The answer class all questions of a CBT file share (from its name)."""
    match = _FILE.match(PurePath(path).name)
    return _FILE_CLASS.get(match.group(1), "other") if match else "other"


def file_split(path: str) -> str | None:
    """The split a CBT file name gives (``cbtest_NE_valid_2000ex.txt`` -> ``valid``), else None."""
    parts = PurePath(path).name.removesuffix(".txt").split("_")
    split = parts[2] if len(parts) > 2 and _FILE.match(PurePath(path).name) else None
    return split if split in ("train", "valid", "test") else None


def _blocks(lines: list[bytes]) -> Iterator[tuple[int, list[bytes]]]:
    """(first line number, lines) of each run of non-blank lines."""
    block: list[bytes] = []
    start = 1
    for number, line in enumerate(lines, start=1):
        if line.strip():
            if not block:
                start = number
            block.append(line)
        elif block:
            yield start, block
            block = []
    if block:
        yield start, block


def _question(lines: list[str], start: int) -> dict | str:
    """The question of one block's decoded lines, or the reason it is malformed."""
    if len(lines) != CONTEXT_LINES + 1:
        return f"block has {len(lines)} lines, a question has {CONTEXT_LINES + 1}"
    document: list[str] = []
    for offset, line in enumerate(lines):
        number, _, text = line.partition(" ")
        if number != str(offset + 1):
            return f"line {start + offset}: numbered {number!r}, expected {offset + 1}"
        if offset < CONTEXT_LINES:
            document.extend(text.split())
    fields = lines[-1].partition(" ")[2].split("\t")
    if len(fields) != 4 or fields[2]:
        return f"line {start + CONTEXT_LINES}: query line is not 'query<TAB>answer<TAB><TAB>candidates'"
    query, answer, candidates = fields[0].split(), fields[1].strip(), [c for c in fields[3].strip().split("|") if c]
    if BLANK not in query:
        return f"line {start + CONTEXT_LINES}: query has no {BLANK} blank"
    if not candidates:
        return f"line {start + CONTEXT_LINES}: no candidate"
    if answer not in candidates:
        return f"line {start + CONTEXT_LINES}: answer {answer!r} is not among the candidates"
    return {"document": document, "query": query, "answer": answer, "candidates": candidates}


def parse_cbt(data: bytes, source_file: str) -> Iterator[dict | Quarantined]:
    """Questions (dicts of :data:`QUESTION_KEYS`) and quarantined blocks of one CBT file."""
    name = PurePath(source_file).name
    prefix = name[:-4] if name.endswith(".txt") else name
    answer_class = file_class(source_file)
    for index, (start, raw_lines) in enumerate(_blocks(data.splitlines())):
        doc_id = f"{prefix}/{index}"
        try:
            lines = [line.decode("utf-8").rstrip("\r") for line in raw_lines]
        except UnicodeDecodeError as exc:
            yield Quarantined(source_file, doc_id, start, f"invalid UTF-8 in the block at line {start} ({exc.reason})")
            continue
        question = _question(lines, start)
        if isinstance(question, str):
            yield Quarantined(source_file, doc_id, start, question)
        else:
            yield {"doc_id": doc_id, "line": start, **question,
                   "answer_class": answer_class}
