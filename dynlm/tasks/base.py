"""The :class:`Task` interface: everything a pipeline needs to know about one kind of data and model.

A task owns its record formats and its model family; the prepare job, the training loop and
``dynlm evaluate`` only call the members named here (the runner is task-blind, a new task is one
module: see docs/ARCHITECTURE.md, "Tasks"). Three groups of members:

* **prepare** (pure functions of Arrow batches, so that Ray Data can run them in its workers and a
  Ray-free path can call the very same ones, :func:`dynlm.tasks.local.prepare_in_memory`):
  ``parse_files`` -> ``count_train`` -> ``fit_preprocessor`` -> ``encoder``;
* **training**: ``collate`` / ``batches``, ``build_model``, ``loss``, ``train_step``, ``evaluate``,
  ``metrics`` (an accumulator class whose sums are all-reduced across ranks);
* **report**: ``primary_metric`` (lower is better), ``metric_table``, ``metric_figures``.

Members that are plain functions are static, so ``LMTask.parse_files`` is the module-level
function itself (picklable by reference, as Ray Data needs).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Iterable, Iterator

import pyarrow as pa

# Columns every task's parsed_schema has (the prepare job routes rows on them):
# kind: "document" | "dropped" | "quarantine"; split: "train" | "valid" | "test" ("" unless a
# document); line, reason: where and why a record was quarantined or dropped.
PARSED_COLUMNS = ("kind", "doc_id", "source_file", "split", "line", "reason")


class Task(ABC):
    """One kind of data + model family. Subclasses set the class attributes and the members below.

    Attributes:
        name: the key in :data:`dynlm.tasks.TASKS` (and of the ``task:`` config field to come).
        parsed_schema: rows of ``parse_files`` (has :data:`PARSED_COLUMNS`).
        encoded_schema: rows of the prepared Parquet shards (what ``collate`` reads).
        data_config: strict :class:`dynlm.config.Config` class of the ``data:`` section.
        model_config: strict config class of the ``model:`` section (``build_model``'s argument).
        metrics: accumulator class: ``()``, ``merge(other)``, ``as_tensor(device) -> 1-D float64``
            (all-reduce it with SUM), ``from_tensor(t)``, ``from_metrics(dict)`` (inverse of
            ``compute`` on its sums) and ``compute() -> dict``.
        primary_metric: key of ``evaluate``'s dict that early stopping and promotion compare
            (lower is better).
    """

    name: ClassVar[str]
    parsed_schema: ClassVar[pa.Schema]
    encoded_schema: ClassVar[pa.Schema]
    data_config: ClassVar[type]
    model_config: ClassVar[type]
    metrics: ClassVar[type]
    primary_metric: ClassVar[str] = "ppl"

    # ----------------------------------------------------------------------------- prepare
    @staticmethod
    @abstractmethod
    def parse_files(batch: pa.Table, cfg_dict: dict) -> pa.Table:
        """``{bytes, path}`` rows (one per input file) -> ``parsed_schema`` rows, split assigned."""

    @staticmethod
    @abstractmethod
    def count_train(batch: pa.Table) -> pa.Table:
        """``parsed_schema`` rows -> ``{word: string, count: int64}`` of this batch's train split."""

    @abstractmethod
    def fit_preprocessor(self, counts: dict[str, int], data_cfg) -> Any:
        """The preprocessor fitted on the summed train counts; it has ``to_json()`` and ``spec``."""

    @abstractmethod
    def load_preprocessor(self, text: str) -> Any:
        """The preprocessor from its ``to_json()`` text (``preprocessor.json``)."""

    @property
    @abstractmethod
    def encoder(self) -> type:
        """Encode stage class: ``encoder(preprocessor_json)(parsed batch) -> encoded_schema + split``.

        A class so that Ray Data's actors load the preprocessor once (``ActorPoolStrategy``).
        """

    # ---------------------------------------------------------------------------- training
    @abstractmethod
    def collate(self, rows: list[dict], spec) -> Any:
        """Encoded rows (dicts of ``encoded_schema``) -> one batch (with ``to(device)``)."""

    @abstractmethod
    def batches(self, rows: Iterable[dict], spec, batch_size: int, *, sort_by_length: bool = True,
                seed: int | None = 0) -> Iterator[Any]:
        """Batches of ``batch_size`` records (``seed`` shuffles, None keeps the order)."""

    @abstractmethod
    def build_model(self, model_cfg, spec) -> Any:
        """An ``nn.Module`` of the task's model family for ``model_cfg`` (``model_config``)."""

    @abstractmethod
    def loss(self, outputs, batch) -> tuple[Any, Any, Any]:
        """``(loss to backpropagate, detached NLL sum, target count)`` of model outputs on a batch."""

    @abstractmethod
    def train_step(self, model, batch, optimizer, train_cfg, *, scheduler=None) -> dict:
        """Train on one batch; returns at least ``loss``, ``nll_sum``, ``tokens``, ``num_padded``, ``steps``."""

    @abstractmethod
    def evaluate(self, model, batches: Iterable[Any]) -> dict:
        """``metrics().compute()`` over ``batches``: ``loss``, ``primary_metric``, ``tokens`` and raw sums."""

    # ------------------------------------------------------------------------------ report
    @abstractmethod
    def metric_table(self, metrics: dict, title: str) -> str:
        """The evaluation table ``dynlm evaluate`` prints for ``evaluate``'s dict."""

    def metric_figures(self, metrics: dict, title: str) -> dict[str, Any]:
        """``{artifact file name: matplotlib Figure}`` to log with the run (none by default)."""
        return {}
