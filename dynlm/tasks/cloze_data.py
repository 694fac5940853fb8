"""The cloze task's data side: data config, record schemas, parse / count / fit / encode stages and
batches (docs/ARCHITECTURE.md, "Tasks"; the task class is :mod:`dynlm.tasks.cloze`).

* :func:`parse_files`: input files -> one ``document`` row per question. CMRC-2017
  ``*.doc_query[.gz]`` (its ``*.answer`` file is read with it; the answer file itself gives no
  row) and CBT ``cbtest_*.txt``; a malformed question, or one whose answer never occurs in its
  document (nothing to point at), is a ``quarantine`` row with the reason.
  Split: ``data.splits`` when given; else the split the file name gives when
  ``data.named_splits`` (CBT's train/valid/test files); else a hash of the question's
  ``doc_id`` (CMRC-2017's files are all ``valid``: its questions are split by document).
* :func:`count_train`: word counts of the train documents and queries.
* :func:`fit_preprocessor`: the LM's :class:`dynlm.data.preprocessor.Preprocessor` (word
  vocabulary with the short list γ, BPE with exactly ``bpe_merges`` merges), no entity ids.
* :class:`EncodeQuestions`: parsed rows -> :data:`ENCODED_SCHEMA` rows (+ ``split``).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import torch

from dynlm import storage
from dynlm.config import ConfigError
from dynlm.data import cbt, cmrc
from dynlm.data.bpe import SubwordTokenizer
from dynlm.data.config import _NOT_HASHED, CorpusConfig
from dynlm.data.preprocessor import Preprocessor
from dynlm.data.schema import Quarantined
from dynlm.data.split import assign_split
from dynlm.data.vocabulary import Vocabulary
from dynlm.models.ga_reader import ReaderBatch, TokenInputs
from dynlm.vocab_spec import UNK_ID, VocabSpec

_STRINGS = pa.list_(pa.string())
_INTS = pa.list_(pa.int32())
PARSED_SCHEMA = pa.schema([
    pa.field("kind", pa.string()), pa.field("doc_id", pa.string()), pa.field("source_file", pa.string()),
    pa.field("input_file", pa.string()), pa.field("split", pa.string()), pa.field("line", pa.int64()),
    pa.field("reason", pa.string()), pa.field("document", _STRINGS), pa.field("query", _STRINGS),
    pa.field("answer", pa.string()), pa.field("candidates", _STRINGS), pa.field("answer_class", pa.string()),
])
PAYLOAD_COLUMNS = ("document", "query", "candidates")
ENCODED_SCHEMA = pa.schema([
    pa.field("doc_id", pa.string()), pa.field("source_file", pa.string()), pa.field("answer", pa.string()),
    pa.field("answer_class", pa.string()),
    pa.field("answer_word_id", pa.int32()),  # 0 when unknown; OOV (no own embedding): <unk> or off the short list
    pa.field("answer_index", pa.int32()),  # in candidates
    pa.field("candidates", _STRINGS),  # the CBT list, or the document's word types in order of first occurrence
    pa.field("doc_word_ids", _INTS), pa.field("doc_subword_ids", _INTS), pa.field("doc_subword_lengths", _INTS),
    pa.field("doc_in_query", _INTS),  # 1 where the document token occurs in the query
    pa.field("candidate_of_token", _INTS),  # candidate index of each document token, -1 where none
    pa.field("query_word_ids", _INTS), pa.field("query_subword_ids", _INTS), pa.field("query_subword_lengths", _INTS),
])


@dataclass
class ClozeDataConfig(CorpusConfig):
    """The cloze task's ``data:`` section (the :class:`CorpusConfig` fields first).

    Args:
        vocab_size: most frequent train words kept in the word vocabulary.
        gamma: the short list: the most frequent ``ceil(gamma * words)`` keep their own embedding.
        bpe_merges: exact number of BPE merges (0: characters).
        named_splits: a file whose name gives its split keeps it (CBT: ``cbtest_NE_train.txt``,
            ``cbtest_CN_valid_2000ex.txt``; others: the ``.``-separated rule of
            :mod:`dynlm.data.split`); False (default): every question not under ``data.splits`` is
            split by a hash of its doc_id (CMRC-2017's files all say ``valid``).
        valid_fraction / test_fraction / split_seed: the hash split.
    """

    vocab_size: int = 20000
    gamma: float = 0.9
    bpe_merges: int = 1000
    named_splits: bool = False
    valid_fraction: float = 0.1
    test_fraction: float = 0.2
    split_seed: int = 0

    def validate(self) -> None:
        super().validate()
        if self.vocab_size < 1 or self.bpe_merges < 0 or not 0.0 <= self.gamma <= 1.0:
            raise ConfigError("data.vocab_size must be >= 1, data.bpe_merges >= 0 and data.gamma in [0, 1]")
        if not (0 <= self.valid_fraction and 0 <= self.test_fraction and self.valid_fraction + self.test_fraction < 1):
            raise ConfigError("data.valid_fraction and data.test_fraction must be >= 0 and sum to < 1")

    def encoding_hash(self, length: int = 16) -> str:
        """``data_hash`` without ``gamma``: the short list is applied in the model's input layer
        (and to the OOV flag at collate time), so folders of another gamma share their shards."""
        return self._hash(exclude=(*_NOT_HASHED, "gamma"), length=length)

    def file_split(self, path: str) -> tuple[str, str | None]:
        """``data.splits`` when given; else, with ``named_splits``, the split the file name gives
        (CBT: ``cbtest_NE_train.txt``, ``_``-separated; others: the ``.``-separated rule of
        :mod:`dynlm.data.split`), ``hash`` for a file that names none; without ``named_splits``
        ``hash``, whatever the name says (CMRC-2017's ``cloze.valid.doc_query``)."""
        rule, split = super().file_split(path)
        if rule == "config":
            return rule, split
        if not self.named_splits:
            return "hash", None
        if cbt.is_cbt(path):
            split = cbt.file_split(path)
            return ("named", split) if split else ("hash", None)
        return rule, split

    def keeps_file(self, relative_path: str) -> bool:
        """CMRC ``*.doc_query[.gz]`` / ``*.answer`` and CBT ``cbtest_*.txt`` files."""
        return cmrc.is_doc_query(relative_path) or relative_path.endswith(cmrc.ANSWER_SUFFIX) or cbt.is_cbt(relative_path)


def _located(path: str, inputs: list[str]) -> str:
    """``path`` as storage reads it: Ray Data lists ``s3://b/k`` as ``b/k``; the input gives the scheme."""
    for item in inputs:
        if storage.is_uri(item):
            scheme, _, rest = item.partition("://")
            if path.startswith(rest.rstrip("/")):
                return f"{scheme}://{path}"
    return path


def read_questions(data: bytes, path: str, inputs: list[str]) -> list[dict | Quarantined]:
    """The questions and quarantined questions of one input file (an answer file gives none)."""
    if path.endswith(cmrc.ANSWER_SUFFIX):
        return []
    if cbt.is_cbt(path):
        records = list(cbt.parse_cbt(data, path))
    elif cmrc.is_doc_query(path):
        answer_file = cmrc.answer_path(path)
        try:
            answers, bad = cmrc.parse_answers(storage.read_bytes(_located(answer_file, inputs)), answer_file)
        except (FileNotFoundError, OSError) as exc:
            return [Quarantined(path, cmrc.set_name(path), 0, f"its answer file cannot be read: {exc}")]
        records = bad + list(cmrc.parse_cmrc(data, path, answers))
    else:
        return [Quarantined(path, path, 0, "neither a CMRC .doc_query/.answer file nor a CBT cbtest_*.txt file")]
    return [Quarantined(path, r["doc_id"], r["line"], f"answer {r['answer']!r} does not occur in the document")
            if isinstance(r, dict) and r["answer"] not in r["document"] else r for r in records]


def parse_files(batch: pa.Table, cfg_dict: dict) -> pa.Table:
    """Input files -> PARSED_SCHEMA rows (questions with their split, quarantined questions)."""
    cfg = ClozeDataConfig.from_dict(cfg_dict)
    rows = []
    empty = {"document": [], "query": [], "answer": "", "candidates": [], "answer_class": ""}
    for data, path in zip(batch.column("bytes").to_pylist(), batch.column("path").to_pylist()):
        named = cfg.file_split(path)[1]  # None: hash each question (the rule the driver records)
        base = {"source_file": path, "input_file": path}
        for record in read_questions(data, path, cfg.inputs):
            if isinstance(record, Quarantined):
                rows.append({**base, **empty, "kind": "quarantine", "doc_id": record.doc_id, "split": "",
                             "line": record.line, "reason": record.reason})
                continue
            split = named or assign_split(record["doc_id"], seed=cfg.split_seed, valid_fraction=cfg.valid_fraction,
                                          test_fraction=cfg.test_fraction)
            rows.append({**base, **record, "kind": "document", "split": split, "reason": ""})
    return pa.Table.from_pylist(rows, schema=PARSED_SCHEMA)


def count_train(batch: pa.Table) -> pa.Table:
    """``{word, count}`` of the batch's train documents and queries."""
    train = batch.filter(pc.and_(pc.equal(batch["kind"], "document"), pc.equal(batch["split"], "train")))
    counts: Counter = Counter()
    for row in train.select(["document", "query"]).to_pylist():
        counts.update(row["document"])
        counts.update(row["query"])
    words = sorted(counts)
    return pa.table({"word": pa.array(words, pa.string()), "count": pa.array([counts[w] for w in words], pa.int64())})


def fit_preprocessor(counts: dict[str, int], cfg: ClozeDataConfig) -> Preprocessor:
    """Word vocabulary + short list + BPE of the train counts (the SAW preprocessing of the LM)."""
    vocabulary = Vocabulary.from_counts(counts, cfg.vocab_size, cfg.gamma)
    return Preprocessor(vocabulary, SubwordTokenizer.train(counts, cfg.bpe_merges), max_chains=0)


def _tokens(preprocessor: Preprocessor, tokens: list[str]) -> dict:
    """Word ids and BPE subwords of a token list (the LM encoder's, its <bos>/<eos> dropped)."""
    encoded = preprocessor.encode_document([tokens])
    return {"word_ids": encoded["word_ids"][1:-1], "subword_ids": encoded["subword_ids"][1:-1],
            "subword_lengths": encoded["subword_lengths"][1:-1]}


def encode_question(preprocessor: Preprocessor, record: dict) -> dict:
    """One question (``document``, ``query``, ``candidates``, ``answer``: "" when unknown) -> its
    ENCODED_SCHEMA columns (without doc_id / source_file / answer_class)."""
    document, query = record["document"], record["query"]
    candidates = list(record["candidates"]) or [w for w in dict.fromkeys(document) if w != cbt.BLANK]
    index = {c: i for i, c in enumerate(candidates)}
    doc, qry, in_query = _tokens(preprocessor, document), _tokens(preprocessor, query), set(query)
    answer = record["answer"]
    answer_id = preprocessor.vocabulary.id(answer)
    return {"answer": answer, "answer_index": index.get(answer, -1), "candidates": candidates,
            "answer_word_id": answer_id if answer else 0,
            "doc_word_ids": doc["word_ids"], "doc_subword_ids": doc["subword_ids"],
            "doc_subword_lengths": doc["subword_lengths"], "doc_in_query": [int(t in in_query) for t in document],
            "candidate_of_token": [index.get(t, -1) for t in document], "query_word_ids": qry["word_ids"],
            "query_subword_ids": qry["subword_ids"], "query_subword_lengths": qry["subword_lengths"]}


class EncodeQuestions:
    """Encode stage: parsed rows -> ENCODED_SCHEMA rows plus ``split`` (one preprocessor per actor)."""

    def __init__(self, preprocessor_json: str):
        self.preprocessor = Preprocessor.from_json(preprocessor_json)

    def __call__(self, batch: pa.Table) -> pa.Table:
        docs = batch.filter(pc.equal(batch["kind"], "document"))
        rows = [{"doc_id": row["doc_id"], "source_file": row["source_file"], "answer_class": row["answer_class"],
                 **encode_question(self.preprocessor, row)} for row in docs.to_pylist()]
        return pa.Table.from_pylist(rows, schema=ENCODED_SCHEMA).append_column("split", docs["split"])


# ------------------------------------------------------------------------------------ batches
def _side(rows: list[dict], prefix: str, spec: VocabSpec) -> TokenInputs:
    """The document or query side of encoded rows as :class:`TokenInputs` (unique words by
    (word id, subwords): words off the short list share <unk> but keep their subwords)."""
    lengths = [max(1, len(row[f"{prefix}_word_ids"])) for row in rows]
    width = max(lengths)
    tokens = torch.full((len(rows), width), spec.pad_id, dtype=torch.long)
    token_to_unique = torch.zeros((len(rows), width), dtype=torch.long)
    unique: dict[tuple[int, tuple[int, ...]], int] = {}
    for b, row in enumerate(rows):
        word_ids, flat, start = row[f"{prefix}_word_ids"], row[f"{prefix}_subword_ids"], 0
        for i, (word, count) in enumerate(zip(word_ids, row[f"{prefix}_subword_lengths"])):
            key = (int(word), tuple(flat[start : start + count]))
            start += count
            tokens[b, i] = key[0]
            token_to_unique[b, i] = unique.setdefault(key, len(unique))
    keys = list(unique) or [(spec.pad_id, (spec.subword_pad_id,))]
    subword_ids = torch.full((len(keys), max(len(k[1]) for k in keys)), spec.subword_pad_id, dtype=torch.long)
    for u, (_, subwords) in enumerate(keys):
        subword_ids[u, : len(subwords)] = torch.tensor(subwords, dtype=torch.long)
    lengths_t = torch.tensor(lengths, dtype=torch.long)
    return TokenInputs(tokens=tokens, mask=torch.arange(width)[None, :] < lengths_t[:, None], lengths=lengths_t,
                       subword_ids=subword_ids, subword_lengths=torch.tensor([len(k[1]) for k in keys], dtype=torch.long),
                       token_to_unique=token_to_unique)


def _padded(rows: list[list[int]], fill: int, width: int | None = None) -> torch.Tensor:
    width = width or max(1, *map(len, rows))
    out = torch.full((len(rows), width), fill, dtype=torch.long)
    for i, values in enumerate(rows):
        out[i, : len(values)] = torch.tensor(values, dtype=torch.long)
    return out


@dataclass
class QuestionBatch:
    """What the cloze task's loops pass around: the model's input and what scoring needs besides.

    Attributes:
        inputs: the :class:`ReaderBatch` the model reads.
        answer_classes: per question its answer class ("" for an inactive row).
        answer_oov: per question whether its answer has no own word embedding.
        candidates: per question its candidate words (the model's answer index reads as one).
    """

    inputs: ReaderBatch
    answer_classes: list[str]
    answer_oov: list[bool]
    candidates: list[list[str]]

    def to(self, device) -> "QuestionBatch":
        return QuestionBatch(self.inputs.to(device), self.answer_classes, self.answer_oov, self.candidates)

    @property
    def size(self) -> int:
        return self.inputs.size

    @property
    def num_documents(self) -> int:
        """Questions with a known answer (an inactive row has none)."""
        return int((self.inputs.answer >= 0).sum())

    num_padded = 0  # questions are not padded into steps


def collate_questions(rows: list[dict], spec: VocabSpec) -> QuestionBatch:
    """Encoded rows -> a :class:`QuestionBatch`."""
    document = _side(rows, "doc", spec)
    width = document.tokens.shape[1]
    inputs = ReaderBatch(document=document, query=_side(rows, "query", spec),
                         in_query=_padded([row["doc_in_query"] for row in rows], 0, width),
                         candidate_of_token=_padded([row["candidate_of_token"] for row in rows], -1, width),
                         candidate_mask=_padded([[1] * len(row["candidates"]) for row in rows], 0).bool(),
                         answer=torch.tensor([row["answer_index"] for row in rows], dtype=torch.long))
    oov = [row["answer_word_id"] == UNK_ID or row["answer_word_id"] >= spec.shortlist_size for row in rows]
    return QuestionBatch(inputs, [row["answer_class"] for row in rows], oov,
                         [list(row["candidates"]) for row in rows])


def inactive_row() -> dict:
    """An encoded row with one padding token and no known answer: no loss, no metric."""
    return {"doc_word_ids": [0], "doc_subword_ids": [0], "doc_subword_lengths": [1], "doc_in_query": [0],
            "candidate_of_token": [-1], "query_word_ids": [0], "query_subword_ids": [0], "query_subword_lengths": [1],
            "candidates": [""], "answer_index": -1, "answer": "", "answer_word_id": 0, "answer_class": ""}


def batch_questions(rows, spec: VocabSpec, batch_size: int, *, sort_by_length: bool = True, seed: int | None = 0):
    """:class:`QuestionBatch` es of ``batch_size`` questions: shuffled with ``seed``
    (None: in order); ``sort_by_length`` batches questions of similar document length together
    (within windows of 50 batches, the batch order shuffled again), so little is padding."""
    rows = list(rows)
    rng = random.Random(seed)
    if seed is not None:
        rng.shuffle(rows)
    chunks = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
    if sort_by_length:
        window = 50 * batch_size
        ordered = [r for i in range(0, len(rows), window)
                   for r in sorted(rows[i : i + window], key=lambda row: len(row["doc_word_ids"]))]
        chunks = [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
        if seed is not None:
            rng.shuffle(chunks)
    for chunk in chunks:
        yield collate_questions(chunk, spec)
