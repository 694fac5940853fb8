"""Dynamic evaluation, the LM task's second way of evaluating (``dynlm evaluate --dynamic-eval``).

:class:`dynlm.tasks.lm.LMTask` delegates here. The algorithm itself is :mod:`dynlm.dynamic_eval`
(Krause et al., 2018: every segment of a document is scored, then the weights take a step on it;
they are reset at the start of each document). This module is the LM side around it: encoded
document rows become batches, the gradient statistics are collected on training documents, eta and
lambda are picked on validation documents when asked (``eta="auto"``), the evaluation documents are
scored, and :func:`dynamic_evaluation_text` formats the result as ``dynlm evaluate`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from torch import nn

from dynlm.config import Config, ConfigError
from dynlm.data.batching import batch_documents
from dynlm.dynamic_eval import (
    DEFAULT_ETAS,
    DEFAULT_LAMBDAS,
    DynamicEvalConfig,
    choose_dynamic_eval,
    collect_grad_stats,
    dynamic_evaluate,
)
from dynlm.tasks.lm_table import format_metrics_table
from dynlm.vocab_spec import VocabSpec


@dataclass
class DynamicEvalOptions(Config):
    """The settings of ``dynlm evaluate --dynamic-eval``, one field per flag of the same name.

    Attributes:
        eta: the step size, or ``"auto"``: the best (lowest validation loss) of the grid
            ``DEFAULT_ETAS`` x lambdas, each point read over the validation documents.
        lam: lambda, the pull back towards the trained weights. None: the grid
            ``DEFAULT_LAMBDAS`` with ``eta="auto"``, else :class:`DynamicEvalConfig`'s default.
        eps: added to the RMS gradient statistics.
        segment_len: tokens per update (a model that reads whole sentences, the DNTM: the
            sentences that hold at least this many).
        stats_segments: training segments read for the gradient statistics.
        batch_size: documents collated at a time. Each document is still read on its own, so
            the metrics do not depend on it.
    """

    eta: float | Literal["auto"] = "auto"
    lam: float | None = None
    eps: float = 1e-3
    segment_len: int = 20
    stats_segments: int = 200
    batch_size: int = 16

    def validate(self) -> None:
        if self.eta != "auto" and self.eta < 0:
            raise ConfigError(f"eta: must be >= 0 or 'auto', got {self.eta}")
        if self.lam is not None and self.lam < 0:
            raise ConfigError(f"lam: must be >= 0, got {self.lam}")
        if self.eps <= 0:
            raise ConfigError(f"eps: must be > 0, got {self.eps}")
        for key in ("segment_len", "stats_segments", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}: must be at least 1, got {getattr(self, key)}")

    @property
    def eta_picked_on_valid(self) -> bool:
        return self.eta == "auto"


def dynamic_evaluate_lm(model: nn.Module, spec: VocabSpec, rows: Sequence[dict], *, stats_rows: Sequence[dict],
                        valid_rows: Sequence[dict], options: DynamicEvalOptions) -> dict:
    """Dynamic evaluation of the encoded documents ``rows`` (in order) by ``model``.

    1. The RMS gradient statistics come from ``stats_rows`` (training documents, read as the
       evaluation documents are: :func:`~dynlm.dynamic_eval.collect_grad_stats`, at most
       ``options.stats_segments`` segments).
    2. With ``options.eta == "auto"`` every point of the eta x lambda grid reads all of
       ``valid_rows``; the lowest validation loss wins. Otherwise eta and lambda are used as given
       and ``valid_rows`` is not read (it may be empty).
    3. ``rows`` are scored with that setting; the model's weights are restored afterwards.

    Args:
        model: a trained LM (:mod:`dynlm.models`), unwrapped.
        spec: the vocabulary spec the rows were encoded with.
        rows, stats_rows, valid_rows: encoded document rows (the prepared folder's schema).
        options: the settings (:class:`DynamicEvalOptions`).

    Returns:
        A JSON-able dict: ``eta``, ``lambda``, ``eps``, ``segment_len`` (the setting used),
        ``eta_picked_on_valid``, ``grid`` (``[{"eta", "lambda", "ppl", "loss"}]`` in grid order
        with ``eta="auto"``, else None) and ``metrics`` (as :meth:`LMTask.evaluate`'s: ``ppl``,
        ``loss``, ``tokens``, the per-category perplexities and sums).

    Raises:
        ValueError: no training documents, or ``eta="auto"`` without validation documents.
    """
    if not stats_rows:
        raise ValueError("dynamic evaluation: no training documents for the gradient statistics")
    stats = collect_grad_stats(model, batch_documents(stats_rows, spec, options.batch_size, seed=0),
                               segment_len=options.segment_len, max_segments=options.stats_segments)
    grid = None
    if options.eta_picked_on_valid:
        if not valid_rows:
            raise ValueError("dynamic evaluation: eta 'auto' needs validation documents")
        lambdas = DEFAULT_LAMBDAS if options.lam is None else (options.lam,)
        valid_batches = list(batch_documents(valid_rows, spec, options.batch_size, seed=None))  # read per grid point
        setting, grid = choose_dynamic_eval(model, valid_batches, stats, etas=DEFAULT_ETAS, lambdas=lambdas,
                                            eps=options.eps, segment_len=options.segment_len)
    else:
        lam = DynamicEvalConfig().decay if options.lam is None else options.lam
        setting = DynamicEvalConfig(lr=options.eta, decay=lam, eps=options.eps, segment_len=options.segment_len)
    metrics = dynamic_evaluate(model, batch_documents(rows, spec, options.batch_size, seed=None), setting, stats)
    return {"eta": setting.lr, "lambda": setting.decay, "eps": setting.eps, "segment_len": setting.segment_len,
            "eta_picked_on_valid": options.eta_picked_on_valid, "grid": grid, "metrics": metrics}


def format_grid(grid: list[dict], eta: float, lam: float) -> str:
    """The eta x lambda grid of ``eta="auto"`` (validation perplexity), the pick ``(eta, lam)``
    marked with ``*``."""
    lines = [f"dynamic evaluation: eta/lambda picked on validation ({len(grid)} settings)",
             f"  {'eta':>10}{'lambda':>10}{'valid ppl':>14}"]
    for point in grid:
        mark = " *" if (point["eta"], point["lambda"]) == (eta, lam) else ""
        lines.append(f"  {point['eta']:>10g}{point['lambda']:>10g}{point['ppl']:>14.2f}{mark}")
    return "\n".join(lines)


def dynamic_evaluation_text(result: dict, grid_source: str) -> str:
    """What ``dynlm evaluate --dynamic-eval`` prints for :func:`dynamic_evaluate_lm`'s ``result``:
    the eta x lambda grid and ``grid_source`` (which validation documents it read) when eta was
    picked on them, then the metric table titled with the setting."""
    text = []
    if result["grid"] is not None:
        text += [format_grid(result["grid"], result["eta"], result["lambda"]) + f"\n  ({grid_source})", ""]
    picked = " auto" if result["eta_picked_on_valid"] else ""
    text.append(format_metrics_table(
        result["metrics"], f"dynamic evaluation (eta={result['eta']:g}{picked}, lambda={result['lambda']:g}, "
                           f"eps={result['eps']:g}, segment={result['segment_len']})"))
    return "\n".join(text)
