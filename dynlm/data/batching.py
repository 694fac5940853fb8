"""Batches of whole documents, read in steps: sentence by sentence, or in chunks of tokens.

A :class:`DocumentBatch` holds B encoded documents (rows of ``ENCODED_SCHEMA``) as a list of
steps, each a :class:`SentenceBatch` (``[B, L]`` tensors, one row per document). Input tokens
are ``sentence[:-1]`` and targets ``sentence[1:]`` of every sentence (``<bos> ... <eos>``), so a
document is the stream of its sentences' (input, target) pairs. Two layouts cut that stream
into steps:

* **sentence lockstep** (``layout=None``): step t is sentence t of every document, padded to the
  longest one; documents with fewer sentences are inactive (all padding) at the later steps.
  Ragged real sentences make this wasteful (LitBank: ~54 % padding at 16 documents a batch).
* **chunks** (:class:`ChunkLayout`): step t is the t-th chunk of about ``tokens`` consecutive
  input positions of every document, across sentence ends, so an LM reads a document as a plain
  stream LM does (one recurrent pass per chunk, padding only at the end of a row). With
  ``whole_sentences`` a chunk ends at a sentence end (the DNTM merges a sentence's mentions
  after the whole sentence): sentences are packed greedily while the chunk stays within
  ``tokens`` positions; a longer sentence is a chunk of its own. With ``pack_documents`` a row
  holds several documents, one after the other (the next starts where one ends, inside a chunk
  if need be), so that rows are no longer padded to the longest document of the batch: a
  model resets a row's state where ``doc_start`` says a document begins (see
  :class:`ChunkLayout`).

Both give every target the same context: the state is carried from step to step, and a
sentence's positions inside a row are named by ``sentence_id`` and ``step_sentence_lengths`` (see
:class:`SentenceBatch`), which is all a model that works per sentence needs.

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
_CPU_FIELDS = ("lengths", "subword_lengths", "reset_columns", "step_sentence_lengths", "step_mention_repeats")


@dataclass
class SentenceBatch:
    """One step of B documents: a sentence of each (sentence lockstep) or a chunk of each.

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
        sentence_id: ``[B, L]`` long index of each position's sentence among the sentences of
            its row in this step (0, 1, ...; 0 at padding and everywhere in sentence lockstep).
        step_sentence_lengths: ``[B, S]`` long, positions of each row's s-th sentence in this step (0
            where the row has fewer; S: the most sentences of a row in this step; kept on CPU): a
            model that works per sentence runs sentence s of only the rows that have one, padded to
            their longest; the s-th sentence's positions follow the (s-1)-th's.
        step_mention_repeats: ``[B, S]`` long, the most input-token mentions of one chain in each
            row's s-th sentence of this step (kept on CPU): how many in-order merges the sentence
            needs, known without asking the device (an upper bound after ``slice_columns``).
        doc_start: ``[B, L]`` bool, True at the first input position of a document (``<bos>`` of
            its first sentence): the row's state must be reset before that position.
        reset_columns: ``[R]`` long, the sorted columns where some row has ``doc_start`` (kept on
            CPU, so a model splits its recurrent pass there without asking the device). Step 0 of
            a batch has column 0; with ``pack_documents`` later steps may have any column.
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
    sentence_id: torch.Tensor
    step_sentence_lengths: torch.Tensor
    step_mention_repeats: torch.Tensor
    doc_start: torch.Tensor
    reset_columns: torch.Tensor

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
    """Whole documents in B rows, as a list of steps (one document a row, or several with
    ``ChunkLayout.pack_documents``).

    Attributes:
        sentences: one :class:`SentenceBatch` per step (as many as the longest row has steps).
        doc_ids: the ids of the documents, row by row in reading order.
        num_tokens: real target positions in the batch.
        num_padded: padded target positions (``sum_t B * L_t - num_tokens``), to log padding waste.
        layout: the :class:`ChunkLayout` the steps were cut by, None for sentence lockstep.
    """

    sentences: list[SentenceBatch]
    doc_ids: list[str]
    num_tokens: int
    num_padded: int
    layout: "ChunkLayout | None" = None

    @property
    def batch_size(self) -> int:
        """Rows (what a model's ``init_state`` takes)."""
        return self.sentences[0].batch_size if self.sentences else len(self.doc_ids)

    @property
    def num_documents(self) -> int:
        return len(self.doc_ids)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "DocumentBatch":
        return DocumentBatch([s.to(device, non_blocking) for s in self.sentences], self.doc_ids, self.num_tokens,
                             self.num_padded, self.layout)


