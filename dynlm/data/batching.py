"""Batches of whole documents, processed sentence by sentence in lockstep.

A :class:`DocumentBatch` holds B encoded documents (rows of ``ENCODED_SCHEMA``). Step t is a
:class:`SentenceBatch` with sentence t of every document, padded to the longest one; documents
with fewer sentences are inactive (all padding) at the later steps. Input tokens are
``sentence[:-1]`` and targets ``sentence[1:]`` (every sentence is ``<bos> ... <eos>``).

``target_kind`` flags each target position for the paper metrics (bits may combine):

* ``KIND_FIRST_MENTION``: the target is an entity identifier seen for the first time in its document;
* ``KIND_REAPPEAR``: the target is an entity identifier already seen in its document;
* ``KIND_AFTER_ENTITY``: the target follows an entity mention (the input token is an entity);
* ``KIND_OOV``: the target is a word off the short list (``shortlist_size <= id < num_words``);
* ``KIND_REAPPEAR_1`` / ``_2`` / ``_3_5`` / ``_6_PLUS``: a re-appearing entity target whose
  entity was mentioned 1, 2, 3-5 or 6+ times before in its document (:data:`MENTION_BINS`; the
  accumulation analysis of Kobayashi et al., 2017). Exactly one is set on every ``KIND_REAPPEAR``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Iterable, Iterator

import numpy as np
import torch

from dynlm.vocab_spec import VocabSpec

KIND_FIRST_MENTION = 1
KIND_REAPPEAR = 2
KIND_AFTER_ENTITY = 4
KIND_OOV = 8
KIND_REAPPEAR_1 = 16
KIND_REAPPEAR_2 = 32
KIND_REAPPEAR_3_5 = 64
KIND_REAPPEAR_6_PLUS = 128

# (KIND_* bit, fewest, most earlier mentions of the entity in its document; None: no upper bound)
MENTION_BINS: tuple[tuple[int, int, int | None], ...] = (
    (KIND_REAPPEAR_1, 1, 1),
    (KIND_REAPPEAR_2, 2, 2),
    (KIND_REAPPEAR_3_5, 3, 5),
    (KIND_REAPPEAR_6_PLUS, 6, None),
)

# Tensors that stay on the CPU in SentenceBatch.to(device) (pack_padded_sequence wants CPU lengths).
_CPU_FIELDS = ("lengths", "subword_lengths")


@dataclass
class SentenceBatch:
    """One sentence step of B documents.

    Attributes:
        tokens: ``[B, L]`` long input ids (sentence[:-1]), ``pad_id`` at padding.
        targets: ``[B, L]`` long target ids (sentence[1:]), ``pad_id`` at padding.
        mask: ``[B, L]`` bool, True at real positions (a prefix of each row).
        lengths: ``[B]`` long, real positions per row (0 for inactive documents); kept on CPU.
        entity_ids: ``[B, L]`` long chain index 1..K of each input token, 0 otherwise.
        target_entity_ids: ``[B, L]`` long chain index of each target, 0 otherwise.
        target_kind: ``[B, L]`` long ``KIND_*`` bit flags of each target.
        entities_seen: ``[B, L]`` long number of chains that appeared in the document up to and
            including each input token (ids follow first appearance, so the target can only be
            a word or ``<unk1>`` ... ``<unk{n+1}>``; see :mod:`dynlm.modules.entity_mask`).
        doc_active: ``[B]`` bool, the document has this sentence.
        new_doc: ``[B]`` bool, this is the document's first sentence (reset its state before).
        doc_end: ``[B]`` bool, this is the document's last sentence.
        unique_words: ``[U]`` long word id of each unique (word, segmentation) of the step.
        subword_ids: ``[U, S]`` long BPE ids of the unique words, ``spec.subword_pad_id`` padded.
        subword_lengths: ``[U]`` long number of subwords (>= 1); kept on CPU.
        token_to_unique: ``[B, L]`` long index into the unique words (0 at padding).
    """

    tokens: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    entity_ids: torch.Tensor
    target_entity_ids: torch.Tensor
    target_kind: torch.Tensor
    entities_seen: torch.Tensor
    doc_active: torch.Tensor
    new_doc: torch.Tensor
    doc_end: torch.Tensor
    unique_words: torch.Tensor
    subword_ids: torch.Tensor
    subword_lengths: torch.Tensor
    token_to_unique: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.tokens.size(0)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "SentenceBatch":
        """A copy on ``device`` (``lengths`` and ``subword_lengths`` stay on the CPU)."""
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            moved[f.name] = value if f.name in _CPU_FIELDS else value.to(device, non_blocking=non_blocking)
        return SentenceBatch(**moved)


@dataclass
class DocumentBatch:
    """B whole documents as a list of sentence steps.

    Attributes:
        sentences: one :class:`SentenceBatch` per step (as many as the longest document has sentences).
        doc_ids: the B document ids.
        num_tokens: real target positions in the batch.
        num_padded: padded target positions (``sum_t B * L_t - num_tokens``), to log padding waste.
    """

    sentences: list[SentenceBatch]
    doc_ids: list[str]
    num_tokens: int
    num_padded: int

    @property
    def batch_size(self) -> int:
        return len(self.doc_ids)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "DocumentBatch":
        return DocumentBatch(
            [s.to(device, non_blocking) for s in self.sentences], self.doc_ids, self.num_tokens, self.num_padded
        )


@dataclass
class _Document:
    doc_id: str
    sentences: list[np.ndarray]  # word ids per sentence incl. <bos>/<eos>
    entities: list[np.ndarray]  # entity ids per sentence
    kinds: list[np.ndarray]  # target kinds per sentence (length n - 1)
    entities_seen: list[np.ndarray]  # chains seen up to each input position, per sentence (length n - 1)
    subwords: list[list[tuple[int, ...]]]  # subword ids per token, per sentence


def _array(row: dict, key: str, doc_id: str) -> np.ndarray:
    if key not in row or row[key] is None:
        raise ValueError(f"document {doc_id!r}: missing column {key!r}")
    return np.asarray(row[key], dtype=np.int64).reshape(-1)


def mentions_before(entity_ids: np.ndarray) -> np.ndarray:
    """How many times each position's entity occurred at earlier positions (0 for non-entities).

    Args:
        entity_ids: ``[N]`` chain index of each position of one document in reading order, 0 = no entity.

    Returns:
        ``[N]`` int64; e.g. ``[0, 1, 2, 1, 0, 2] -> [0, 0, 0, 1, 0, 1]``.
    """
    entity_ids = np.asarray(entity_ids, dtype=np.int64)
    before = np.zeros(len(entity_ids), dtype=np.int64)
    positions = np.flatnonzero(entity_ids > 0)  # [M] mention positions in reading order
    order = np.argsort(entity_ids[positions], kind="stable")  # grouped by chain, reading order kept
    chains = entity_ids[positions][order]
    group_start = np.searchsorted(chains, chains, side="left")  # first index of each chain's group
    before[positions[order]] = np.arange(len(order)) - group_start
    return before


def _parse_row(row: dict, spec: VocabSpec) -> _Document:
    """Validate one encoded row and split it into sentences with target kinds."""
    doc_id = str(row.get("doc_id", "?"))
    lengths = _array(row, "sentence_lengths", doc_id)
    words = _array(row, "word_ids", doc_id)
    entities = _array(row, "entity_ids", doc_id)
    sub_ids = _array(row, "subword_ids", doc_id)
    sub_lengths = _array(row, "subword_lengths", doc_id)
    total = int(lengths.sum())
    if len(lengths) == 0:
        raise ValueError(f"document {doc_id!r}: no sentences")
    if (lengths < 2).any():
        raise ValueError(f"document {doc_id!r}: a sentence has fewer than 2 tokens (<bos> ... <eos>)")
    if "num_tokens" in row and row["num_tokens"] is not None and int(row["num_tokens"]) != total:
        raise ValueError(f"document {doc_id!r}: num_tokens={row['num_tokens']} but sentence_lengths sum to {total}")
    for name, arr in (("word_ids", words), ("entity_ids", entities), ("subword_lengths", sub_lengths)):
        if len(arr) != total:
            raise ValueError(f"document {doc_id!r}: {name} has {len(arr)} entries, sentence_lengths sum to {total}")
    if len(sub_ids) != int(sub_lengths.sum()):
        raise ValueError(f"document {doc_id!r}: subword_ids has {len(sub_ids)} entries, subword_lengths sum to {int(sub_lengths.sum())}")
    if (sub_lengths < 1).any():
        raise ValueError(f"document {doc_id!r}: a token has no subwords")
    if words.min() < 0 or words.max() >= spec.output_size:
        raise ValueError(f"document {doc_id!r}: word id outside [0, {spec.output_size})")
    if entities.min() < 0 or entities.max() > spec.num_entities:
        raise ValueError(f"document {doc_id!r}: entity id outside [0, {spec.num_entities}]")
    if len(sub_ids) and (sub_ids.min() < 0 or sub_ids.max() >= spec.num_subwords):
        raise ValueError(f"document {doc_id!r}: subword id outside [0, {spec.num_subwords})")
    is_entity_word = words >= spec.num_words
    if not np.array_equal(is_entity_word, entities > 0) or not np.array_equal(
        words[is_entity_word], spec.num_words + entities[is_entity_word] - 1
    ):
        raise ValueError(f"document {doc_id!r}: entity_ids do not match the entity word ids")

    # Target kinds over the whole document (first mention is per document, not per sentence).
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    target_pos = np.concatenate([np.arange(bounds[i] + 1, bounds[i + 1]) for i in range(len(lengths))])
    kinds = np.zeros(total, dtype=np.int64)  # indexed by target position
    tgt_ent = entities[target_pos]
    is_mention = tgt_ent > 0
    before = mentions_before(tgt_ent)  # earlier mentions of the target's entity in the document
    kinds[target_pos] |= np.where(is_mention & (before == 0), KIND_FIRST_MENTION, 0)
    kinds[target_pos] |= np.where(is_mention & (before > 0), KIND_REAPPEAR, 0)
    for bit, fewest, most in MENTION_BINS:
        in_bin = (before >= fewest) & (before <= (most if most is not None else len(before)))
        kinds[target_pos] |= np.where(is_mention & in_bin, bit, 0)
    kinds[target_pos] |= np.where(entities[target_pos - 1] > 0, KIND_AFTER_ENTITY, 0)
    tgt_words = words[target_pos]
    kinds[target_pos] |= np.where((tgt_words >= spec.shortlist_size) & (tgt_words < spec.num_words), KIND_OOV, 0)

    sub_bounds = np.concatenate([[0], np.cumsum(sub_lengths)])
    sub_list = sub_ids.tolist()
    token_subwords = [tuple(sub_list[sub_bounds[i] : sub_bounds[i + 1]]) for i in range(total)]
    seen = np.maximum.accumulate(entities)  # ids follow first appearance: the max is the number of chains seen
    return _Document(
        doc_id=doc_id,
        sentences=[words[bounds[i] : bounds[i + 1]] for i in range(len(lengths))],
        entities=[entities[bounds[i] : bounds[i + 1]] for i in range(len(lengths))],
        kinds=[kinds[bounds[i] + 1 : bounds[i + 1]] for i in range(len(lengths))],
        entities_seen=[seen[bounds[i] : bounds[i + 1] - 1] for i in range(len(lengths))],
        subwords=[token_subwords[bounds[i] : bounds[i + 1]] for i in range(len(lengths))],
    )


def _sentence_step(docs: list[_Document], step: int, spec: VocabSpec) -> SentenceBatch:
    batch_size = len(docs)
    lengths = [len(d.sentences[step]) - 1 if step < len(d.sentences) else 0 for d in docs]
    width = max(lengths)
    tokens = np.full((batch_size, width), spec.pad_id, dtype=np.int64)
    targets = np.full((batch_size, width), spec.pad_id, dtype=np.int64)
    entity_ids = np.zeros((batch_size, width), dtype=np.int64)
    target_entity_ids = np.zeros((batch_size, width), dtype=np.int64)
    target_kind = np.zeros((batch_size, width), dtype=np.int64)
    entities_seen = np.zeros((batch_size, width), dtype=np.int64)
    token_to_unique = np.zeros((batch_size, width), dtype=np.int64)
    unique: dict[tuple[int, tuple[int, ...]], int] = {}
    for b, (doc, n) in enumerate(zip(docs, lengths)):
        if n == 0:
            continue
        words, ents = doc.sentences[step], doc.entities[step]
        tokens[b, :n], targets[b, :n] = words[:-1], words[1:]
        entity_ids[b, :n], target_entity_ids[b, :n] = ents[:-1], ents[1:]
        target_kind[b, :n] = doc.kinds[step]
        entities_seen[b, :n] = doc.entities_seen[step]
        subwords = doc.subwords[step]
        for i in range(n):
            key = (int(words[i]), subwords[i])
            token_to_unique[b, i] = unique.setdefault(key, len(unique))
    keys = list(unique)
    max_sub = max(len(k[1]) for k in keys)
    subword_ids = np.full((len(keys), max_sub), spec.subword_pad_id, dtype=np.int64)
    for u, (_, segs) in enumerate(keys):
        subword_ids[u, : len(segs)] = segs
    lengths_t = torch.tensor(lengths, dtype=torch.int64)
    positions = torch.arange(width).unsqueeze(0)
    return SentenceBatch(
        tokens=torch.from_numpy(tokens),
        targets=torch.from_numpy(targets),
        mask=positions < lengths_t.unsqueeze(1),
        lengths=lengths_t,
        entity_ids=torch.from_numpy(entity_ids),
        target_entity_ids=torch.from_numpy(target_entity_ids),
        target_kind=torch.from_numpy(target_kind),
        entities_seen=torch.from_numpy(entities_seen),
        doc_active=lengths_t > 0,
        new_doc=torch.full((batch_size,), step == 0, dtype=torch.bool),
        doc_end=torch.tensor([len(d.sentences) == step + 1 for d in docs], dtype=torch.bool),
        unique_words=torch.tensor([k[0] for k in keys], dtype=torch.int64),
        subword_ids=torch.from_numpy(subword_ids),
        subword_lengths=torch.tensor([len(k[1]) for k in keys], dtype=torch.int64),
        token_to_unique=torch.from_numpy(token_to_unique),
    )


def collate_documents(rows: list[dict], spec: VocabSpec) -> DocumentBatch:
    """Turn encoded document rows into a :class:`DocumentBatch`.

    Args:
        rows: dicts with the ``ENCODED_SCHEMA`` columns (lists or numpy arrays).
        spec: the vocabulary spec (for padding ids and the short list).

    Returns:
        The batch; raises ``ValueError`` naming the document when a row is inconsistent.
    """
    if not rows:
        raise ValueError("collate_documents: no rows")
    docs = [_parse_row(row, spec) for row in rows]
    num_steps = max(len(d.sentences) for d in docs)
    sentences = [_sentence_step(docs, t, spec) for t in range(num_steps)]
    num_tokens = sum(s.num_tokens for s in sentences)
    num_positions = sum(s.tokens.numel() for s in sentences)
    return DocumentBatch(sentences, [d.doc_id for d in docs], num_tokens, num_positions - num_tokens)


def _doc_size(row: dict) -> tuple[int, int]:
    lengths = row["sentence_lengths"]
    return len(lengths), int(np.sum(lengths))


def batch_documents(
    rows: Iterable[dict],
    spec: VocabSpec,
    batch_size: int,
    *,
    sort_by_length: bool = True,
    seed: int | None = 0,
) -> Iterator[DocumentBatch]:
    """Group documents into batches of ``batch_size`` (the last one may be smaller).

    Args:
        rows: encoded document rows (all are read into memory first).
        spec: the vocabulary spec.
        batch_size: documents per batch.
        sort_by_length: batch documents of similar length (number of sentences, then tokens)
            together to limit padding; the order of the batches is then shuffled.
        seed: shuffling seed (documents when not sorting, batches when sorting); None keeps
            the order (sorted, or as given).

    Yields:
        :class:`DocumentBatch` objects.
    """
    if batch_size < 1:
        raise ValueError(f"batch_documents: batch_size must be >= 1, got {batch_size}")
    rows = list(rows)
    rng = random.Random(seed)
    if sort_by_length:
        rows.sort(key=_doc_size)
    elif seed is not None:
        rng.shuffle(rows)
    groups = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
    if sort_by_length and seed is not None:
        rng.shuffle(groups)
    for group in groups:
        yield collate_documents(group, spec)


def per_worker_batch_size(global_batch: int, world_size: int) -> int:
    """``train.batch_size`` is the global batch (documents); each rank takes its share."""
    size = global_batch // world_size
    if size < 1:
        raise ValueError(f"train.batch_size={global_batch} is smaller than run.num_workers={world_size}")
    return size

