"""Cloze questions from any corpus, CBT-style (Hill et al., 2016): N context sentences, then the
next sentence as the query with one answerable word blanked.

Input: a parsed document of the LM task (:func:`dynlm.data.parse_stage.parse_files`): its
sentences, where gold coreference mentions are already anonymized as ``<unk1>``, ``<unk2>``, ...
Windows of ``context_sentences + 1`` sentences, one after another (no overlap). In each window:

* **answerable** words: tokens of the query sentence that also occur in the context;
* **answer class**: an entity mention (an ``<unkN>`` token: the corpus has gold coreference; it
  is written ``@entityN``, so the cloze task reads it as a word) when the query has an
  answerable one, written with the CBT class ``NE``; else the **heuristic**
  class: an answerable *content word* (alphabetic, at least 3 characters, not one of the
  :data:`FUNCTION_WORDS`, not capitalized at the start of the sentence: a noun or another
  frequent content word), written with class ``W`` (read back as ``other``);
* one such position is blanked (``XXXXX``), chosen by a hash of (seed, doc_id, window), so the
  questions never depend on the order of documents or on the number of workers;
* candidates: the answer and up to ``num_candidates - 1`` other context words of the same class,
  sampled with the same hash, sorted.

:func:`cbt_block` writes a question in the CBT format, so :mod:`dynlm.data.cbt` reads it back
(``cbtest_<class>_<split>.txt`` files; prepare them with ``data.named_splits: true``).
"""

from __future__ import annotations

import hashlib
import random

import pyarrow as pa
import pyarrow.compute as pc

from dynlm.data.cbt import BLANK, CONTEXT_LINES
from dynlm.data.split import assign_split

ENTITY_CLASS, CONTENT_CLASS = "NE", "W"
FUNCTION_WORDS = frozenset("""a about after all also an and any are as at be been before but by can could did do does
for from had has have he her him his how i if in into is it its just may me more most my no not now of on one only or
other our out said she so some than that the their them then there these they this those through to too under up upon
us very was we were what when where which while who whom why will with would you your""".split())


ENTITY_PREFIX = "@entity"  # <unkN> is written @entityN (Hermann et al.'s anonymized cloze), an ordinary word


def entity_word(token: str) -> str:
    """``<unkN>`` (an anonymized gold mention) -> ``@entityN``; any other token unchanged."""
    return f"{ENTITY_PREFIX}{token[4:-1]}" if token.startswith("<unk") and token.endswith(">") and token[4:-1].isdigit() else token


def _is_entity(token: str) -> bool:
    return token.startswith(ENTITY_PREFIX) and token[len(ENTITY_PREFIX):].isdigit()


def _is_content(token: str, position: int) -> bool:
    return (token.isalpha() and len(token) >= 3 and token.lower() not in FUNCTION_WORDS
            and not (position == 0 and token[:1].isupper()))


def _rng(seed: int, doc_id: str, window: int) -> random.Random:
    digest = hashlib.sha256(f"{seed}\x00{doc_id}\x00{window}".encode("utf-8")).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def build_questions(doc_id: str, sentences: list[list[str]], *, context_sentences: int = 20, num_candidates: int = 10,
                    seed: int = 0) -> list[dict]:
    """The cloze questions of one document (module docstring).

    Returns:
        Dicts with ``doc_id`` (``"<doc_id>#<window>"``), ``context`` (the sentences), ``query``
        (tokens, one ``XXXXX``), ``answer``, ``candidates`` and ``answer_class`` (``NE`` / ``W``).
    """
    questions = []
    size = context_sentences + 1
    sentences = [[entity_word(t) for t in sentence] for sentence in sentences]
    for window, start in enumerate(range(0, len(sentences) - size + 1, size)):
        context, query = sentences[start : start + context_sentences], sentences[start + context_sentences]
        in_context = {t for s in context for t in s}
        entities = [i for i, t in enumerate(query) if _is_entity(t) and t in in_context]
        content = [i for i, t in enumerate(query) if _is_content(t, i) and t in in_context]
        positions, answer_class = (entities, ENTITY_CLASS) if entities else (content, CONTENT_CLASS)
        if not positions:
            continue
        rng = _rng(seed, doc_id, window)
        position = rng.choice(positions)
        answer = query[position]
        same_class = sorted({t for s in context for i, t in enumerate(s)
                             if t != answer and (_is_entity(t) if answer_class == ENTITY_CLASS else _is_content(t, i))})
        others = rng.sample(same_class, min(num_candidates - 1, len(same_class)))
        questions.append({"doc_id": f"{doc_id}#{window}", "context": context,
                          "query": query[:position] + [BLANK] + query[position + 1:], "answer": answer,
                          "candidates": sorted([answer, *others]), "answer_class": answer_class})
    return questions


def cbt_block(question: dict) -> str:
    """A question as a CBT block (its context sentences numbered from 1, the query line, a blank
    line); the CBT format has exactly 20 context sentences."""
    if len(question["context"]) != CONTEXT_LINES:
        raise ValueError(f"a CBT block has {CONTEXT_LINES} context sentences, got {len(question['context'])}")
    lines = [f"{i} {' '.join(s)}" for i, s in enumerate(question["context"], start=1)]
    lines.append(f"{len(lines) + 1} {' '.join(question['query'])}\t{question['answer']}\t\t{'|'.join(question['candidates'])}")
    return "\n".join(lines) + "\n\n"


QUESTIONS_SCHEMA = pa.schema([pa.field("doc_id", pa.string()), pa.field("split", pa.string()),
                              pa.field("answer_class", pa.string()), pa.field("block", pa.string())])


def questions_table(parsed: pa.Table, *, seed: int = 0, num_candidates: int = 10, valid_fraction: float = 0.1,
                    test_fraction: float = 0.2, split_seed: int = 0) -> pa.Table:
    """Parsed LM documents (``kind``, ``doc_id``, ``sentences``) -> one CBT block per question,
    with its split: a hash of the SOURCE document's id, so all questions of a document share one
    split (the Ray Data stage of ``dynlm data cloze``)."""
    docs = parsed.filter(pc.equal(parsed["kind"], "document")).select(["doc_id", "sentences"])
    rows = []
    for doc in docs.to_pylist():
        split = assign_split(doc["doc_id"], seed=split_seed, valid_fraction=valid_fraction, test_fraction=test_fraction)
        for question in build_questions(doc["doc_id"], doc["sentences"], context_sentences=CONTEXT_LINES,
                                        num_candidates=num_candidates, seed=seed):
            rows.append({"doc_id": question["doc_id"], "split": split, "answer_class": question["answer_class"],
                         "block": cbt_block(question)})
    return pa.Table.from_pylist(rows, schema=QUESTIONS_SCHEMA)


def cbt_files(questions: pa.Table) -> dict[str, str]:
    """``{file name: text}``: ``cbtest_<class>_<split>.txt``, blocks sorted by question id (the
    same bytes whatever order the questions came in)."""
    files: dict[str, list[tuple[str, str]]] = {}
    for row in questions.to_pylist():
        files.setdefault(f"cbtest_{row['answer_class']}_{row['split']}.txt", []).append((row["doc_id"], row["block"]))
    return {name: "".join(block for _, block in sorted(blocks)) for name, blocks in sorted(files.items())}
