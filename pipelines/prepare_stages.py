"""The prepare job's stage functions, re-exported from the library (they import no Ray).

They live in the LM task's data modules (``dynlm.tasks.lm.LMTask`` names them):
:mod:`dynlm.data.parse_stage` (:func:`parse_files`, :data:`PARSED_SCHEMA`),
:mod:`dynlm.data.word_counts` (:func:`count_train_words`) and :mod:`dynlm.data.batch_encoder`
(:class:`EncodeDocuments`, :func:`encode_documents`).
"""

from __future__ import annotations

from dynlm.data.batch_encoder import EncodeDocuments, encode_documents
from dynlm.data.parse_stage import DOC_STATS, PARSED_SCHEMA, parse_files
from dynlm.data.word_counts import ENTITY_REGEX, count_train_words

__all__ = ["DOC_STATS", "ENTITY_REGEX", "PARSED_SCHEMA", "EncodeDocuments", "count_train_words",
           "encode_documents", "parse_files"]
