"""WikiText-2 articles for the benchmarks, prepared by the library.

A benchmark picks its articles (the first N of a split: :func:`read_articles`, the library's text
reader, level-1 headings start an article); :func:`prepare_articles` writes them as Parquet
files of documents (``<split>.parquet``, which name their split) and prepares those with the LM
task's stages in this process (:func:`dynlm.tasks.local.prepare_local`): the vocabulary fitted
on the train split, ``data.max_document_sentences`` paragraphs kept per article, no entity
chains, no BPE merges. The folder lands in ``runs/prepared/<key>/`` (reused by the next run that
picks the same articles).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import PREPARED_ROOT, SHARED_DATA
from dynlm.data.config import DataConfig
from dynlm.data.prepared import PreparedData
from dynlm.data.readers import parse_file
from dynlm.data.schema import DOCUMENT_SCHEMA
from dynlm.tasks.local import prepare_local

DATA = SHARED_DATA / "wikitext-2"


def read_articles(split: str, limit: int, data_dir: Path = DATA) -> list[dict]:
    """The first ``limit`` articles of ``<data_dir>/<split>.txt.gz`` as documents (DOCUMENT_SCHEMA
    dicts: one sentence per paragraph), in the file's order.

    Raises:
        SystemExit: the file is absent (WikiText-2 is not in ``../shared/data``).
    """
    path = Path(data_dir) / f"{split}.txt.gz"
    if not path.is_file():
        raise SystemExit(f"{path} not found: WikiText-2 is needed here (see {DATA / 'SOURCE.md'})")
    documents = [item for item in parse_file(path.read_bytes(), str(path), "text") if isinstance(item, dict)]
    return documents[:limit]


def prepare_articles(articles: dict[str, list[dict]], *, vocab_size: int, max_lines: int,
                     preprocessor: Any = None) -> PreparedData:
    """The prepared folder of ``{split: articles}`` (built, or reused).

    Args:
        articles: documents of :func:`read_articles` per split (``train`` at least; its words give
            the vocabulary unless ``preprocessor`` is given).
        vocab_size: most frequent train words kept (``data.vocab_size``); the rest read ``<unk>``.
        max_lines: paragraphs kept per article (``data.max_document_sentences``; 0: all).
        preprocessor: encode with this one (another folder's) instead of fitting one.
    """
    with tempfile.TemporaryDirectory(prefix="wikitext_articles_") as folder:
        for split, documents in articles.items():
            table = pa.Table.from_pylist([{**document, "mentions": []} for document in documents],
                                         schema=DOCUMENT_SCHEMA)
            pq.write_table(table, Path(folder) / f"{split}.parquet")
        data_cfg = DataConfig(inputs=[folder], vocab_size=vocab_size, gamma=1.0, bpe_merges=0, max_chains=1,
                              max_document_sentences=max_lines, output_root=str(PREPARED_ROOT))
        return prepare_local(data_cfg, task="lm", preprocessor=preprocessor)


def rows_in_order(prepared: PreparedData, split: str, articles: list[dict]) -> list[dict]:
    """The encoded rows of ``split`` in the order of ``articles`` (a prepared split is sorted by
    document id: ``doc_10`` before ``doc_2``)."""
    position = {article["doc_id"]: index for index, article in enumerate(articles)}
    return sorted(prepared.iter_rows(split), key=lambda row: position[row["doc_id"]])
