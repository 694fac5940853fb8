"""Ray Data stage functions of the prepare job (they run in Ray workers) and the vectorized encoder.

* :func:`parse_files`: binary input files -> PARSED_SCHEMA rows (parse_file -> anonymize -> split:
  the file's named or configured split, else the document's hash split; see dynlm/data/split.py);
* :func:`count_train_words`: per-batch word counts of the train split (summed by a Ray groupby);
* :class:`EncodeDocuments`: the encode actor; loads the preprocessor JSON once;
* :func:`encode_documents`: same output as ``Preprocessor.encode_document`` on every document of
  an Arrow batch (a test checks it), but each distinct token of the batch is looked up ONCE and the
  per-token columns are built with numpy gathers instead of a Python loop over tokens.

Layout of one encoded document (``S`` sentences, ``n_s`` tokens in sentence s)::

    positions:  <bos> t_1 .. t_n1 <eos> <bos> ... <eos>      (sum n_s + 2 S positions)
"""

from __future__ import annotations


import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dynlm.data.anonymize import STAT_KEYS, anonymize
from dynlm.data.config import DataConfig
from dynlm.data.preprocessor import Preprocessor, entity_index
from dynlm.data.readers import parse_file
from dynlm.data.schema import ENCODED_SCHEMA, Quarantined
from dynlm.data.split import assign_split, file_split

ENTITY_REGEX = r"^<unk[1-9][0-9]*>$"
DOC_STATS = tuple(k for k in STAT_KEYS if k != "documents")

# One row per parsed document or quarantine record (internal to this job).
PARSED_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string()),  # "document" | "dropped" | "quarantine"
        pa.field("doc_id", pa.string()),
        pa.field("source_file", pa.string()),
        pa.field("split", pa.string()),  # "" unless kind == "document"
        pa.field("sentences", pa.list_(pa.list_(pa.string()))),  # anonymized; [] unless a document
        pa.field("num_sentences", pa.int64()),
        pa.field("num_tokens", pa.int64()),
        *[pa.field(k, pa.int64()) for k in DOC_STATS],
        pa.field("line", pa.int64()),
        pa.field("reason", pa.string()),
    ]
)


def parse_files(batch: pa.Table, cfg_dict: dict) -> pa.Table:
    """Binary files -> PARSED_SCHEMA rows (anonymized documents with their split, quarantine).

    ``cfg_dict``'s ``inputs`` and ``splits`` must be resolved like the rows' paths (absolute local
    paths or URIs: see pipelines.prepare), since a file's split is read from its path below its
    input. The driver checks afterwards that all files follow one rule (``check_split_rule``).
    """
    cfg = DataConfig.from_dict(cfg_dict)
    rows: dict[str, list] = {f.name: [] for f in PARSED_SCHEMA}

    def add(kind, doc_id, source_file, split="", sentences=(), stats=None, line=0, reason=""):
        values = dict(kind=kind, doc_id=doc_id, source_file=source_file, split=split,
                      sentences=list(sentences), num_sentences=len(sentences),
                      num_tokens=sum(len(s) for s in sentences), line=line, reason=reason)
        values.update({k: (stats or {}).get(k, 0) for k in DOC_STATS})
        for key, value in values.items():
            rows[key].append(value)

    for data, path in zip(batch.column("bytes").to_pylist(), batch.column("path").to_pylist()):
        try:  # a file is either parsed or quarantined as a whole when its reader fails
            items = list(parse_file(data, path, cfg.format, lines_per_document=cfg.lines_per_document))
        except Exception as exc:  # noqa: BLE001 - recorded with its reason, never dropped
            add("quarantine", "", path, reason=f"reader failed: {type(exc).__name__}: {exc}")
            continue
        _, file_level_split = file_split(path, cfg.inputs, cfg.splits)  # None: hash each document
        for item in items:
            if isinstance(item, Quarantined):
                add("quarantine", item.doc_id, item.source_file, line=item.line, reason=item.reason)
                continue
            try:
                doc, stats = anonymize(item, max_chains=cfg.max_chains, min_chain_mentions=cfg.min_chain_mentions,
                                       too_many_chains=cfg.too_many_chains)
            except ValueError as exc:
                add("quarantine", item["doc_id"], item["source_file"], reason=f"anonymize: {exc}")
                continue
            if doc is None:
                add("dropped", item["doc_id"], item["source_file"], stats=stats,
                    reason=f"more than max_chains={cfg.max_chains} entity chains")
                continue
            split = file_level_split or assign_split(doc["doc_id"], seed=cfg.split_seed,
                                                     valid_fraction=cfg.valid_fraction, test_fraction=cfg.test_fraction)
            add("document", doc["doc_id"], doc["source_file"], split, doc["sentences"], stats)
    return pa.Table.from_pydict(rows, schema=PARSED_SCHEMA)


def count_train_words(batch: pa.Table) -> pa.Table:
    """Word counts of the train documents of one batch (entity tokens excluded)."""
    train = batch.filter(pc.and_(pc.equal(batch["kind"], "document"), pc.equal(batch["split"], "train")))
    tokens = pc.list_flatten(pc.list_flatten(train["sentences"]))
    counts = pc.value_counts(tokens)  # one row per word type: the entity filter below runs on types
    words, numbers = counts.field("values"), pc.cast(counts.field("counts"), pa.int64())
    keep = pc.invert(pc.match_substring_regex(words, ENTITY_REGEX))
    return pa.table({"word": words.filter(keep), "count": numbers.filter(keep)})


