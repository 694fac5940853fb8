"""The model role of a :class:`dynlm.tasks.Task`: build the model, compute a chunk's loss,
evaluate.

The step itself is the loop's (:func:`dynlm.training.train_step`: ``zero_grad``, autocast,
``backward``, accumulation, clipping, the optimizer and schedule steps); a task cuts a batch
into chunks and computes one chunk's loss. A task author writes (required): ``model_config``,
``metrics``, ``build_model`` and ``loss``; ``evaluate`` by default sums the loss's NLL over the
batches (``metrics.from_nll``: :class:`dynlm.metrics.NllSums` has it). The state members are for
a task whose batch takes several chunks (the LM's truncated BPTT).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Iterable

import torch


class TaskModel(ABC):
    """The model role (module docstring).

    Attributes:
        model_config: strict config class of the ``model:`` section (``build_model``'s argument).
        metrics: accumulator class: ``()``, ``merge(other)``, ``as_tensor(device) -> 1-D float64``
            (all-reduce it with SUM), ``from_tensor(t)``, ``from_metrics(dict)`` (inverse of
            ``compute`` on its sums) and ``compute() -> dict``; ``from_nll(nll_sum, count)`` for
            the default :meth:`evaluate`.
        primary_metric: key of ``evaluate``'s dict that early stopping and promotion compare
            (lower is better).
        train_defaults: the task's best-known ``train:`` settings where they differ from
            :class:`dynlm.train_config.TrainConfig`'s (the language models'); a job's ``train:``
            section overrides them key by key.
        dynamic_evaluation: True when :meth:`dynamic_evaluate_documents` can adapt the task's
            models while they read (``dynlm evaluate --dynamic-eval``: the LM's); the command
            calls it (and ``dynamic_evaluation_text``) only then.
        dynamic_evaluation_options: the strict config class of its settings (the LM's
            :class:`dynlm.tasks.lm_dynamic_eval.DynamicEvalOptions`: eta, lam, eps ...).
    """

    name: ClassVar[str]
    model_config: ClassVar[type]
    metrics: ClassVar[type]
    primary_metric: ClassVar[str] = "ppl"
    train_defaults: ClassVar[dict[str, Any]] = {}
    dynamic_evaluation: ClassVar[bool] = False
    dynamic_evaluation_options: ClassVar[type | None] = None

    @abstractmethod
    def build_model(self, model_cfg, spec) -> Any:
        """An ``nn.Module`` of the task's model family for ``model_cfg`` (``model_config``)."""

    def model_name(self, model_cfg) -> str:
        """The model family's short name: the registered model is ``dynlm-<model_name>``, run
        names start with it (default: the task name)."""
        return self.name

    def wrap_for_ddp(self, model) -> Any:
        """The module DistributedDataParallel wraps on a multi-rank run: every parameter must
        take part in every step's graph on every rank (default: the model itself)."""
        return model

    def chunks(self, batch, train_cfg) -> Iterable[Any]:
        """The pieces of ``batch`` the loop backpropagates one at a time, in order (the LM: its
        truncated-BPTT chunks). Default: the batch itself."""
        return (batch,)

    def initial_state(self, model, batch) -> Any:
        """The state :meth:`loss` carries from one chunk of ``batch`` to the next (the LM: its
        recurrent state). Default: None."""
        return None

    @abstractmethod
    def loss(self, model, chunk, state) -> Any:
        """One chunk's :class:`dynlm.training.StepLoss`: the loss to backpropagate, the detached
        NLL sum and target count the run reports, and the state for the next chunk. ``model``
        is in train mode (maybe DDP-wrapped: call the forward through it, once); move ``chunk``
        to ``model``'s device here."""

    def detach_state(self, model, state) -> Any:
        """``state`` cut from the graph after a chunk's backward (default: unchanged)."""
        return state

    def evaluate(self, model, batches: Iterable[Any]) -> dict:
        """``metrics().compute()`` over ``batches``: ``loss``, ``primary_metric``, ``tokens`` and
        raw sums. Default: :meth:`loss`'s NLL sums and counts without gradients, each batch one
        chunk (``metrics.from_nll``)."""
        model.eval()
        total = self.metrics()
        with torch.no_grad():
            for batch in batches:
                step = self.loss(model, batch, self.initial_state(model, batch))
                total.merge(self.metrics.from_nll(float(step.nll_sum), int(step.count)))
        return total.compute()

    def evaluate_documents(self, model, model_cfg, rows: list[dict], spec, batch_size: int) -> dict:
        """:meth:`evaluate` of ``model`` on encoded ``rows`` in order, in the layout
        :meth:`evaluation_layout` gives for ``model_cfg`` (``dynlm evaluate``, the run's final
        evaluation and retraining's champion-challenger comparison all read documents this way)."""
        if not rows:
            raise ValueError("no documents to evaluate")
        layout = self.evaluation_layout(model_cfg)
        extra = {} if layout is None else {"layout": layout}  # a task with one layout need not take it
        return self.evaluate(model, self.batches(rows, spec, batch_size, sort_by_length=True, seed=None, **extra))

    def dynamic_evaluate_documents(self, model, model_cfg, spec, rows: list[dict], *, stats_rows: list[dict],
                                   valid_rows: list[dict], options) -> dict:
        """Evaluate encoded ``rows`` in order while the model adapts to them (only where
        :attr:`dynamic_evaluation`): statistics from ``stats_rows``, settings picked on
        ``valid_rows`` where ``options`` asks for it; the model's weights are restored after.
        Returns a JSON-able dict with the settings used and ``metrics``."""
        raise NotImplementedError(f"the {self.name!r} task has no dynamic evaluation")
