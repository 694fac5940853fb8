"""The anonymized language-modeling task (rnn / dntm / dynamical models): the first :class:`Task`.

Every member delegates to the library functions the pipelines already use, so the prepared
bytes, the batches and the metrics are those of the LM pipeline (docs/ARCHITECTURE.md, "Tasks"):

=================== ==================================================================
parse_files         :func:`dynlm.data.parse_stage.parse_files` (read -> anonymize -> split)
count_train         :func:`dynlm.data.word_counts.count_train_words`
fit_preprocessor    :meth:`dynlm.data.preprocessor.Preprocessor.fit` (vocabulary, short list, BPE)
encoder             :class:`dynlm.data.batch_encoder.EncodeDocuments`
collate / batches   :func:`dynlm.data.batching.collate_documents` / ``batch_documents``
build_model         :func:`dynlm.models.build_model`
loss                :func:`dynlm.losses.chunk_loss`
train_step/evaluate :func:`dynlm.training.train_step` / ``evaluate``
metrics             :class:`dynlm.metrics.MetricAccumulator`
metric_table        :func:`dynlm.tasks.lm_table.format_metrics_table`
metric_figures      :func:`dynlm.tasks.lm_figure.accumulation_figure` (``accumulation.png``)
=================== ==================================================================
"""

from __future__ import annotations

from typing import ClassVar

from dynlm.data import batching
from dynlm.data.batch_encoder import EncodeDocuments
from dynlm.data.config import DataConfig
from dynlm.data.parse_stage import PARSED_SCHEMA, parse_files
from dynlm.data.preprocessor import Preprocessor
from dynlm.data.schema import ENCODED_SCHEMA
from dynlm.data.word_counts import count_train_words
from dynlm.losses import chunk_loss
from dynlm.metrics import MetricAccumulator
from dynlm.models import build_model
from dynlm.models.config import ModelConfig
from dynlm.tasks.base import Task
from dynlm.tasks.lm_table import format_metrics_table
from dynlm import training

ACCUMULATION_FIGURE = "accumulation.png"


class LMTask(Task):
    """Anonymized LM over documents with coreference chains (``<unk1>``, ``<unk2>``, ...)."""

    name: ClassVar[str] = "lm"
    parsed_schema = PARSED_SCHEMA
    encoded_schema = ENCODED_SCHEMA
    data_config = DataConfig
    model_config = ModelConfig
    metrics = MetricAccumulator
    primary_metric = "ppl"
    encoder = EncodeDocuments

    parse_files = staticmethod(parse_files)
    count_train = staticmethod(count_train_words)

    def fit_preprocessor(self, counts: dict[str, int], data_cfg: DataConfig) -> Preprocessor:
        return Preprocessor.fit(counts, data_cfg)

    def load_preprocessor(self, text: str) -> Preprocessor:
        return Preprocessor.from_json(text)

    def collate(self, rows, spec) -> batching.DocumentBatch:
        return batching.collate_documents(rows, spec)

    def batches(self, rows, spec, batch_size, *, sort_by_length=True, seed=0):
        return batching.batch_documents(rows, spec, batch_size, sort_by_length=sort_by_length, seed=seed)

    def build_model(self, model_cfg: ModelConfig, spec):
        return build_model(model_cfg, spec)

    def loss(self, outputs, batch):
        """``outputs``: the ``LMOutput`` list of one BPTT chunk; ``batch``: its ``SentenceBatch`` list."""
        return chunk_loss(outputs, batch)

    def train_step(self, model, batch, optimizer, train_cfg, *, scheduler=None) -> dict:
        return training.train_step(model, batch, optimizer, train_cfg, scheduler=scheduler)

    def evaluate(self, model, batches) -> dict:
        return training.evaluate(model, batches)

    def metric_table(self, metrics: dict, title: str) -> str:
        return format_metrics_table(metrics, title)

    def metric_figures(self, metrics: dict, title: str) -> dict:
        from dynlm.tasks.lm_figure import accumulation_figure  # lazy: matplotlib

        return {ACCUMULATION_FIGURE: accumulation_figure(metrics, title)}
