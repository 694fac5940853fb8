"""Anonymization of coreference chains (Kobayashi et al., 2017 entity-LM setting).

Every chain with at least ``min_chain_mentions`` annotated mentions is an entity: it gets the
identifier ``<unk1>``, ``<unk2>``, ... in order of its first (kept) mention in the document, and
each of its mention spans, whatever its length, becomes that ONE token. Mentions of smaller
(singleton) chains keep their words and take no part in the conflicts below.

Conflicts between entity mentions of one sentence:
* nested (one inside the other, or the same span): the outermost wins; inner ones are dropped
  (their words are inside the replaced span) and counted in ``dropped_nested``;
* crossing (overlapping, not nested): the one that starts first wins; the other is dropped and
  counted in ``dropped_overlapping``.

A document with more than ``max_chains`` entity chains is dropped (``too_many_chains="drop"``,
counted in ``dropped_docs_too_many_chains``) or truncated (``"truncate"``: chains after the first
``max_chains`` keep their words, counted in ``truncated_chains``).
"""

from __future__ import annotations

from collections import Counter

TOO_MANY_CHAINS = ("drop", "truncate")
STAT_KEYS = (
    "documents",
    "chains",
    "anonymized_mentions",
    "dropped_nested",
    "dropped_overlapping",
    "dropped_docs_too_many_chains",
    "truncated_chains",
)


def entity_token(chain_number: int) -> str:
    """The token of entity ``chain_number`` (1-based): ``<unk{chain_number}>``."""
    return f"<unk{chain_number}>"


def empty_stats() -> dict[str, int]:
    """All statistic counters at 0 (sum dicts key by key to aggregate documents)."""
    return {key: 0 for key in STAT_KEYS}


def _check_mentions(doc: dict) -> None:
    sentences = doc["sentences"]
    for m in doc.get("mentions") or []:
        s, start, end = m["sentence"], m["start"], m["end"]
        if not 0 <= s < len(sentences) or not 0 <= start <= end < len(sentences[s]):
            raise ValueError(
                f"document {doc.get('doc_id')!r}: mention {m} lies outside its sentence "
                f"({len(sentences)} sentences)"
            )


def _resolve(mentions: list[dict], stats: dict[str, int]) -> list[dict]:
    """Keep non-conflicting mentions: outermost of nested ones, first-starting of crossing ones."""
    kept: list[dict] = []
    ordered = sorted(mentions, key=lambda m: (m["sentence"], m["start"], -m["end"]))  # stable
    last_by_sentence: dict[int, dict] = {}
    for m in ordered:
        previous = last_by_sentence.get(m["sentence"])
        # Kept mentions of a sentence never overlap and are sorted, so only the last can conflict.
        if previous is not None and m["start"] <= previous["end"]:
            if m["end"] <= previous["end"]:
                stats["dropped_nested"] += 1
            else:
                stats["dropped_overlapping"] += 1
            continue
        kept.append(m)
        last_by_sentence[m["sentence"]] = m
    return kept


def anonymize(
    doc: dict, *, max_chains: int, min_chain_mentions: int = 2, too_many_chains: str = "drop"
) -> tuple[dict | None, dict]:
    """Replace entity mentions by ``<unkN>`` tokens.

    Args:
        doc: a DOCUMENT_SCHEMA dict (doc_id, source_file, sentences, mentions).
        max_chains: most entity chains per document.
        min_chain_mentions: chains with at least this many mentions are anonymized.
        too_many_chains: ``"drop"`` or ``"truncate"`` (see module docstring).

    Returns:
        ``(anonymized, stats)``: anonymized is ``{"doc_id", "source_file", "sentences",
        "num_chains"}`` or None when the document is dropped; stats holds the int counters of
        :data:`STAT_KEYS` for this document.

    Raises:
        ValueError: a mention lies outside its sentence, or an argument is invalid.
    """
    if too_many_chains not in TOO_MANY_CHAINS:
        raise ValueError(f"too_many_chains must be one of {TOO_MANY_CHAINS}, got {too_many_chains!r}")
    if max_chains < 1 or min_chain_mentions < 1:
        raise ValueError(f"max_chains ({max_chains}) and min_chain_mentions ({min_chain_mentions}) must be >= 1")
    _check_mentions(doc)
    stats = empty_stats()
    stats["documents"] = 1
    mentions = list(doc.get("mentions") or [])
    sizes = Counter(m["chain"] for m in mentions)
    candidates = [m for m in mentions if sizes[m["chain"]] >= min_chain_mentions]
    kept = _resolve(candidates, stats)

    numbers: dict[str, int] = {}
    for m in kept:  # kept is in document order
        numbers.setdefault(m["chain"], len(numbers) + 1)
    if len(numbers) > max_chains:
        if too_many_chains == "drop":
            stats["dropped_docs_too_many_chains"] = 1
            return None, stats
        stats["truncated_chains"] = len(numbers) - max_chains
        numbers = {chain: n for chain, n in numbers.items() if n <= max_chains}
        kept = [m for m in kept if m["chain"] in numbers]

    by_sentence: dict[int, dict[int, dict]] = {}
    for m in kept:
        by_sentence.setdefault(m["sentence"], {})[m["start"]] = m
    sentences = []
    for s, tokens in enumerate(doc["sentences"]):
        starts = by_sentence.get(s, {})
        out, i = [], 0
        while i < len(tokens):
            m = starts.get(i)
            if m is None:
                out.append(tokens[i])
                i += 1
            else:
                out.append(entity_token(numbers[m["chain"]]))
                i = m["end"] + 1
        sentences.append(out)
    stats["chains"] = len(numbers)
    stats["anonymized_mentions"] = len(kept)
    return (
        {
            "doc_id": doc["doc_id"],
            "source_file": doc["source_file"],
            "sentences": sentences,
            "num_chains": len(numbers),
        },
        stats,
    )
