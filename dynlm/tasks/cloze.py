"""The cloze reading-comprehension task: the SAW Reader (Zhang et al., 2018), a gated-attention
reader (Dhingra et al., 2017) over subword-augmented embeddings, on CMRC-2017 and CBT.

=================== ==================================================================
parse_files         :func:`dynlm.tasks.cloze_data.parse_files` (one row per question; malformed ones quarantined)
count_train         word counts of the train documents and queries
fit_preprocessor    :class:`dynlm.data.preprocessor.Preprocessor`: vocabulary, short list γ, exactly ``bpe_merges`` merges
encoder             :class:`dynlm.tasks.cloze_data.EncodeQuestions`
collate / batches   :class:`dynlm.tasks.cloze_data.QuestionBatch` (documents of similar length together)
build_model         :class:`dynlm.models.ga_reader.GAReader` (registered as ``dynlm-saw``)
loss                −log P(answer) by attention-sum, mean over the batch's questions
evaluate / metrics  :class:`dynlm.tasks.cloze_metrics.ClozeMetrics`; primary ``error`` = 1 − accuracy
metric_table        accuracy overall, on OOV-answer questions, per answer class
serve               ``{document, query[, candidates]}`` rows -> the answer and its probability
=================== ==================================================================
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from dynlm.data.cbt import ANSWER_CLASSES
from dynlm.data.preprocessor import Preprocessor
from dynlm.models.ga_reader import GAReader, GAReaderConfig, answer_nll
from dynlm.tasks.base import ObjectiveDisplay, Task
from dynlm.tasks.cloze_data import (
    ENCODED_SCHEMA,
    PARSED_SCHEMA,
    PAYLOAD_COLUMNS,
    ClozeDataConfig,
    EncodeQuestions,
    QuestionBatch,
    batch_questions,
    collate_questions,
    count_train,
    encode_question,
    fit_preprocessor,
    inactive_row,
    parse_files,
)
from dynlm.tasks.cloze_metrics import ClozeMetrics
from dynlm.training import StepLoss, model_device, unwrap_model
from dynlm.vocab_spec import VocabSpec


def _cell(value: float) -> str:
    return "n/a" if isinstance(value, float) and math.isnan(value) else f"{100 * value:.2f}"


def format_cloze_table(metrics: dict, title: str) -> str:
    """``dynlm evaluate``'s table: accuracy (%) overall, on OOV-answer questions, per answer class."""
    rows = [("all questions", metrics["questions"], metrics["accuracy"]),
            ("answer out of vocabulary", metrics["oov_questions"], metrics["oov_accuracy"])]
    rows += [(f"answer class {c}", metrics[f"{c}_questions"], metrics[f"{c}_accuracy"])
             for c in ANSWER_CLASSES if metrics[f"{c}_questions"]]
    lines = [title, f"{'questions':<28}{'count':>8}{'accuracy %':>12}"]
    lines += [f"{label:<28}{int(count):>8,d}{_cell(acc):>12}" for label, count, acc in rows]
    lines.append(f"{'mean -log P(answer)':<28}{'':>8}{metrics['loss']:>12.4f}")
    return "\n".join(lines)


def accuracy_percent(error: float) -> float:
    """The accuracy in % of an ``error`` (1 - accuracy), as the search figure plots it."""
    return 100.0 * (1.0 - error)


