"""Reader for CMRC-2017 cloze / user-query files (Cui et al., 2018): ``*.doc_query`` + ``*.answer``.

``doc_query`` (gzip or not): one line per sentence, ``N ||| tokens`` (words separated by spaces,
N = 1, 2, ... restarting at 1 for each document), then the document's query ``<qid_K> ||| tokens``.
``answer``: one line per query, ``<qid_K> ||| word``. One query per document.

Every question is one record (a dict, :data:`dynlm.data.cbt.QUESTION_KEYS`): ``doc_id``
``"<file name without .doc_query[.gz]>/qid_K"``, ``line`` (of its query), ``document`` (the
sentences' tokens, one flat list), ``query`` (tokens), ``answer``, ``candidates`` (empty: any word
of the document can be the answer) and ``answer_class`` (``other``: CMRC does not record it).
A malformed question is a :class:`Quarantined` with its reason; the rest of the file goes on:
a line without `` ||| ``, a sentence number out of order, a document without a query or a query
without sentences, an empty query, a query without an answer line, invalid UTF-8 (per document).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import PurePath

from dynlm.data.schema import Quarantined

SEPARATOR = " ||| "
DOC_QUERY_SUFFIXES = (".doc_query", ".doc_query.gz")
ANSWER_SUFFIX = ".answer"
UNKNOWN_CLASS = "other"


def is_doc_query(path: str) -> bool:
    return path.endswith(DOC_QUERY_SUFFIXES)


def answer_path(doc_query_path: str) -> str:
    """``x/cloze.valid.doc_query[.gz]`` -> ``x/cloze.valid.answer``."""
    for suffix in DOC_QUERY_SUFFIXES:
        if doc_query_path.endswith(suffix):
            return doc_query_path[: -len(suffix)] + ANSWER_SUFFIX
    raise ValueError(f"{doc_query_path}: not a CMRC .doc_query file")


def set_name(path: str) -> str:
    """The question set of a file: ``cloze.valid.doc_query.gz`` -> ``cloze.valid``."""
    name = PurePath(path).name
    for suffix in (*DOC_QUERY_SUFFIXES, ANSWER_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _split_line(line: str) -> tuple[str, str] | None:
    if SEPARATOR not in line:
        return None
    key, _, text = line.partition(SEPARATOR)
    return key.strip(), text.strip()


def parse_answers(data: bytes, source_file: str) -> tuple[dict[str, str], list[Quarantined]]:
    """``{qid_K: answer word}`` of an answer file, and its malformed lines (quarantined)."""
    answers: dict[str, str] = {}
    bad: list[Quarantined] = []
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad.append(Quarantined(source_file, "", number, f"invalid UTF-8 in answer line {number} ({exc.reason})"))
            continue
        if not line.strip():
            continue
        parts = _split_line(line)
        if parts is None or not (parts[0].startswith("<qid_") and parts[0].endswith(">")) or len(parts[1].split()) != 1:
            bad.append(Quarantined(source_file, "", number, f"answer line {number} is not '<qid_K> ||| word': {line[:60]!r}"))
            continue
        answers[parts[0][1:-1]] = parts[1]
    return answers, bad


def _decompress(data: bytes) -> bytes:
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def parse_cmrc(data: bytes, source_file: str, answers: dict[str, str]) -> Iterator[dict | Quarantined]:
    """Questions (dicts) and quarantined questions of one ``doc_query`` file.

    Args:
        data: the file's bytes (gzip is detected by its magic bytes).
        source_file: its path (ids and messages).
        answers: ``{qid_K: word}`` of its answer file (:func:`parse_answers`).
    """
    prefix = set_name(source_file)
    sentences: list[list[str]] = []
    problem: tuple[int, str] | None = None  # the first problem of the current document
    for number, raw in enumerate(_decompress(data).splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problem = problem or (number, f"invalid UTF-8 at line {number} ({exc.reason})")
            continue
        if not line.strip():
            continue
        parts = _split_line(line)
        if parts is None:
            problem = problem or (number, f"line {number} has no ' ||| ' separator: {line[:60]!r}")
            continue
        key, text = parts
        if key.startswith("<qid_") and key.endswith(">"):
            qid = key[1:-1]
            doc_id = f"{prefix}/{qid}"
            query = text.split()
            if problem is None and not sentences:
                problem = (number, "query without document sentences")
            if problem is None and not query:
                problem = (number, "empty query")
            if problem is None and qid not in answers:
                problem = (number, f"no answer for {qid} in {PurePath(answer_path(source_file)).name}")
            if problem is not None:
                yield Quarantined(source_file, doc_id, problem[0], problem[1])
            else:
                yield {"doc_id": doc_id, "line": number, "document": [t for s in sentences for t in s],
                       "query": query, "answer": answers[qid], "candidates": [], "answer_class": UNKNOWN_CLASS}
            sentences, problem = [], None
            continue
        if not key.isdigit():
            problem = problem or (number, f"line {number}: {key!r} is neither a sentence number nor <qid_K>")
            continue
        if int(key) != len(sentences) + 1 and problem is None:
            problem = (number, f"line {number}: sentence {key} follows sentence {len(sentences)}")
        sentences.append(text.split())
    if sentences or problem is not None:
        yield Quarantined(source_file, f"{prefix}/<end>", problem[0] if problem else 0,
                          "document at the end of the file has no query")
