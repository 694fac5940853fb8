"""The method-naming task: suggest a Python function's name from its body (Allamanis, Barr, Bird,
Sutton, "Suggesting Accurate Method and Class Names", FSE 2015).

Any folder of ``.py`` files is a corpus (the standard library of the running Python by
default in the examples: ``sysconfig.get_paths()["stdlib"]``; test suites and installed
packages are left out by ``data.exclude``). Each function or method is one record
(:mod:`dynlm.data.python_functions`); files are split 70/15/15 by a hash of their path
relative to the input. The models are the log-bilinear name and subtoken models of
:mod:`dynlm.models.naming`, trained with NCE; the metrics are :class:`NamingMetrics` (F1 of the
top suggestion's subtokens, exact match, neologisms, the suggestion-frequency curve).

=================== ==================================================================
parse_files         :func:`dynlm.tasks.naming_data.parse_files` (one row per function; files quarantined)
count_train         :func:`dynlm.tasks.naming_data.count_train` (names, subtokens, features, context)
fit_preprocessor    :meth:`dynlm.tasks.naming_data.NamingVocab.fit`
encoder             :class:`dynlm.tasks.naming_data.EncodeFunctions`
collate / batches   :func:`collate_functions` / :func:`batch_functions` -> :class:`FunctionBatch`
build_model         :func:`dynlm.models.naming.build_naming_model` (registered as ``dynlm-naming``)
loss                mean NCE loss (:func:`dynlm.modules.nce.nce_loss`); train perplexity from ``model.nll``
evaluate / metrics  ``model.suggest`` + ``model.log_prob`` -> :class:`NamingMetrics`; primary ``f1_error``
metric_table        :func:`dynlm.tasks.naming_report.format_naming_table`
metric_figures      ``suggestion_frequency.png`` (F1@1, exact@1 vs suggestion frequency)
suggest_source      a source file's functions with the model's suggested names (``dynlm suggest-name``)
suggestion_summary  F1@1 / exact@1 of those suggestions against the actual names, all and non-dunder
serve               column ``source`` -> one row per function with its suggestions (the served model)
=================== ==================================================================
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from dynlm.data.python_functions import extract_functions, is_dunder
from dynlm.data.subtokens import join_subtokens, name_style, split_subtokens
from dynlm.models.naming import NamingModelConfig, build_naming_model
from dynlm.modules.nce import nce_loss
from dynlm.tasks.base import Task
from dynlm.tasks.naming_data import (
    ENCODED_SCHEMA,
    PARSED_SCHEMA,
    PAYLOAD_COLUMNS,
    EncodeFunctions,
    FunctionBatch,
    NamingDataConfig,
    NamingVocab,
    NamingVocabSpec,
    batch_functions,
    collate_functions,
    count_train,
    inactive_batch,
    parse_files,
)
from dynlm.tasks.naming_metrics import NamingMetrics, subtoken_scores
from dynlm.tasks.naming_report import (
    format_naming_table,
    format_suggestion_summary,
    naming_counts,
    suggestion_frequency_figure,
    suggestion_summary,
    summary_rows,
)
from dynlm.training import StepLoss, model_device, unwrap_model

SUGGESTION_FIGURE = "suggestion_frequency.png"


class SuggestionReader:
    """Reads a model's suggestions (ids) as subtoken-string tuples, with the train names."""

    def __init__(self, spec: NamingVocabSpec):
        self.spec = spec
        self.known_names = {tuple(name.split("_")) for name in spec.train_names}

    def subtokens(self, ids: tuple[int, ...], model_type: str) -> tuple[str, ...]:
        """A suggestion's ids (``(name_id,)`` of the name model, subtoken ids of the subtoken
        model) as its subtokens."""
        if model_type == "name":
            return tuple(self.spec.names[ids[0]].split("_"))
        return tuple(self.spec.subtokens[i] for i in ids)


def score_suggestions(suggester, model_type: str, batches, *, top_k: int, device=None) -> dict:
    """:class:`NamingMetrics` of any suggester over :class:`FunctionBatch` es: a naming model,
    or the :class:`dynlm.models.naming_baseline.FrequencyBaseline` (``model_type`` "name").

    Args:
        suggester: has ``suggest(NamingBatch, top_k=...)`` and ``log_prob(NamingBatch)``.
        model_type: ``name`` (suggestions are name ids) or ``subtoken`` (subtoken ids).
        device: where the batches go (None: where they are).
    """
    metrics, reader = NamingMetrics(), None
    with torch.no_grad():
        for batch in batches:
            if reader is None or reader.spec is not batch.spec:
                reader = SuggestionReader(batch.spec)
            inputs = batch.inputs if device is None else batch.inputs.to(device)
            ranked = [[(reader.subtokens(ids, model_type), log_p) for ids, log_p in row]
                      for row in suggester.suggest(inputs, top_k=top_k)]
            metrics.update(ranked, batch.truths, suggester.log_prob(inputs).tolist(), reader.known_names,
                           dunders=batch.dunders)
    return metrics.compute()


