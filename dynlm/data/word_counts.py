"""Word counts of the train split (the input of ``Preprocessor.fit``), one Arrow batch at a time.

:func:`count_train_words` takes :data:`dynlm.data.parse_stage.PARSED_SCHEMA` rows and returns a
``{word, count}`` table for the train documents of the batch; the caller sums the tables per
word (a tree of Ray tasks in the prepare job, ``pipelines.prepare._train_counts``; a ``Counter`` without Ray). Entity tokens are excluded.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

ENTITY_REGEX = r"^<unk[1-9][0-9]*>$"


def count_train_words(batch: pa.Table) -> pa.Table:
    """Word counts of the train documents of one batch (entity tokens excluded)."""
    train = batch.filter(pc.and_(pc.equal(batch["kind"], "document"), pc.equal(batch["split"], "train")))
    tokens = pc.list_flatten(pc.list_flatten(train["sentences"]))
    counts = pc.value_counts(tokens)  # one row per word type: the entity filter below runs on types
    words, numbers = counts.field("values"), pc.cast(counts.field("counts"), pa.int64())
    keep = pc.invert(pc.match_substring_regex(words, ENTITY_REGEX))
    return pa.table({"word": words.filter(keep), "count": numbers.filter(keep)})
