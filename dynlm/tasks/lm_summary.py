"""The LM task's prepare counts (the manifest's ``counts`` and the end-of-prepare table)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from dynlm.data.parse_stage import DOC_STATS

# (manifest key, label) of the anonymization counts in the prepare table; the DROP_ROWS are
# shown only when not zero (one "dropped or truncated: none" row otherwise)
LM_SUMMARY_ROWS = (("chains", "chains"), ("anonymized_mentions", "anonymized mentions"))
DROP_ROWS = (("dropped_nested", "dropped nested mentions"), ("dropped_overlapping", "dropped overlapping mentions"),
             ("dropped_docs_too_many_chains", "dropped docs (too many chains)"), ("truncated_chains", "truncated chains"))


def token_stats(table: pa.Table, spec) -> dict[str, int]:
    """Word tokens, OOV word tokens and subwords of word tokens of encoded rows (no
    specials/entities): the LM task's :meth:`~dynlm.tasks.base.Task.shard_stats`."""
    if table.num_rows == 0:
        return {"words": 0, "oov_words": 0, "subwords": 0}
    word_ids = pc.list_flatten(table["word_ids"]).to_numpy()
    entity_ids = pc.list_flatten(table["entity_ids"]).to_numpy()
    lengths = pc.list_flatten(table["subword_lengths"]).to_numpy()
    is_word = (entity_ids == 0) & (word_ids != spec.bos_id) & (word_ids != spec.eos_id)
    return {"words": int(is_word.sum()), "oov_words": int((word_ids[is_word] == spec.unk_id).sum()),
            "subwords": int(lengths[is_word].sum())}


def lm_counts(meta: pa.Table, split_stats: dict[str, dict[str, int]], spec) -> dict:
    """Sentences/tokens per split, anonymization sums (DOC_STATS), OOV rate, subwords per word
    (``split_stats``: the per-split sums of :func:`token_stats`)."""
    counts: dict = {"sentences": {}, "tokens": {}}
    documents = meta.filter(pc.equal(meta["kind"], "document"))
    for split in split_stats:
        rows = documents.filter(pc.equal(documents["split"], split))
        counts["sentences"][split] = int(pc.sum(rows["num_sentences"]).as_py() or 0)
        counts["tokens"][split] = int(pc.sum(rows["num_tokens"]).as_py() or 0)
    words_total = sum(stats.get("words", 0) for stats in split_stats.values())
    subwords_total = sum(stats.get("subwords", 0) for stats in split_stats.values())
    valid = split_stats.get("valid", {})
    oov_valid, words_valid = valid.get("oov_words", 0), valid.get("words", 0)
    for key in DOC_STATS:
        counts[key] = int(pc.sum(meta[key]).as_py() or 0)
    counts["oov_rate_valid"] = round(oov_valid / words_valid, 6) if words_valid else 0.0
    counts["subwords_per_word"] = round(subwords_total / words_total, 6) if words_total else 0.0
    counts["vocab_words"] = spec.num_words
    counts["subword_vocab"] = spec.num_subwords
    return counts