class NamingTask(Task):
    """Method naming over Python source (module docstring)."""

    name: ClassVar[str] = "naming"
    parsed_schema = PARSED_SCHEMA
    payload_columns = PAYLOAD_COLUMNS
    encoded_schema = ENCODED_SCHEMA
    data_config = NamingDataConfig
    model_config = NamingModelConfig
    metrics = NamingMetrics
    primary_metric = "f1_error"
    # benchmarks/results/naming_stdlib.md: the LBL and subtoken models, 64 functions a batch
    train_defaults = {"lr": 0.005, "grad_clip": 5.0, "batch_size": 64}
    spec_class = NamingVocabSpec
    encoder = EncodeFunctions

    parse_files = staticmethod(parse_files)
    count_train = staticmethod(count_train)

    # ----------------------------------------------------------------------------- prepare
    def fit_preprocessor(self, counts: dict[str, int], data_cfg: NamingDataConfig) -> NamingVocab:
        return NamingVocab.fit(counts, data_cfg)

    def load_preprocessor(self, text: str) -> NamingVocab:
        return NamingVocab.from_json(text)

    def evaluation_data_config(self, preprocessor: NamingVocab, inputs) -> NamingDataConfig:
        """The vocabulary's context size; the default file filter."""
        return NamingDataConfig(inputs=list(inputs), max_context_size=preprocessor.max_context_size,
                                max_features_per_function=preprocessor.max_features_per_function)

    def summarize(self, meta, split_stats, preprocessor) -> dict:
        return {**super().summarize(meta, split_stats, preprocessor), **naming_counts(meta, preprocessor)}

    def summary_lines(self, counts: dict) -> list[tuple[str, str]]:
        return summary_rows(counts)

    # ---------------------------------------------------------------------------- training
    def collate(self, rows, spec) -> FunctionBatch:
        return collate_functions(rows, spec)

    def batches(self, rows, spec, batch_size, *, sort_by_length=True, seed=0, layout=None):  # one layout
        """Shuffled with ``seed`` (None keeps the order); ``sort_by_length`` has nothing to gain
        (a function is one prediction, its tensors are short) and is ignored."""
        return batch_functions(rows, spec, batch_size, seed=seed)

    def pad_batch(self, batch, size: int, spec):
        return inactive_batch(spec) if batch is None else batch  # one step per batch

    def build_model(self, model_cfg: NamingModelConfig, spec) -> torch.nn.Module:
        return build_naming_model(model_cfg, spec)

    def loss(self, model, chunk: FunctionBatch, state) -> StepLoss:
        """The mean NCE loss over the batch's N prediction events (names, or subtokens and END;
        no event, an inactive batch: 0). What the run reports is the model's normalised −log p
        of the true names (before the step) over the names, so train perplexity is per name, as
        the evaluation's ``ppl``."""
        inputs = chunk.inputs.to(model_device(model))
        with torch.no_grad():
            nll_sum, _ = unwrap_model(model).nll(inputs)
        per_event = nce_loss(model(inputs))  # [N]
        return StepLoss(per_event.sum() / max(per_event.shape[0], 1), nll_sum, chunk.num_documents)

    def evaluate(self, model, batches) -> dict:
        """:class:`NamingMetrics` of ``model.suggest`` (``cfg.top_k`` per function) and
        ``model.log_prob`` over ``batches``."""
        core = unwrap_model(model)
        core.eval()
        return score_suggestions(core, core.cfg.type, batches, top_k=core.cfg.top_k, device=model_device(model))

    # ------------------------------------------------------------------------------ report
    def metric_table(self, metrics: dict, title: str) -> str:
        return format_naming_table(metrics, title)

    def metric_figures(self, metrics: dict, title: str) -> dict:
        return {SUGGESTION_FIGURE: suggestion_frequency_figure(metrics, title)}

    # ----------------------------------------------------------------------------- serving
    # ----------------------------------------------------------------------------- serving
    serving_inputs = (("source", "string"), ("path", "string"))
    serving_outputs = (("row", "long"), ("path", "string"), ("qualname", "string"), ("lineno", "long"),
                       ("name", "string"), ("suggestions", "list<string>"), ("probabilities", "list<double>"))
    serving_example = {"source": ["class Account:\n    def f(self):\n        return self.balance\n"],
                       "path": ["account.py"]}

    def serve(self, model, model_cfg, spec, preprocessor, request) -> list[dict]:
        """One Python source text per row (column ``source``; ``path`` optional, for messages) ->
        one row per function: its request ``row``, ``qualname``, ``lineno``, actual ``name`` and
        the top ``model.top_k`` suggested names with their probabilities."""
        from dynlm.requests import InputError, request_frame

        frame = request_frame(request, columns=("source", "path"), required_any=("source",), rows_are="sources",
                              hint="give one Python source text per row in column 'source' (and its file name in 'path')")
        out = []
        for index, record in enumerate(frame.to_dict("records")):
            source, path = record.get("source"), record.get("path")
            path = path if isinstance(path, str) and path else f"<row {index}>"
            if not isinstance(source, str) or not source.strip():
                raise InputError(f"row {index} ({path}): 'source' must be non-empty Python source text")
            try:
                functions = self.suggest_source(model, model_cfg, preprocessor, source, path=path, top_k=model_cfg.top_k)
            except ValueError as exc:  # does not parse: the reason, one line
                raise InputError(f"row {index}: {str(exc).splitlines()[0]}") from None
            for function in functions:
                names, probabilities = zip(*function["suggestions"]) if function["suggestions"] else ((), ())
                out.append({"row": index, "path": path, "qualname": function["qualname"], "lineno": function["lineno"],
                            "name": function["name"], "suggestions": list(names), "probabilities": list(probabilities)})
        return out

    def suggest_source(self, model, model_cfg: NamingModelConfig, preprocessor: NamingVocab, source: str | bytes,
                       path: str, top_k: int) -> list[dict]:
        """The model's name suggestions for every function of one source file.

        Args:
            model: a naming model (eval mode is set here); model_cfg: its config.
            preprocessor: the vocabulary it was trained with.
            source: the file's text or bytes; path: its name (in error messages).
            top_k: suggestions per function.

        Returns:
            One dict per function, in source order: ``qualname``, ``lineno``, ``name`` (the
            actual one) and ``suggestions``: ``[(name, probability), ...]`` best first, each
            name written in the function's own style (underscores, case: ``_getHttpServer``
            for a ``_camelCase`` method); and how the top suggestion scores against the
            actual name (:class:`NamingMetrics`' rules): ``f1_at_1`` (subtoken F1),
            ``exact_at_1`` (0 or 1; both 0 without a suggestion), ``dunder`` (whether the
            actual name is one: ``__init__``).

        Raises:
            ValueError: the source does not parse (``UnparseableSource``: path and reason).
        """
        records = extract_functions(source, path, max_context_size=preprocessor.max_context_size)
        if not records:
            return []
        spec = preprocessor.spec
        batch = collate_functions([{**record, **preprocessor.encode(record)} for record in records], spec)
        core = unwrap_model(model)
        core.eval()
        reader = SuggestionReader(spec)
        with torch.no_grad():
            ranked = core.suggest(batch.inputs.to(model_device(model)), top_k=top_k)
        out = []
        for record, row in zip(records, ranked):
            style = name_style(record["name"])
            subtokens = [reader.subtokens(ids, model_cfg.type) for ids, _ in row]
            suggestions = [(join_subtokens(words, style), math.exp(log_p)) for words, (_, log_p) in zip(subtokens, row)]
            truth = tuple(split_subtokens(record["name"]))
            out.append({"qualname": record["qualname"], "lineno": record["lineno"], "name": record["name"],
                        "suggestions": suggestions, "dunder": is_dunder(record["name"]),
                        "f1_at_1": subtoken_scores(tuple(subtokens[0]), truth)[2] if subtokens else 0.0,
                        "exact_at_1": float(bool(subtokens) and tuple(subtokens[0]) == truth)})
        return out

    def suggestion_summary(self, functions: list[dict]) -> str:
        """What ``dynlm suggest-name`` prints after the suggestions: F1@1 and exact@1 of the top
        suggestion against the actual names, over all the functions of :meth:`suggest_source`
        (of every file) and over the non-dunder ones (``__init__``... left out)."""
        return format_suggestion_summary(suggestion_summary(functions))


__all__ = ["NamingTask", "SUGGESTION_FIGURE", "SuggestionReader", "score_suggestions"]