@dataclass(frozen=True)
class ChunkLayout:
    """Read documents in chunks of about ``tokens`` input positions (see the module docstring).

    Attributes:
        tokens: input positions per document per step (>= 1), the truncated-BPTT length.
        whole_sentences: cut only at sentence ends (greedy packing; a longer sentence is a chunk
            of its own), for a model that reads a sentence as a whole (``needs_whole_sentences``).
        pack_documents: a row is a stream of several documents (:func:`pack_rows` balances
            them over the rows), so that the batch is not padded to its longest document; the
            model resets a row's state at ``doc_start`` (``supports_packed_documents``). The
            chunks are cut from each row's stream as from one document.
    """

    tokens: int
    whole_sentences: bool = False
    pack_documents: bool = False

    def __post_init__(self):
        if self.tokens < 1:
            raise ValueError(f"ChunkLayout: tokens must be >= 1, got {self.tokens}")


def chunk_spans(sentence_lengths, layout: ChunkLayout) -> list[tuple[int, int]]:
    """The ``[start, end)`` input positions of each chunk of one document.

    Args:
        sentence_lengths: tokens per sentence including ``<bos>``/``<eos>`` (a sentence of n tokens
            has n - 1 input positions).
        layout: the chunk layout.

    Returns:
        Consecutive spans covering the document's input positions, e.g. sentences of 4, 3, 6
        tokens (3 + 2 + 5 = 10 positions) at ``tokens=5``: ``[(0, 5), (5, 10)]``; with
        ``whole_sentences``: ``[(0, 5), (5, 10)]`` too (3 + 2 fit, then 5), at ``tokens=4``:
        ``[(0, 3), (3, 5), (5, 10)]``.
    """
    positions = [int(n) - 1 for n in sentence_lengths]
    total = sum(positions)
    if not layout.whole_sentences:
        return [(a, min(a + layout.tokens, total)) for a in range(0, total, layout.tokens)]
    spans, start, end = [], 0, 0
    for n in positions:
        if end > start and end - start + n > layout.tokens:
            spans.append((start, end))
            start = end
        end += n
    if end > start:
        spans.append((start, end))
    return spans


def num_steps(sentence_lengths, layout: ChunkLayout | None) -> int:
    """Steps a document of ``sentence_lengths`` takes: its sentences, or its chunks."""
    return len(sentence_lengths) if layout is None else len(chunk_spans(sentence_lengths, layout))


@dataclass
class _Document:
    """One document as its stream of input positions (``sentence[:-1]`` of every sentence, in
    order) with everything a step needs per position; a step is a span of it."""

    doc_id: str
    sentence_lengths: np.ndarray  # tokens per sentence incl. <bos>/<eos>
    inputs: np.ndarray  # [N] input word ids
    targets: np.ndarray  # [N] target word ids
    entity_ids: np.ndarray  # [N] chain of each input token (0: none)
    target_entity_ids: np.ndarray  # [N] chain of each target
    kinds: np.ndarray  # [N] KIND_* bits of each target
    entities_seen: np.ndarray  # [N] chains seen up to and including each input token
    unique_keys: np.ndarray  # [N] batch-wide id of each input token's (word, segmentation)
    sentence_index: np.ndarray  # [N] sentence of each input position (0-based in the document)
    doc_start: np.ndarray  # [N] bool, True at the first position of a document

    def sentence_spans(self) -> list[tuple[int, int]]:
        ends = np.cumsum(self.sentence_lengths - 1)
        return [(int(a), int(b)) for a, b in zip(np.concatenate([[0], ends[:-1]]), ends)]


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


def _parse_row(row: dict, spec: VocabSpec, unique: dict) -> _Document:
    """Validate one encoded row and turn it into its stream of input positions with target kinds.

    ``unique`` maps (word id, subword ids) to a batch-wide id; new pairs are added to it.
    """
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
    word_list = words.tolist()
    input_pos = target_pos - 1  # [N] every position but each sentence's <eos>
    keys = np.fromiter((unique.setdefault((word_list[i], tuple(sub_list[sub_bounds[i]: sub_bounds[i + 1]])), len(unique))
                        for i in input_pos.tolist()), dtype=np.int64, count=len(input_pos))
    seen = np.maximum.accumulate(entities)  # ids follow first appearance: the max is the number of chains seen
    sentence_index = np.repeat(np.arange(len(lengths)), lengths - 1)
    return _Document(
        doc_id=doc_id,
        sentence_lengths=lengths,
        inputs=words[input_pos],
        targets=words[target_pos],
        entity_ids=entities[input_pos],
        target_entity_ids=entities[target_pos],
        kinds=kinds[target_pos],
        entities_seen=seen[input_pos],
        unique_keys=keys,
        sentence_index=sentence_index,
        doc_start=np.arange(len(input_pos)) == 0,
    )