class ClozeTask(Task):
    """Cloze reading comprehension (module docstring)."""

    name: ClassVar[str] = "cloze"
    parsed_schema = PARSED_SCHEMA
    payload_columns = PAYLOAD_COLUMNS
    encoded_schema = ENCODED_SCHEMA
    data_config = ClozeDataConfig
    model_config = GAReaderConfig
    metrics = ClozeMetrics
    primary_metric = "error"
    # benchmarks/results/saw_cmrc2017.md: the GA reader trains with a loose clip (its attention
    # sums start large) and batches of 32 questions
    train_defaults = {"grad_clip": 5.0, "batch_size": 32}
    spec_class = VocabSpec
    encoder = EncodeQuestions

    parse_files = staticmethod(parse_files)
    count_train = staticmethod(count_train)

    # ----------------------------------------------------------------------------- prepare
    def fit_preprocessor(self, counts: dict[str, int], data_cfg: ClozeDataConfig) -> Preprocessor:
        return fit_preprocessor(counts, data_cfg)

    def load_preprocessor(self, text: str) -> Preprocessor:
        return Preprocessor.from_json(text)

    def derive_preprocessor(self, preprocessor: Preprocessor, data_cfg: ClozeDataConfig) -> Preprocessor:
        return preprocessor.with_gamma(data_cfg.gamma)  # same encoding, another short list

    def summary_lines(self, counts: dict) -> list[tuple[str, str]]:
        return [("quarantined questions", f"{counts['quarantined']:,d}")]

    def objective_display(self) -> ObjectiveDisplay:
        """The search figure shows accuracy (%), not the error the search minimises."""
        return ObjectiveDisplay("valid accuracy (%)", accuracy_percent)

    # ---------------------------------------------------------------------------- training
    def model_name(self, model_cfg) -> str:
        return "saw"

    def collate(self, rows, spec) -> QuestionBatch:
        return collate_questions(rows, spec)

    def batches(self, rows, spec, batch_size, *, sort_by_length=True, seed=0, layout=None):  # one layout
        return batch_questions(rows, spec, batch_size, sort_by_length=sort_by_length, seed=seed)

    def pad_batch(self, batch, size: int, spec):
        return collate_questions([inactive_row()], spec) if batch is None else batch  # one step per batch

    def build_model(self, model_cfg: GAReaderConfig, spec: VocabSpec) -> torch.nn.Module:
        return GAReader(model_cfg, spec)

    def loss(self, model, chunk: QuestionBatch, state) -> StepLoss:
        """−log P(answer) by attention-sum: (mean over the batch's questions, its detached sum, questions)."""
        inputs = chunk.inputs.to(model_device(model))
        nll_sum, count = answer_nll(model(inputs), inputs.answer)  # model: [B, C] log P(candidate)
        return StepLoss(nll_sum / max(count, 1), nll_sum.detach(), count)

    def evaluate(self, model, batches) -> dict:
        core = unwrap_model(model)
        core.eval()
        metrics, device = ClozeMetrics(), model_device(model)
        with torch.no_grad():
            for batch in batches:
                inputs = batch.inputs.to(device)
                metrics.update(core(inputs).cpu(), inputs.answer.cpu(), batch.answer_oov, batch.answer_classes)
        return metrics.compute()

    # ------------------------------------------------------------------------------ report
    def metric_table(self, metrics: dict, title: str) -> str:
        return format_cloze_table(metrics, title)

    # ----------------------------------------------------------------------------- serving
    serving_inputs = (("document", "string"), ("query", "string"), ("candidates", "list<string>"))
    serving_outputs = (("row", "long"), ("answer", "string"), ("probability", "double"))
    serving_example = {"document": ["Ann met Bob . Bob gave Ann a book ."], "query": ["XXXXX gave Ann a book ."]}

    def serve(self, model, model_cfg, spec, preprocessor, request) -> list[dict]:
        """One question per row: ``document`` and ``query`` (whitespace-tokenized text; the query's
        blank is ``XXXXX``), ``candidates`` optional (default: every word of the document) ->
        the most probable candidate and its probability."""
        from dynlm.requests import InputError, request_frame

        frame = request_frame(request, columns=("document", "query", "candidates"), required_any=("document",),
                              rows_are="questions", hint="give one question per row: 'document' and 'query' text")
        rows = []
        for index, record in enumerate(frame.to_dict("records")):
            document, query = record.get("document"), record.get("query")
            candidates = record.get("candidates")
            candidates = [] if candidates is None or (isinstance(candidates, float) and math.isnan(candidates)) \
                else list(candidates)
            if not isinstance(document, str) or not document.split():
                raise InputError(f"row {index}: 'document' must be non-empty text")
            if not isinstance(query, str) or not query.split():
                raise InputError(f"row {index}: 'query' must be non-empty text")
            if not all(isinstance(c, str) and c for c in candidates):
                raise InputError(f"row {index}: 'candidates' must be a list of words")
            tokens = document.split()
            if candidates and not set(candidates) & set(tokens):
                raise InputError(f"row {index}: no candidate occurs in the document")
            encoded = encode_question(preprocessor, {"document": tokens, "query": query.split(),
                                                     "candidates": candidates, "answer": ""})
            rows.append({**encoded, "answer_class": ""})
        batch = collate_questions(rows, spec)
        core = unwrap_model(model)
        core.eval()
        with torch.no_grad():
            log_probs = core(batch.inputs.to(model_device(model))).cpu()
        best = log_probs.argmax(dim=1).tolist()
        return [{"row": i, "answer": batch.candidates[i][k], "probability": math.exp(float(log_probs[i, k]))}
                for i, k in enumerate(best)]


__all__ = ["ClozeTask", "format_cloze_table"]
