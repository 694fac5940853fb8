"""LitBank for the benchmarks: the anonymized-LM data of ``../shared/data/litbank/conll``,
prepared by the library (the LM task's stages in this process, :func:`dynlm.tasks.local.prepare_local`).

The options are the LM data config's (``data.*``): entity chains per document (later ones
truncated, their words kept), the train vocabulary, the hash split of the documents, and the
two cuts ``data.max_sentence_tokens`` (long sentences cut into pieces) and
``data.max_document_sentences`` (the first N sentences of every document), both applied after
anonymization. The prepared folder lands in ``runs/prepared/<key>/`` and is reused by the next run
with the same options.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.common import PREPARED_ROOT, SHARED_DATA
from dynlm.data.config import DataConfig
from dynlm.data.prepared import PreparedData
from dynlm.tasks.local import SPLITS, prepare_local

DEFAULT_DATA = SHARED_DATA / "litbank" / "conll"
# the perplexities a LitBank benchmark reports, with their column titles (dynlm.tasks.lm_evaluation.evaluate_lm)
METRICS = (("ppl", "overall"), ("ppl_first_mention", "first mention"),
           ("ppl_reappearing", "re-appearing entity"), ("ppl_after_entity", "after entity"))


def add_litbank_args(parser: argparse.ArgumentParser, *, max_sentences: int) -> None:
    """The data options of :func:`litbank_data_config`; ``max_sentences`` is the benchmark's default."""
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help="folder of LitBank *.conll files")
    parser.add_argument("--max-chains", type=int, default=50, help="entity identifiers per document (later chains truncated)")
    parser.add_argument("--vocab-size", type=int, default=2000)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--valid-fraction", type=float, default=0.1)
    parser.add_argument("--test-fraction", type=float, default=0.1)
    parser.add_argument("--max-sentence-len", type=int, default=60,
                        help="longer sentences are cut into pieces (data.max_sentence_tokens; 0: keep)")
    parser.add_argument("--max-sentences", type=int, default=max_sentences,
                        help="keep the first N sentences of every document, all splits (data.max_document_sentences; "
                             "0: all; LitBank has ~100)")


def litbank_data_config(args: argparse.Namespace) -> DataConfig:
    """The LM data config of :func:`add_litbank_args`' options: CoNLL files, no BPE merges, the
    entity chains beyond ``--max-chains`` truncated (their words kept)."""
    return DataConfig(inputs=[str(args.data_dir)], format="conll", vocab_size=args.vocab_size, bpe_merges=0,
                      max_chains=args.max_chains, too_many_chains="truncate", split_seed=args.split_seed,
                      valid_fraction=args.valid_fraction, test_fraction=args.test_fraction,
                      max_sentence_tokens=args.max_sentence_len, max_document_sentences=args.max_sentences,
                      output_root=str(PREPARED_ROOT))


def prepare_litbank(args: argparse.Namespace) -> tuple[PreparedData, dict[str, list[dict]]]:
    """The prepared folder of :func:`add_litbank_args`' options (built, or reused) and its
    encoded rows by split.

    Raises:
        SystemExit: no ``*.conll`` file in ``--data-dir`` (LitBank absent), or an empty split.
    """
    if not any(Path(args.data_dir).glob("*.conll")):
        raise SystemExit(f"no *.conll files in {args.data_dir}")
    prepared = prepare_local(litbank_data_config(args), task="lm")
    rows = {split: list(prepared.iter_rows(split)) for split in SPLITS}
    for split, split_rows in rows.items():
        if not split_rows:
            raise SystemExit(f"split {split!r} is empty: change --split-seed or the fractions")
    return prepared, rows


def split_sizes(rows: dict[str, list[dict]]) -> dict[str, int]:
    """``<split>_documents`` and ``<split>_tokens`` of every split (what a report's data line says)."""
    sizes = {}
    for split, split_rows in rows.items():
        sizes[f"{split}_documents"] = len(split_rows)
        sizes[f"{split}_tokens"] = sum(row["num_tokens"] for row in split_rows)
    return sizes
