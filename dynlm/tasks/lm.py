"""The anonymized language-modeling task (rnn / dntm / dynamical models): the first :class:`Task`.

Every member delegates to the library functions the pipelines already use, so the prepared
bytes, the batches and the metrics are those of the LM pipeline (docs/ARCHITECTURE.md, "Tasks"):

=================== ==================================================================
parse_files         :func:`dynlm.data.parse_stage.parse_files` (read -> anonymize -> split)
count_train         :func:`dynlm.data.word_counts.count_train_words`
fit_preprocessor    :meth:`dynlm.data.preprocessor.Preprocessor.fit` (vocabulary, short list, BPE)
encoder             :class:`dynlm.data.batch_encoder.EncodeDocuments`
summarize           :func:`dynlm.tasks.lm_summary.lm_counts` (chains, mentions, OOV, subwords)
collate / batches   :func:`dynlm.data.batching.collate_documents` / ``batch_documents``
batch_layout        sentence lockstep, or chunks of ``train.bptt_tokens`` (:class:`~dynlm.data.batching.ChunkLayout`)
lockstep            sentence steps: :func:`dynlm.distributed.pad_to_steps` / ``dummy_batch``
build_model         :func:`dynlm.models.build_model`
chunks / loss       truncated-BPTT chunks (:func:`dynlm.tasks.lm_evaluation.bptt_chunks`), ``chunk_loss``
evaluate            :func:`dynlm.tasks.lm_evaluation.evaluate_lm` (the paper metrics)
dynamic evaluation  :func:`dynlm.tasks.lm_dynamic_eval.dynamic_evaluate_lm` (Krause et al., ``--dynamic-eval``)
metrics             :class:`dynlm.metrics.MetricAccumulator`
metric_table        :func:`dynlm.tasks.lm_table.format_metrics_table`
metric_figures      :func:`dynlm.tasks.lm_figure.accumulation_figure` (``accumulation.png``)
serve               :func:`dynlm.tasks.lm_serving.parse_input` + ``score_documents`` (the served model)
=================== ==================================================================
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from dynlm.data import batching
from dynlm.data.batch_encoder import EncodeDocuments
from dynlm.data.config import DataConfig
from dynlm.data.parse_stage import PARSED_SCHEMA, parse_files
from dynlm.data.preprocessor import Preprocessor
from dynlm.data.schema import ENCODED_SCHEMA
from dynlm.data.word_counts import count_train_words
from dynlm.distributed import EveryParameterUsed, dummy_batch, pad_to_steps
from dynlm.losses import chunk_loss
from dynlm.metrics import MetricAccumulator
from dynlm.models import build_model, needs_whole_sentences, supports_packed_documents
from dynlm.models.config import ModelConfig
from dynlm.tasks.base import ObjectiveDisplay, Task
from dynlm.tasks.lm_dynamic_eval import DynamicEvalOptions, dynamic_evaluate_lm, dynamic_evaluation_text
from dynlm.tasks.lm_evaluation import bptt_chunks, evaluate_lm, steps_per_chunk
from dynlm.tasks.lm_summary import DROP_ROWS, LM_SUMMARY_ROWS, lm_counts, token_stats
from dynlm.tasks.lm_table import format_metrics_table
from dynlm.training import StepLoss, model_device, unwrap_model
from dynlm.vocab_spec import VocabSpec

ACCUMULATION_FIGURE = "accumulation.png"


class LMTask(Task):
    """Anonymized LM over documents with coreference chains (``<unk1>``, ``<unk2>``, ...)."""

    name: ClassVar[str] = "lm"
    parsed_schema = PARSED_SCHEMA
    payload_columns = ("sentences",)
    encoded_schema = ENCODED_SCHEMA
    data_config = DataConfig
    model_config = ModelConfig
    metrics = MetricAccumulator
    dynamic_evaluation = True  # dynamic_evaluate_documents (Krause et al.), the meta-learned LM's baseline
    dynamic_evaluation_options = DynamicEvalOptions
    primary_metric = "ppl"
    spec_class = VocabSpec
    encoder = EncodeDocuments

    parse_files = staticmethod(parse_files)
    count_train = staticmethod(count_train_words)

    def fit_preprocessor(self, counts: dict[str, int], data_cfg: DataConfig) -> Preprocessor:
        return Preprocessor.fit(counts, data_cfg)

    def evaluation_data_config(self, preprocessor: Preprocessor, inputs) -> DataConfig:
        """The model's entity count; a document with more chains keeps its later ones as words."""
        return DataConfig(inputs=list(inputs), max_chains=preprocessor.max_chains, too_many_chains="truncate")

    def load_preprocessor(self, text: str) -> Preprocessor:
        return Preprocessor.from_json(text)

    def derive_preprocessor(self, preprocessor: Preprocessor, data_cfg: DataConfig) -> Preprocessor:
        return preprocessor.with_gamma(data_cfg.gamma)  # same encoding, another short list

    def shard_stats(self, table, spec) -> dict[str, int]:
        return token_stats(table, spec)

    def summarize(self, meta, split_stats, preprocessor) -> dict:
        return {**super().summarize(meta, split_stats, preprocessor), **lm_counts(meta, split_stats, preprocessor.spec)}

    def summary_lines(self, counts: dict) -> list[tuple[str, str]]:
        rows = [(label, f"{counts[key]:,d}") for key, label in LM_SUMMARY_ROWS]
        rows += [(label, f"{counts[key]:,d}") for key, label in DROP_ROWS if counts[key]] or [("dropped or truncated", "none")]
        return rows + [("quarantined records", f"{counts['quarantined']:,d}"), ("OOV rate (valid)", f"{counts['oov_rate_valid']:.4f}"),
                       ("subwords per word", f"{counts['subwords_per_word']:.3f}")]

    def collate(self, rows, spec) -> batching.DocumentBatch:
        return batching.collate_documents(rows, spec)

    def batch_layout(self, train_cfg, model_cfg: ModelConfig) -> batching.ChunkLayout | None:
        """Chunks of ``train.bptt_tokens`` positions (whole sentences for the DNTM), or None
        (sentence lockstep) when it is 0."""
        if not train_cfg.bptt_tokens:
            return None
        return batching.ChunkLayout(train_cfg.bptt_tokens, whole_sentences=needs_whole_sentences(model_cfg),
                                    pack_documents=train_cfg.pack_documents and supports_packed_documents(model_cfg))

    def evaluation_layout(self, model_cfg: ModelConfig) -> batching.ChunkLayout | None:
        """The meta-learned dynamical LM: chunks of one segment (``segment_len`` positions). Its fast
        weights are updated every ``segment_len`` columns of a batch; in these chunks a column is a
        position of each document, so a document's segments are its own ``segment_len`` tokens,
        as when it is read alone, whatever else is in the batch. In sentence lockstep the columns
        of a padded sentence count too, so the metrics would depend on the batch's other
        documents; it is also about 2x slower on WikiText-2 (each segment spans several sentence
        steps; benchmarks/results/dynamical_wikitext2.md). Every other model: None (any layout
        gives the same metrics)."""
        if model_cfg.type != "dynamical":
            return None
        return batching.ChunkLayout(model_cfg.dynamical.segment_len)

    def batches(self, rows, spec, batch_size, *, sort_by_length=True, seed=0, layout=None):
        return batching.batch_documents(rows, spec, batch_size, sort_by_length=sort_by_length, seed=seed, layout=layout)

    def steps_per_batch(self, batch, train_cfg) -> int:
        return math.ceil(len(batch.sentences) / steps_per_chunk(train_cfg))  # one step per BPTT chunk

    def steps_per_epoch(self, prepared, train_cfg, world_size: int, layout=None) -> int:
        """From the ``sentence_lengths`` column only: documents sorted by steps (sentences, or
        chunks of ``layout``), cut into global batches; each lockstep batch takes the steps of
        its longest document, ``steps_per_chunk`` of them an optimizer step. (A training epoch
        sorts by jittered sizes, ``batching.SIZE_JITTER``: its batches mix neighbouring sizes
        and may take a few steps more than this count, so the cosine schedule may reach its
        floor a few steps before the end.) With
        ``layout.pack_documents``: each rank's documents (every ``world_size``-th, an estimate of
        Ray's split) packed as :func:`~dynlm.data.batching.batch_documents` packs them."""
        import pyarrow.compute as pc

        column = prepared.read_columns("train", ["sentence_lengths"]).column("sentence_lengths")
        if layout is not None and layout.pack_documents:  # one packed batch per group of documents, per rank
            lengths = column.to_pylist()
            batch_size = batching.per_worker_batch_size(train_cfg.batch_size, world_size)
            return max(1, max(batching.packed_steps(lengths[rank::world_size], batch_size, layout)
                              for rank in range(world_size)))
        if layout is None:  # sentences per document, without reading the lengths into Python
            counts = sorted(pc.list_value_length(column).to_pylist())
        else:
            counts = sorted(batching.num_steps(lengths, layout) for lengths in column.to_pylist())  # chunks
        per_step = batching.per_worker_batch_size(train_cfg.batch_size, world_size) * world_size
        stride = steps_per_chunk(train_cfg)
        return max(1, sum(math.ceil(counts[min(i + per_step, len(counts)) - 1] / stride)
                          for i in range(0, len(counts), per_step)))

    def lockstep_size(self, batch) -> int:
        return len(batch.sentences)  # sentence steps

    def pad_batch(self, batch, size: int, spec):
        return dummy_batch(spec, size) if batch is None else pad_to_steps(batch, size)

    def wrap_for_ddp(self, model):
        return EveryParameterUsed(model)  # a chunk without entities leaves the entity modules out

    def model_name(self, model_cfg: ModelConfig) -> str:
        return model_cfg.type  # rnn / dntm / dynamical: dynlm-rnn, dynlm-dntm, dynlm-dynamical

    def build_model(self, model_cfg: ModelConfig, spec):
        return build_model(model_cfg, spec)

    def chunks(self, batch, train_cfg) -> list[list]:
        return bptt_chunks(batch, train_cfg)  # one optimizer step per truncated-BPTT chunk

    def initial_state(self, model, batch):
        return unwrap_model(model).init_state(batch.batch_size, model_device(model))

    def loss(self, model, chunk, state) -> StepLoss:
        """One truncated-BPTT chunk (a list of ``SentenceBatch``): one forward through ``model``
        (DDP.join needs one per chunk), :func:`~dynlm.losses.chunk_loss`; the dynamical LM's
        gate statistics as ``stats``."""
        device = model_device(model)
        chunk = [sentence.to(device, non_blocking=True) for sentence in chunk]
        outputs, state = model(chunk, state)
        loss, nll_sum, count = chunk_loss(outputs, chunk)
        gates = [o.extras["gate_stats"] for o in outputs if "gate_stats" in o.extras]
        stats = {key: torch.stack([g[key] for g in gates]) for key in gates[0]} if gates else None  # [steps]
        return StepLoss(loss, nll_sum, count, state, stats)

    def detach_state(self, model, state):
        return unwrap_model(model).detach_state(state)

    def evaluate(self, model, batches) -> dict:
        return evaluate_lm(model, batches)

    def dynamic_evaluate_documents(self, model, model_cfg: ModelConfig, spec, rows: list[dict], *,
                                   stats_rows: list[dict], valid_rows: list[dict], options: DynamicEvalOptions) -> dict:
        """Dynamic evaluation of encoded ``rows``: gradient statistics from ``stats_rows``, eta and
        lambda picked on ``valid_rows`` with ``options.eta == "auto"`` (:mod:`dynlm.tasks.lm_dynamic_eval`;
        ``model_cfg`` is not needed: the model says how it reads)."""
        return dynamic_evaluate_lm(model, spec, rows, stats_rows=stats_rows, valid_rows=valid_rows, options=options)

    def dynamic_evaluation_text(self, result: dict, grid_source: str) -> str:
        return dynamic_evaluation_text(result, grid_source)

    def objective_display(self) -> ObjectiveDisplay:
        """The search figure: perplexity, one colour per DNTM merge function, and the data axes
        (``bpe_merges``, ``gamma``) when nothing else is searched."""
        return super().objective_display()._replace(label="best valid perplexity", colour_key="model.dntm.merge_fn",
                                                    default_panels=("data.bpe_merges", "data.gamma"))

    serving_inputs = (("text", "string"), ("tokens", "list<list<string>>"))
    serving_outputs = (("tokens", "list<string>"), ("token_log_probs", "list<double>"), ("num_tokens", "long"),
                       ("num_unknown", "long"), ("log_prob", "double"), ("perplexity", "double"))
    serving_example = {"text": ["The old captain walked into the harbour town .\nHe looked at the ships ."]}

    def serve(self, model, model_cfg, spec, preprocessor, request) -> list[dict]:
        """One document per row (column ``text``: raw text, one sentence per line; or ``tokens``:
        a list of sentences) -> per-token log-probabilities and perplexity (:mod:`dynlm.tasks.lm_serving`)."""
        from dynlm.tasks.lm_serving import parse_input, score_documents

        return score_documents(model, model_cfg, spec, preprocessor, parse_input(request))

    def metric_table(self, metrics: dict, title: str) -> str:
        return format_metrics_table(metrics, title)

    def metric_figures(self, metrics: dict, title: str) -> dict:
        from dynlm.tasks.lm_figure import accumulation_figure  # lazy: matplotlib

        return {ACCUMULATION_FIGURE: accumulation_figure(metrics, title)}