def _concatenate(docs: list[_Document]) -> _Document:
    """One row's stream: the documents one after the other (sentence indices continue)."""
    if len(docs) == 1:
        return docs[0]
    first_sentence = np.cumsum([0] + [len(d.sentence_lengths) for d in docs[:-1]])
    joined = {name: np.concatenate([getattr(d, name) for d in docs])
              for name in ("sentence_lengths", "inputs", "targets", "entity_ids", "target_entity_ids", "kinds",
                           "entities_seen", "unique_keys", "doc_start")}
    joined["sentence_index"] = np.concatenate([d.sentence_index + k for d, k in zip(docs, first_sentence)])
    return _Document(doc_id="+".join(d.doc_id for d in docs), **joined)


def pack_rows(num_tokens: list[int], num_rows: int) -> list[list[int]]:
    """Which documents go to which row: longest first, each to the row with the fewest tokens.

    Args:
        num_tokens: the size of each document.
        num_rows: rows of the batch (at most ``len(num_tokens)`` are used).

    Returns:
        For each row, the indices of its documents in the order given (e.g. sizes
        ``[5, 9, 4, 4]`` in 2 rows: ``[[1, 3], [0, 2]]``, 13 and 9 tokens).
    """
    rows: list[list[int]] = [[] for _ in range(min(num_rows, len(num_tokens)))]
    loads = [0] * len(rows)
    for i in sorted(range(len(num_tokens)), key=lambda i: -num_tokens[i]):
        r = min(range(len(rows)), key=lambda r: (loads[r], r))
        rows[r].append(i)
        loads[r] += num_tokens[i]
    return [sorted(row) for row in rows]


# Per-position arrays of a _Document and the SentenceBatch field each fills.
_STREAM_FIELDS = (("inputs", "tokens"), ("targets", "targets"), ("entity_ids", "entity_ids"),
                  ("target_entity_ids", "target_entity_ids"), ("kinds", "target_kind"),
                  ("entities_seen", "entities_seen"))


def _step(docs: list[_Document], spans: list[tuple[int, int] | None], unique_keys: list, spec: VocabSpec,
          *, new_doc: list[bool], doc_end: list[bool]) -> SentenceBatch:
    """The step that reads ``docs[b]``'s input positions ``spans[b]`` (None: inactive row)."""
    batch_size = len(docs)
    lengths = [0 if span is None else span[1] - span[0] for span in spans]
    width = max(lengths)
    arrays = {field: np.full((batch_size, width), spec.pad_id if field in ("tokens", "targets") else 0, dtype=np.int64)
              for _, field in _STREAM_FIELDS}
    keys = np.full((batch_size, width), -1, dtype=np.int64)
    sentence_id = np.zeros((batch_size, width), dtype=np.int64)
    doc_start = np.zeros((batch_size, width), dtype=bool)
    for b, (doc, span) in enumerate(zip(docs, spans)):
        if span is None:  # chunk_spans never gives an empty span
            continue
        a, e = span
        n = e - a
        for source, field in _STREAM_FIELDS:
            arrays[field][b, :n] = getattr(doc, source)[a:e]
        keys[b, :n] = doc.unique_keys[a:e]
        doc_start[b, :n] = doc.doc_start[a:e]
        index = doc.sentence_index[a:e]
        sentence_id[b, :n] = index - index[0]
    real = keys >= 0
    step_keys, inverse = np.unique(keys[real], return_inverse=True)  # [U] batch-wide ids of this step
    if len(step_keys) == 0:
        step_keys = np.zeros(1, dtype=np.int64)  # an all-inactive step keeps one (unused) unique word
    token_to_unique = np.zeros((batch_size, width), dtype=np.int64)
    token_to_unique[real] = inverse
    segmentations = [unique_keys[k] for k in step_keys.tolist()]
    subword_ids = np.full((len(segmentations), max(len(seg) for _, seg in segmentations)), spec.subword_pad_id,
                          dtype=np.int64)
    for u, (_, segs) in enumerate(segmentations):
        subword_ids[u, : len(segs)] = segs
    lengths_t = torch.tensor(lengths, dtype=torch.int64)
    positions = torch.arange(width).unsqueeze(0)
    num_sentences = int(sentence_id.max()) + 1 if width else 1  # S: the most sentences of a row in this step
    return SentenceBatch(
        **{field: torch.from_numpy(array) for field, array in arrays.items()},
        mask=positions < lengths_t.unsqueeze(1),
        lengths=lengths_t,
        doc_active=lengths_t > 0,
        new_doc=torch.tensor(new_doc, dtype=torch.bool),
        doc_end=torch.tensor(doc_end, dtype=torch.bool),
        unique_words=torch.tensor([word for word, _ in segmentations], dtype=torch.int64),
        subword_ids=torch.from_numpy(subword_ids),
        subword_lengths=torch.tensor([len(seg) for _, seg in segmentations], dtype=torch.int64),
        token_to_unique=torch.from_numpy(token_to_unique),
        sentence_id=torch.from_numpy(sentence_id),
        step_sentence_lengths=torch.from_numpy(np.stack([np.bincount(sentence_id[b, : lengths[b]], minlength=num_sentences)
                                                         for b in range(batch_size)])).to(torch.int64),
        step_mention_repeats=torch.from_numpy(_mention_repeats(sentence_id, arrays["entity_ids"], real, num_sentences)),
        doc_start=torch.from_numpy(doc_start),
        reset_columns=torch.from_numpy(np.flatnonzero(doc_start.any(axis=0))).to(torch.int64),
    )


