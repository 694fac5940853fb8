"""The vectorized encoder of the LM task: a column of anonymized documents -> ENCODED_SCHEMA.

* :func:`encode_documents`: same output as ``Preprocessor.encode_document`` on every document of
  an Arrow batch (a test checks it), but each distinct token of the batch is looked up ONCE and the
  per-token columns are built with numpy gathers instead of a Python loop over tokens;
* :class:`EncodeDocuments`: the encode stage (a Ray Data actor in the prepare job); loads the
  preprocessor JSON once and encodes whole :data:`dynlm.data.parse_stage.PARSED_SCHEMA` batches.

Layout of one encoded document (``S`` sentences, ``n_s`` tokens in sentence s)::

    positions:  <bos> t_1 .. t_n1 <eos> <bos> ... <eos>      (sum n_s + 2 S positions)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dynlm.data.preprocessor import Preprocessor, entity_index
from dynlm.data.schema import ENCODED_SCHEMA


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