class EncodeDocuments:
    """Actor of the encode stage: loads the preprocessor JSON once, encodes whole batches."""

    def __init__(self, preprocessor_json: str):
        self.preprocessor = Preprocessor.from_json(preprocessor_json)

    def __call__(self, batch: pa.Table) -> pa.Table:
        docs = batch.filter(pc.equal(batch["kind"], "document"))
        columns = encode_documents(self.preprocessor, docs["sentences"])
        table = pa.table({"doc_id": docs["doc_id"], "source_file": docs["source_file"], **columns},
                         schema=ENCODED_SCHEMA)
        return table.append_column("split", docs["split"])



def _type_table(preprocessor: Preprocessor, types: list[str]) -> tuple[np.ndarray, ...]:
    """Per token type: word id, entity id, subword offsets [T+1], subword values (T = len(types))."""
    spec, vocabulary, subwords = preprocessor.spec, preprocessor.vocabulary, preprocessor.subwords
    word = np.empty(len(types), dtype=np.int32)
    entity = np.zeros(len(types), dtype=np.int32)
    pieces: list[list[int]] = []
    for i, token in enumerate(types):
        chain = entity_index(token)
        if chain:
            if chain > preprocessor.max_chains:
                raise ValueError(f"entity token {token!r} is beyond max_chains={preprocessor.max_chains}")
            word[i], entity[i] = spec.entity_word_id(chain), chain
        else:
            word[i] = vocabulary.id(token)
        pieces.append(subwords.encode_word(token))
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = np.fromiter((i for p in pieces for i in p), dtype=np.int32, count=int(offsets[-1]))
    return word, entity, offsets, values


def _list_array(offsets: np.ndarray, values: np.ndarray) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values.astype(np.int32)))


def encode_documents(preprocessor: Preprocessor, sentences: pa.ChunkedArray | pa.Array) -> dict[str, pa.Array]:
    """Encode a column of documents (``list<list<string>>``, one row per document).

    Args:
        preprocessor: the fitted artifact.
        sentences: anonymized sentences per document (``<unkN>`` tokens are entities).

    Returns:
        ENCODED_SCHEMA columns except doc_id/source_file: ``num_tokens`` (int32 [D]) and the
        list<int32> columns ``sentence_lengths``, ``word_ids``, ``entity_ids``, ``subword_ids``,
        ``subword_lengths`` (D = number of documents).
    """
    if isinstance(sentences, pa.ChunkedArray):
        sentences = sentences.combine_chunks() if sentences.num_chunks else pa.array([], sentences.type)
    sents_per_doc = pc.list_value_length(sentences).to_numpy(zero_copy_only=False).astype(np.int64)  # [D]
    flat_sentences = pc.list_flatten(sentences)
    tokens_per_sent = pc.list_value_length(flat_sentences).to_numpy(zero_copy_only=False).astype(np.int64)  # [S]
    tokens = pc.list_flatten(flat_sentences)  # [N] strings
    encoded = pc.dictionary_encode(tokens)
    token_types = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)  # [N] in [0, T)
    types = encoded.dictionary.to_pylist()
    num_types = len(types)

    word, entity, sub_offsets, sub_values = _type_table(preprocessor, types + ["<bos>", "<eos>"])
    # (bos/eos: the preprocessor's own specials; their word ids come from the vocabulary's specials)
    word[num_types], word[num_types + 1] = preprocessor.spec.bos_id, preprocessor.spec.eos_id

    num_sents = len(tokens_per_sent)
    sent_token_start = np.concatenate([[0], np.cumsum(tokens_per_sent)])  # [S+1]
    sent_index = np.repeat(np.arange(num_sents), tokens_per_sent)  # [N]
    positions = np.empty(len(token_types) + 2 * num_sents, dtype=np.int64)  # type code per position
    positions[np.arange(len(token_types)) + 2 * sent_index + 1] = token_types
    positions[sent_token_start[:-1] + 2 * np.arange(num_sents)] = num_types  # <bos>
    positions[sent_token_start[1:] + 2 * np.arange(num_sents) + 1] = num_types + 1  # <eos>

    word_ids = word[positions]
    entity_ids = entity[positions]
    subword_lengths = (sub_offsets[1:] - sub_offsets[:-1])[positions]
    out_sub_offsets = np.concatenate([[0], np.cumsum(subword_lengths)])
    gather = np.repeat(sub_offsets[positions] - out_sub_offsets[:-1], subword_lengths) + np.arange(out_sub_offsets[-1])
    subword_ids = sub_values[gather]

    doc_sent_start = np.concatenate([[0], np.cumsum(sents_per_doc)])  # [D+1]
    doc_pos_start = sent_token_start[doc_sent_start] + 2 * doc_sent_start  # [D+1]
    return {
        "num_tokens": pa.array(np.diff(doc_pos_start).astype(np.int32)),
        "sentence_lengths": _list_array(doc_sent_start, tokens_per_sent + 2),
        "word_ids": _list_array(doc_pos_start, word_ids),
        "entity_ids": _list_array(doc_pos_start, entity_ids),
        "subword_ids": _list_array(out_sub_offsets[doc_pos_start], subword_ids),
        "subword_lengths": _list_array(doc_pos_start, subword_lengths),
    }