def _mention_repeats(sentence_id: np.ndarray, entity_ids: np.ndarray, real: np.ndarray,
                     num_sentences: int) -> np.ndarray:
    """``[B, S]``: the most mentions of one chain in each row's sentence s (``[B, L]`` inputs)."""
    batch_size = sentence_id.shape[0]
    repeats = np.zeros((batch_size, num_sentences), dtype=np.int64)
    mention = real & (entity_ids > 0)
    if mention.any():
        rows = np.nonzero(mention)[0]
        span = int(entity_ids.max()) + 1
        keys = (rows * num_sentences + sentence_id[mention]) * span + entity_ids[mention]  # (row, sentence, chain)
        keys, counts = np.unique(keys, return_counts=True)
        np.maximum.at(repeats.reshape(-1), keys // span, counts)
    return repeats


def collate_documents(rows: list[dict], spec: VocabSpec, layout: ChunkLayout | None = None,
                      num_rows: int | None = None) -> DocumentBatch:
    """Turn encoded document rows into a :class:`DocumentBatch`.

    Args:
        rows: dicts with the ``ENCODED_SCHEMA`` columns (lists or numpy arrays).
        spec: the vocabulary spec (for padding ids and the short list).
        layout: None: one step per sentence (lockstep); a :class:`ChunkLayout`: one step per chunk.
        num_rows: with ``layout.pack_documents``, the rows the documents are packed into
            (:func:`pack_rows`; default: one document a row); else unused.

    Returns:
        The batch; raises ``ValueError`` naming the document when a row is inconsistent.
    """
    if not rows:
        raise ValueError("collate_documents: no rows")
    unique: dict[tuple[int, tuple[int, ...]], int] = {}
    parsed = [_parse_row(row, spec, unique) for row in rows]
    unique_keys = list(unique)
    if layout is not None and layout.pack_documents and num_rows is not None and num_rows < len(parsed):
        rows_of = pack_rows([len(d.inputs) for d in parsed], num_rows)
        docs = [_concatenate([parsed[i] for i in row]) for row in rows_of]
        doc_ids = [parsed[i].doc_id for row in rows_of for i in row]
    else:
        docs, doc_ids = parsed, [d.doc_id for d in parsed]
    spans = [doc.sentence_spans() if layout is None else chunk_spans(doc.sentence_lengths, layout) for doc in docs]
    steps = []
    for t in range(max(len(s) for s in spans)):
        steps.append(_step(docs, [s[t] if t < len(s) else None for s in spans], unique_keys, spec,
                           new_doc=[t == 0] * len(docs), doc_end=[len(s) == t + 1 for s in spans]))
    num_tokens = sum(s.num_tokens for s in steps)
    num_positions = sum(s.tokens.numel() for s in steps)
    return DocumentBatch(steps, doc_ids, num_tokens, num_positions - num_tokens, layout)


# batch_documents with sort_by_length and a seed sorts by size times a random factor in
# [1 - SIZE_JITTER, 1 + SIZE_JITTER]: without it the same documents form the same batches every
# epoch (only the order of the batches changed), and an epoch always ended on one of a few fixed
# groups, whose last optimizer steps the weights then follow (benchmarks/results/dntm_quality.md).
SIZE_JITTER = 0.1

# With ChunkLayout.pack_documents, batch_documents packs this many batches' worth of documents into
# one batch of batch_size rows: enough documents a row that the rows end close together.
PACKED_GROUP_BATCHES = 16


def packed_steps(sentence_lengths: list, batch_size: int, layout: ChunkLayout) -> int:
    """Steps of the batches :func:`batch_documents` packs from documents of these
    ``sentence_lengths`` (in that order, unshuffled; an estimate for a shuffled order)."""
    group = PACKED_GROUP_BATCHES * batch_size
    total = 0
    for start in range(0, len(sentence_lengths), group):
        lengths = sentence_lengths[start : start + group]
        rows = pack_rows([int(np.sum(np.asarray(n) - 1)) for n in lengths], batch_size)
        total += max(num_steps(np.concatenate([np.asarray(lengths[i]) for i in row]), layout) for row in rows)
    return total


def _doc_size(row: dict, layout: ChunkLayout | None = None) -> tuple[int, int]:
    """(steps, tokens) of a document: what batches of similar documents are sorted by."""
    lengths = row["sentence_lengths"]
    return num_steps(lengths, layout), int(np.sum(lengths))


def batch_documents(
    rows: Iterable[dict],
    spec: VocabSpec,
    batch_size: int,
    *,
    sort_by_length: bool = True,
    seed: int | None = 0,
    layout: ChunkLayout | None = None,
) -> Iterator[DocumentBatch]:
    """Group documents into batches of ``batch_size`` (the last one may be smaller).

    Args:
        rows: encoded document rows (all are read into memory first).
        spec: the vocabulary spec.
        batch_size: documents per batch.
        sort_by_length: batch documents of similar length (number of sentences, then tokens)
            together to limit padding; with a seed the sizes are jittered by up to
            ``SIZE_JITTER`` (so the groups change from seed to seed) and the order of the batches
            is shuffled.
        seed: shuffling seed (documents when not sorting; size jitter and batches when sorting);
            None keeps the order (sorted exactly, or as given).
        layout: the steps' layout (:func:`collate_documents`); sorting is by steps, then tokens.
            With ``layout.pack_documents``: groups of ``PACKED_GROUP_BATCHES * batch_size``
            documents (ordered by source file and id, then shuffled when ``seed`` is not None:
            the batches do not depend on the order the rows came in), each packed into
            ``batch_size`` rows.

    Yields:
        :class:`DocumentBatch` objects.
    """
    if batch_size < 1:
        raise ValueError(f"batch_documents: batch_size must be >= 1, got {batch_size}")
    rows = list(rows)
    rng = random.Random(seed)
    if layout is not None and layout.pack_documents:
        # the order rows arrive in (a Ray Data shard's) may vary from run to run: a resumed epoch
        # must pack the same rows the same way, so the shuffle starts from an order of their own
        rows.sort(key=lambda row: (str(row.get("source_file", "")), str(row.get("doc_id", ""))))
        if seed is not None:
            rng.shuffle(rows)
        group = PACKED_GROUP_BATCHES * batch_size
        for start in range(0, len(rows), group):
            yield collate_documents(rows[start : start + group], spec, layout, num_rows=batch_size)
        return
    if sort_by_length and seed is not None:
        # similar sizes, but not the same groups every epoch: sorted by the size times a random
        # factor in [1 - SIZE_JITTER, 1 + SIZE_JITTER], neighbours trade places from seed to seed
        # (drawn in an order of the rows' own: a resumed epoch regroups its rows the same way
        # whatever order a Ray Data shard delivers them in)
        own_order = sorted(rows, key=lambda row: (str(row.get("source_file", "")), str(row.get("doc_id", ""))))
        jitter = {id(row): 1.0 + SIZE_JITTER * (2.0 * rng.random() - 1.0) for row in own_order}
        rows.sort(key=lambda row: tuple(size * jitter[id(row)] for size in _doc_size(row, layout)))
    elif sort_by_length:
        rows.sort(key=lambda row: _doc_size(row, layout))
    elif seed is not None:
        rng.shuffle(rows)
    groups = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
    if sort_by_length and seed is not None:
        rng.shuffle(groups)
    for group in groups:
        yield collate_documents(group, spec, layout)


def per_worker_batch_size(global_batch: int, world_size: int) -> int:
    """``train.batch_size`` is the global batch (documents); each rank takes its share."""
    size = global_batch // world_size
    if size < 1:
        raise ValueError(f"train.batch_size={global_batch} is smaller than run.num_workers={world_size}")
    return size

