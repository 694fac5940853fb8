"""Tests of dynlm.data.batching: lockstep sentence batches, chunks, flags, unique subwords, sorting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynlm.data.batching import (
    KIND_AFTER_ENTITY,
    KIND_FIRST_MENTION,
    KIND_OOV,
    KIND_REAPPEAR,
    KIND_REAPPEAR_1,
    KIND_REAPPEAR_2,
    KIND_REAPPEAR_3_5,
    KIND_REAPPEAR_6_PLUS,
    SIZE_JITTER,
    ChunkLayout,
    batch_documents,
    chunk_spans,
    collate_documents,
    mentions_before,
    num_steps,
    pack_rows,
    packed_steps,
)

E1, E2 = 20, 21  # <unk1>, <unk2> in the tiny spec (num_words=20); short list = ids < 15


@pytest.fixture
def two_docs(make_row):
    # doc a: "<bos> 5 <e1> 16 <eos>", "<bos> <e1> <e2> 7 <eos>";  doc b: "<bos> 6 6 <eos>"
    return [make_row("a", [[5, E1, 16], [E1, E2, 7]]), make_row("b", [[6, 6]])]


def test_collate_shapes_mask_and_targets(two_docs, tiny_spec):
    batch = collate_documents(two_docs, tiny_spec)
    assert batch.doc_ids == ["a", "b"]
    assert len(batch.sentences) == 2
    s0, s1 = batch.sentences
    assert s0.tokens.tolist() == [[2, 5, E1, 16], [2, 6, 6, 0]]
    assert s0.targets.tolist() == [[5, E1, 16, 3], [6, 6, 3, 0]]
    assert s0.mask.tolist() == [[True] * 4, [True, True, True, False]]
    assert s0.lengths.tolist() == [4, 3]
    assert s0.entity_ids.tolist() == [[0, 0, 1, 0], [0, 0, 0, 0]]
    assert s0.target_entity_ids.tolist() == [[0, 1, 0, 0], [0, 0, 0, 0]]
    assert s1.tokens.tolist() == [[2, E1, E2, 7], [0, 0, 0, 0]]
    assert s1.lengths.tolist() == [4, 0]
    assert s1.mask[1].any().item() is False
    assert s0.doc_active.tolist() == [True, True] and s1.doc_active.tolist() == [True, False]
    assert s0.new_doc.tolist() == [True, True] and s1.new_doc.tolist() == [False, False]
    assert s0.doc_end.tolist() == [False, True] and s1.doc_end.tolist() == [True, False]
    assert batch.num_tokens == 4 + 3 + 4
    assert batch.num_padded == 2 * 4 + 2 * 4 - 11


def test_target_kind_flags(two_docs, tiny_spec):
    s0, s1 = collate_documents(two_docs, tiny_spec).sentences
    # targets a0: 5, <e1> (first), 16 (after entity, off the short list), <eos>
    assert s0.target_kind[0].tolist() == [0, KIND_FIRST_MENTION, KIND_AFTER_ENTITY | KIND_OOV, 0]
    # targets a1: <e1> (re-appears), <e2> (first, after <e1>), 7 (after <e2>), <eos>
    assert s1.target_kind[0].tolist() == [KIND_REAPPEAR | KIND_REAPPEAR_1, KIND_FIRST_MENTION | KIND_AFTER_ENTITY, KIND_AFTER_ENTITY, 0]
    assert s0.target_kind[1].tolist() == [0, 0, 0, 0]


def test_mentions_before_counts_earlier_positions_of_the_same_chain():
    assert mentions_before(np.array([0, 1, 2, 1, 0, 2, 1, 3])).tolist() == [0, 0, 0, 1, 0, 1, 2, 0]
    assert mentions_before(np.array([], dtype=np.int64)).tolist() == []


def test_reappearance_bins_by_earlier_mentions(make_row, tiny_spec):
    # <e1> mentioned 8 times over three sentences; <e2> twice; mentions before: e1 0..7, e2 0, 1
    row = make_row("acc", [[E1, 5, E1, E2], [E1, E1, E2, E1], [E1, 6, E1, E1]], tiny_spec)
    steps = collate_documents([row], tiny_spec).sentences
    kinds = torch.cat([s.target_kind[0, : int(s.lengths[0])] for s in steps])  # [15] over the document
    targets = torch.cat([s.targets[0, : int(s.lengths[0])] for s in steps])
    bins = {KIND_REAPPEAR_1: [], KIND_REAPPEAR_2: [], KIND_REAPPEAR_3_5: [], KIND_REAPPEAR_6_PLUS: []}
    for index, kind in enumerate(kinds.tolist()):
        for bit in bins:
            if kind & bit:
                bins[bit].append((index, int(targets[index])))
    # target positions: s0 = 0..4 (E1 5 E1 E2 eos), s1 = 5..9, s2 = 10..14
    assert bins[KIND_REAPPEAR_1] == [(2, E1), (7, E2)]  # 2nd E1, 2nd E2
    assert bins[KIND_REAPPEAR_2] == [(5, E1)]
    assert bins[KIND_REAPPEAR_3_5] == [(6, E1), (8, E1), (10, E1)]  # E1 with 3, 4, 5 earlier mentions
    assert bins[KIND_REAPPEAR_6_PLUS] == [(12, E1), (13, E1)]  # 6 and 7 earlier mentions
    reappear = [i for i, k in enumerate(kinds.tolist()) if k & KIND_REAPPEAR]
    assert sorted(i for pairs in bins.values() for i, _ in pairs) == reappear  # exactly one bin each


def test_unique_subwords_once_per_word(two_docs, tiny_spec):
    s0 = collate_documents(two_docs, tiny_spec).sentences[0]
    # unique inputs of step 0: <bos>, 5, <e1>, 16, 6  (6 twice and <bos> twice -> once each)
    assert s0.unique_words.tolist() == [2, 5, E1, 16, 6]
    assert s0.token_to_unique.tolist() == [[0, 1, 2, 3], [0, 4, 4, 0]]
    assert s0.subword_lengths.tolist() == [1, 3, 1, 2, 1]  # subwords_of(): 1 + id % 3 units
    assert s0.subword_ids.shape == (5, 3)
    assert s0.subword_ids[3].tolist() == [2 + 16 % 10, 2 + 17 % 10, 0]


def test_same_word_id_different_subwords_kept_apart(tiny_spec):
    # two different <unk> words (id 1) with different spellings stay distinct unique entries
    row = {"doc_id": "u", "num_tokens": 4, "sentence_lengths": [4], "word_ids": [2, 1, 1, 3],
           "entity_ids": [0, 0, 0, 0], "subword_ids": [1, 5, 6, 7, 1], "subword_lengths": [1, 1, 2, 1]}
    s0 = collate_documents([row], tiny_spec).sentences[0]
    assert s0.unique_words.tolist() == [2, 1, 1]
    assert s0.token_to_unique.tolist() == [[0, 1, 2]]


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("word_ids", [2, 5, 3], "word_ids has 3 entries"),
        ("sentence_lengths", [1, 3], "fewer than 2 tokens"),
        ("entity_ids", [0, 1, 0, 0], "entity_ids do not match"),
        ("subword_lengths", [1, 0, 1, 1], "subword_lengths sum"),
        ("word_ids", [2, 5, 99, 3], "word id outside"),
    ],
)
def test_bad_rows_name_the_document(make_row, tiny_spec, column, value, message):
    row = make_row("broken-doc", [[4, 5]])
    row[column] = value
    with pytest.raises(ValueError, match="broken-doc") as info:
        collate_documents([row], tiny_spec)
    assert message in str(info.value)


def test_to_device_keeps_lengths_on_cpu(two_docs, tiny_spec):
    moved = collate_documents(two_docs, tiny_spec).to("meta")
    s0 = moved.sentences[0]
    assert s0.tokens.device.type == "meta" and s0.subword_ids.device.type == "meta"
    assert s0.lengths.device.type == "cpu" and s0.subword_lengths.device.type == "cpu"


def test_batch_documents_sorts_by_length_and_keeps_every_document(make_row, tiny_spec):
    rows = [make_row(f"d{n}", [[5] * 3] * n) for n in (1, 6, 2, 5, 3, 4)]
    batches = list(batch_documents(rows, tiny_spec, batch_size=2, seed=0))
    assert sorted(d for b in batches for d in b.doc_ids) == sorted(r["doc_id"] for r in rows)
    assert sorted(tuple(b.doc_ids) for b in batches) == [("d1", "d2"), ("d3", "d4"), ("d5", "d6")]
    unsorted = list(batch_documents(rows, tiny_spec, batch_size=2, sort_by_length=False, seed=None))
    assert [b.doc_ids for b in unsorted] == [["d1", "d6"], ["d2", "d5"], ["d3", "d4"]]
    assert sum(b.num_padded for b in batches) < sum(b.num_padded for b in unsorted)


def test_batch_documents_shuffle_is_seeded(random_rows, tiny_spec):
    rows = random_rows(12)
    order = lambda seed: [b.doc_ids for b in batch_documents(rows, tiny_spec, 3, seed=seed)]  # noqa: E731
    assert order(1) == order(1)
    assert sorted(d for b in order(1) for d in b) == sorted(r["doc_id"] for r in rows)


def test_sorted_batches_regroup_from_seed_to_seed_among_similar_sizes(make_row, tiny_spec):
    """Sorting by size alone made the same batches every epoch; with a seed the sizes are
    jittered by up to SIZE_JITTER, so neighbours trade batches, and far sizes never meet."""
    sizes = [10, 11, 12, 13, 14, 15, 30, 31, 32, 33, 34, 35]  # sentences per document
    rows = [make_row(f"d{n}", [[5] * 2] * n) for n in sizes]
    size = {f"d{n}": n for n in sizes}

    def groups(seed):
        return sorted(tuple(sorted(b.doc_ids)) for b in batch_documents(rows, tiny_spec, 3, seed=seed))

    assert groups(None) == [("d10", "d11", "d12"), ("d13", "d14", "d15"), ("d30", "d31", "d32"),
                            ("d33", "d34", "d35")]
    seen = {tuple(groups(seed)) for seed in range(10)}
    assert len(seen) > 1  # the groups change with the seed (the epoch)
    assert groups(3) == sorted(tuple(sorted(b.doc_ids)) for b in batch_documents(rows[::-1], tiny_spec, 3, seed=3))
    assert 15 * (1 + SIZE_JITTER) < 30 * (1 - SIZE_JITTER)
    for grouping in seen:  # ... but a batch never mixes the short (10-15) and the long (30-35) documents
        for group in grouping:
            assert len({size[d] > 20 for d in group}) == 1


def test_rows_from_numpy_arrays(make_row, tiny_spec):
    import numpy as np

    row = make_row("np", [[5, 6], [7]])
    as_numpy = {k: (np.asarray(v, dtype=np.int32) if isinstance(v, list) else v) for k, v in row.items()}
    a, b = collate_documents([row], tiny_spec), collate_documents([as_numpy], tiny_spec)
    for x, y in zip(a.sentences, b.sentences):
        assert torch.equal(x.tokens, y.tokens) and torch.equal(x.target_kind, y.target_kind)


# ----- the chunk layout ------------------------------------------------------------------


def test_chunk_spans_cut_anywhere_or_at_sentence_ends():
    # sentences of 4, 3, 6 tokens: 3 + 2 + 5 = 10 input positions
    assert chunk_spans([4, 3, 6], ChunkLayout(5)) == [(0, 5), (5, 10)]
    assert chunk_spans([4, 3, 6], ChunkLayout(4)) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_spans([4, 3, 6], ChunkLayout(5, whole_sentences=True)) == [(0, 5), (5, 10)]
    assert chunk_spans([4, 3, 6], ChunkLayout(4, whole_sentences=True)) == [(0, 3), (3, 5), (5, 10)]
    assert chunk_spans([4, 3, 6], ChunkLayout(100, whole_sentences=True)) == [(0, 10)]
    assert num_steps([4, 3, 6], None) == 3 and num_steps([4, 3, 6], ChunkLayout(4)) == 3
    with pytest.raises(ValueError, match="tokens must be >= 1"):
        ChunkLayout(0)


def _stream(batch, row: int, names=("tokens", "targets", "target_kind", "entities_seen", "entity_ids")) -> dict:
    """Every real position of one row over all steps, per field (reading order)."""
    out = {name: [] for name in names}
    for step in batch.sentences:
        n = int(step.lengths[row])
        for name in names:
            out[name] += getattr(step, name)[row, :n].tolist()
    return out


@pytest.mark.parametrize("layout", [ChunkLayout(3), ChunkLayout(7), ChunkLayout(7, whole_sentences=True),
                                    ChunkLayout(1000, whole_sentences=True)])
def test_chunks_read_the_same_positions_as_sentence_steps(random_rows, tiny_spec, layout):
    rows = random_rows(6, seed=4, max_sentences=6)
    sentences = collate_documents(rows, tiny_spec)
    chunks = collate_documents(rows, tiny_spec, layout)
    assert chunks.num_tokens == sentences.num_tokens and chunks.layout == layout and sentences.layout is None
    assert chunks.num_padded < sentences.num_padded  # no padding between sentences
    for row in range(len(rows)):
        assert _stream(chunks, row) == _stream(sentences, row)
        lengths = [int(step.lengths[row]) for step in chunks.sentences if int(step.lengths[row])]
        assert lengths == [e - a for a, e in chunk_spans(rows[row]["sentence_lengths"], layout)]
    for step in chunks.sentences:  # every position's subwords are its word's
        assert torch.equal(step.unique_words[step.token_to_unique][step.mask], step.tokens[step.mask])


def test_chunk_steps_name_each_positions_sentence(make_row, tiny_spec):
    # sentences of 3, 1 and 2 words: 4, 2 and 3 input positions (<bos> + words)
    row = make_row("d", [[5, 6, 7], [8], [9, 10]])
    batch = collate_documents([row], tiny_spec, ChunkLayout(5))  # 9 positions: [0, 5) | [5, 9)
    first, second = batch.sentences
    assert first.sentence_id[0].tolist() == [0, 0, 0, 0, 1] and second.sentence_id[0].tolist() == [0, 1, 1, 1]
    assert first.step_sentence_lengths.tolist() == [[4, 1]] and second.step_sentence_lengths.tolist() == [[1, 3]]
    assert first.new_doc.tolist() == [True] and second.new_doc.tolist() == [False]
    assert first.doc_end.tolist() == [False] and second.doc_end.tolist() == [True]
    whole = collate_documents([row], tiny_spec, ChunkLayout(5, whole_sentences=True))
    assert [s.lengths.tolist() for s in whole.sentences] == [[4], [5]]  # 4 | 2 + 3
    assert whole.sentences[1].sentence_id[0].tolist() == [0, 0, 1, 1, 1]
    lockstep = collate_documents([row], tiny_spec)
    assert all(s.sentence_id.eq(0).all() and s.step_sentence_lengths.shape[1] == 1 for s in lockstep.sentences)


def test_steps_count_the_most_mentions_of_one_chain_per_sentence(make_row, tiny_spec):
    """The merge loop's length comes from the CPU batch, not from the device: per row and
    sentence of the step, the most input-token mentions of one chain."""
    rows = [make_row("a", [[E1, 5, E1, E2], [E2, 6], [7]]), make_row("b", [[E2, E1, E2, E2]])]
    step = collate_documents(rows, tiny_spec, ChunkLayout(16, whole_sentences=True)).sentences[0]
    assert step.step_mention_repeats.tolist() == [[2, 1, 0], [3, 0, 0]]
    lockstep = collate_documents(rows, tiny_spec).sentences
    assert [s.step_mention_repeats.tolist() for s in lockstep] == [[[2], [3]], [[1], [0]], [[0], [0]]]
    for s in lockstep + [step]:  # the count the merge would otherwise ask the device for
        ids = torch.where(s.mask, s.entity_ids, 0)
        for b in range(s.batch_size):
            for k, sentence in enumerate(s.step_mention_repeats[b].tolist()):
                in_sentence = ids[b][s.sentence_id[b].eq(k) & s.mask[b]]
                most = max([int(in_sentence.eq(e).sum()) for e in range(1, 4)])
                assert sentence == most


def test_batch_documents_in_chunks_sorts_by_chunks(make_row, tiny_spec):
    rows = [make_row(f"d{n}", [[5] * n] * 2) for n in (9, 1, 5)]  # 2 sentences of n + 1 positions
    batches = list(batch_documents(rows, tiny_spec, 1, seed=None, layout=ChunkLayout(4)))
    assert [b.doc_ids for b in batches] == [["d1"], ["d5"], ["d9"]]
    assert [len(b.sentences) for b in batches] == [1, 3, 5]


def test_pack_rows_balances_longest_first_and_keeps_the_given_order():
    assert pack_rows([5, 9, 4, 4], 2) == [[1, 3], [0, 2]]  # 9 | 5, then 4 to the 5 (9 | 9), then 4 to row 0
    assert pack_rows([3, 3], 4) == [[0], [1]]  # never an empty row
    assert sorted(i for row in pack_rows(list(range(1, 30)), 4) for i in row) == list(range(29))


def test_packed_rows_read_several_documents_a_row(make_row, tiny_spec):
    # positions (words + 1 a sentence): d0 4, d1 2 + 3, d2 9, d3 3
    rows = [make_row("d0", [[5, 6, 7]]), make_row("d1", [[8], [9, 10]]), make_row("d2", [[5] * 8]),
            make_row("d3", [[6, 7]])]
    layout = ChunkLayout(4, pack_documents=True)
    batch = collate_documents(rows, tiny_spec, layout, num_rows=2)  # rows: d2 d3 (9 + 3) | d0 d1 (4 + 5)
    assert batch.batch_size == 2 and batch.num_documents == 4 and batch.doc_ids == ["d2", "d3", "d0", "d1"]
    assert [s.lengths.tolist() for s in batch.sentences] == [[4, 4], [4, 4], [4, 1]]
    assert batch.num_tokens == 21 and batch.num_padded == 3
    for row, expected in ((0, [0, 9]), (1, [0, 4])):  # where each row's documents begin
        starts = torch.cat([s.doc_start[row, : int(s.lengths[row])] for s in batch.sentences])
        assert starts.nonzero().flatten().tolist() == expected
    assert [s.reset_columns.tolist() for s in batch.sentences] == [[0], [0], [1]]
    assert batch.sentences[1].sentence_id[1].tolist() == [0, 0, 1, 1]  # d1's two sentences
    assert batch.sentences[1].step_sentence_lengths.tolist() == [[4, 0], [2, 2]]  # row 0: d2's one sentence
    assert len(batch.sentences) == packed_steps([r["sentence_lengths"] for r in rows], 2, layout)
    unpacked = collate_documents(rows, tiny_spec, ChunkLayout(4))
    assert unpacked.batch_size == 4 and unpacked.num_padded > batch.num_padded
    grouped = list(batch_documents(rows, tiny_spec, 2, seed=3, layout=layout))
    assert len(grouped) == 1 and sorted(grouped[0].doc_ids) == ["d0", "d1", "d2", "d3"]


def test_sliced_and_selected_steps_keep_their_sentence_extents(make_row, tiny_spec):
    """Dynamic evaluation cuts a document's step into segments at sentence ends (slice_columns)
    after taking its row (select_rows): the per-sentence extents a whole-sentence model reads
    must follow, as must the columns where a document starts."""
    from dynlm.modules.fast_weights import select_rows, slice_columns

    rows = [make_row("a", [[5, 6, 7], [8], [9, 10]]), make_row("b", [[6]])]  # a: 4 + 2 + 3 positions, b: 2
    step = collate_documents(rows, tiny_spec, ChunkLayout(9, whole_sentences=True)).sentences[0]
    assert step.step_sentence_lengths.tolist() == [[4, 2, 3], [2, 0, 0]]
    row_a = select_rows(step, [0])
    assert row_a.step_sentence_lengths.tolist() == [[4, 2, 3]] and row_a.reset_columns.tolist() == [0]
    first, rest = slice_columns(row_a, 0, 4), slice_columns(row_a, 4, 9)
    assert first.step_sentence_lengths.tolist() == [[4, 0, 0]] and first.reset_columns.tolist() == [0]
    assert rest.step_sentence_lengths.tolist() == [[0, 2, 3]] and rest.reset_columns.tolist() == []
    assert slice_columns(row_a, 4, 6).step_sentence_lengths.tolist() == [[0, 2, 0]]
    assert select_rows(step, [1]).step_mention_repeats.tolist() == step.step_mention_repeats[1:].tolist()


def test_packed_batches_do_not_depend_on_the_order_rows_arrive_in(random_rows, tiny_spec):
    rows = random_rows(9, seed=6)
    layout = ChunkLayout(6, pack_documents=True)
    first = next(batch_documents(rows, tiny_spec, 3, seed=5, layout=layout))
    again = next(batch_documents(list(reversed(rows)), tiny_spec, 3, seed=5, layout=layout))
    assert first.doc_ids == again.doc_ids
    assert all(torch.equal(a.tokens, b.tokens) for a, b in zip(first.sentences, again.sentences))
