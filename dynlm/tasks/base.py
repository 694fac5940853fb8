"""The :class:`Task` interface: everything a pipeline needs to know about one kind of data and model.

A task owns its record formats and its model family; the prepare job, the training loop and
``dynlm evaluate`` only call the members named here (the runner is task-blind, a new task is one
module: see docs/ARCHITECTURE.md, "Tasks"). Three groups of members:

* **prepare** (pure functions of Arrow batches, so that Ray Data can run them in its workers and a
  Ray-free path can call the very same ones, :func:`dynlm.tasks.local.prepare_in_memory`):
  ``parse_files`` -> ``count_train`` -> ``fit_preprocessor`` -> ``encoder``;
* **training**: ``collate`` / ``batches``, ``build_model``, ``loss`` (with ``chunks`` and the
  state members for a task whose batch takes several steps), ``evaluate``, ``metrics`` (an
  accumulator class whose sums are all-reduced across ranks); the step itself is the loop's
  (:func:`dynlm.training.train_step`);
* **report**: ``primary_metric`` (lower is better), ``metric_table``, ``metric_figures``,
  ``objective_display`` (how a search's figure shows the objective).

Members that are plain functions are static, so ``LMTask.parse_files`` is the module-level
function itself (picklable by reference, as Ray Data needs).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Iterable, Iterator, NamedTuple, Protocol, runtime_checkable

import pyarrow as pa

# Columns every task's parsed_schema has (the prepare job routes rows on them):
# kind: "document" | "dropped" | "quarantine"; source_file: the document's own file name;
# input_file: the input file the record was read from (the split rule is checked on it);
# split: "train" | "valid" | "test" ("" unless a document); line, reason: where and why a
# record was quarantined or dropped.
PARSED_COLUMNS = ("kind", "doc_id", "source_file", "input_file", "split", "line", "reason")

# Column types of ``Task.serving_inputs`` / ``serving_outputs`` (the pyfunc maps them to MLflow's).
SERVING_TYPES = ("string", "long", "double", "list<string>", "list<double>", "list<list<string>>")


class ObjectiveDisplay(NamedTuple):
    """How a search report plots a task's objective (:meth:`Task.objective_display`).

    Attributes:
        label: the y axis label.
        value: the plotted value of an objective value (``primary_metric``, lower is better).
        colour_key: the dotted key the figure colours trials by (None: the first searched key
            with text values).
        default_panels: the keys plotted when the search varies nothing but ``colour_key``.
    """

    label: str
    value: Callable[[float], float]
    colour_key: str | None = None
    default_panels: tuple[str, ...] = ()


@runtime_checkable
class NameSuggester(Protocol):
    """The role of a task whose models suggest names for a source file's functions (``dynlm
    suggest-name``: the naming task)."""

    def suggest_source(self, model, model_cfg, preprocessor, source: str | bytes, path: str, top_k: int) -> list[dict]:
        """Every function of ``source`` with the model's ``top_k`` names and their probabilities."""


def _unchanged(objective: float) -> float:
    return objective


class Task(ABC):
    """One kind of data + model family. Subclasses set the class attributes and the members below.

    Attributes:
        name: the key in :data:`dynlm.tasks.TASKS` (and of the ``task:`` config field to come).
        parsed_schema: rows of ``parse_files`` (has :data:`PARSED_COLUMNS`).
        payload_columns: columns of ``parsed_schema`` that hold the text (left on the workers:
            the driver collects the other, small columns of every record).
        encoded_schema: rows of the prepared Parquet shards (what ``collate`` reads).
        data_config: strict :class:`dynlm.config.Config` class of the ``data:`` section.
        model_config: strict config class of the ``model:`` section (``build_model``'s argument).
        metrics: accumulator class: ``()``, ``merge(other)``, ``as_tensor(device) -> 1-D float64``
            (all-reduce it with SUM), ``from_tensor(t)``, ``from_metrics(dict)`` (inverse of
            ``compute`` on its sums) and ``compute() -> dict``.
        primary_metric: key of ``evaluate``'s dict that early stopping and promotion compare
            (lower is better).
        spec_class: the strict config class of ``preprocessor.spec`` (what a model is built
            from besides its config; checkpoints store it).
    """

    name: ClassVar[str]
    parsed_schema: ClassVar[pa.Schema]
    payload_columns: ClassVar[tuple[str, ...]]
    encoded_schema: ClassVar[pa.Schema]
    data_config: ClassVar[type]
    model_config: ClassVar[type]
    metrics: ClassVar[type]
    primary_metric: ClassVar[str] = "ppl"
    spec_class: ClassVar[type]
    #: True: ``dynlm evaluate --dynamic-eval`` can adapt the task's models while they read (the LM's)
    dynamic_evaluation: ClassVar[bool] = False
    #: the task's best-known ``train:`` settings where they differ from :class:`dynlm.training.TrainConfig`'s
    #: (the language models'); a job's ``train:`` section overrides them key by key
    train_defaults: ClassVar[dict[str, Any]] = {}

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

    def evaluation_data_config(self, preprocessor: Any, inputs: list[str]) -> Any:
        """The data config that reads raw files for a model fitted with ``preprocessor`` (``dynlm
        evaluate`` on raw files); the caller may override its fields. Default: the defaults."""
        return self.data_config(inputs=list(inputs))

    @abstractmethod
    def load_preprocessor(self, text: str) -> Any:
        """The preprocessor from its ``to_json()`` text (``preprocessor.json``)."""

    @property
    @abstractmethod
    def encoder(self) -> type:
        """Encode stage class: ``encoder(preprocessor_json)(parsed batch) -> encoded_schema + split``.

        A class so that Ray Data's actors load the preprocessor once (``ActorPoolStrategy``).
        """

    def derive_preprocessor(self, preprocessor: Any, data_cfg) -> Any:
        """The preprocessor of ``data_cfg`` from one fitted for a config of the same
        ``encoding_hash`` (the LM: another ``gamma``). Only called when ``data_cfg.encoding_hash()``
        differs from its ``data_hash()``; the default encoding hash never does."""
        raise NotImplementedError(f"task {self.name!r} shares no shards between data configs")

    def shard_stats(self, table: pa.Table, spec: Any) -> dict[str, int]:
        """Sums over the encoded rows of one shard that :meth:`summarize` needs (the shard's
        ``documents`` are counted for every task). Computed where the shard is written, so no
        split is ever gathered in one place; summed per split. Default: nothing more."""
        return {}

    def split_stats(self, splits: dict[str, pa.Table], spec: Any) -> dict[str, dict[str, int]]:
        """:meth:`shard_stats` of whole split tables (the in-memory path), as :meth:`summarize` takes them."""
        return {split: {"documents": table.num_rows, **self.shard_stats(table, spec)} for split, table in splits.items()}

    def summarize(self, meta: pa.Table, split_stats: dict[str, dict[str, int]], preprocessor: Any) -> dict:
        """The manifest ``counts``: ``meta`` is every parsed record without ``payload_columns``,
        ``split_stats`` the per-split sums of :meth:`shard_stats` (with ``documents``). Tasks add
        their own counts to these."""
        kinds = meta["kind"].to_numpy(zero_copy_only=False)
        return {"documents": {split: stats["documents"] for split, stats in split_stats.items()},
                "dropped_docs": int((kinds == "dropped").sum()), "quarantined": int((kinds == "quarantine").sum()),
                "input_files": len(set(meta["input_file"].to_pylist()))}

    def summary_lines(self, counts: dict) -> list[tuple[str, str]]:
        """``(label, value)`` rows the prepare table shows below the documents per split."""
        return [("quarantined records", f"{counts['quarantined']:,d}"), ("dropped documents", f"{counts['dropped_docs']:,d}")]

    # ---------------------------------------------------------------------------- training
    @abstractmethod
    def collate(self, rows: list[dict], spec) -> Any:
        """Encoded rows (dicts of ``encoded_schema``) -> one batch: ``to(device)``, and
        ``num_documents`` / ``num_padded`` (what a training step reports: its active records and
        padded positions)."""

    @abstractmethod
    def batches(self, rows: Iterable[dict], spec, batch_size: int, *, sort_by_length: bool = True,
                seed: int | None = 0, layout: Any = None) -> Iterator[Any]:
        """Batches of ``batch_size`` records (``seed`` shuffles, None keeps the order), laid out
        as ``layout`` (what :meth:`batch_layout` returned) says."""

    def batch_layout(self, train_cfg, model_cfg) -> Any:
        """How a run of ``train_cfg`` and ``model_cfg`` lays its batches out, passed as ``layout``
        to :meth:`batches` / :meth:`stream_batches` / :meth:`steps_per_epoch` (opaque to the
        runner; default None: the task has one layout). The LM: sentence lockstep or chunks."""
        return None

    def evaluation_layout(self, model_cfg) -> Any:
        """The layout a model of ``model_cfg`` must be evaluated in (``dynlm evaluate``, validation
        during training), passed as ``layout`` to :meth:`batches`; None (the default): every layout
        gives the same metrics (evaluation then reads the default layout, validation the
        training layout)."""
        return None

    def steps_per_batch(self, batch, train_cfg) -> int:
        """Optimizer steps the loop takes on ``batch``: its :meth:`chunks` (the cosine schedule's length)."""
        return sum(1 for _ in self.chunks(batch, train_cfg))

    def steps_per_epoch(self, prepared, train_cfg, world_size: int, layout: Any = None) -> int:
        """Optimizer steps per rank of one epoch over ``prepared``'s train split, read from the
        Parquet metadata only (default: one step per global batch)."""
        from dynlm.data.batching import per_worker_batch_size

        per_step = per_worker_batch_size(train_cfg.batch_size, world_size) * world_size
        return max(1, -(-prepared.num_documents("train") // per_step))

    def lockstep_size(self, batch) -> int:
        """How long the step runs on ``batch`` in the unit :meth:`pad_batch` pads in; the
        ranks of a DDP run agree on the longest before every step (default: 1, one step)."""
        return 1

    def pad_batch(self, batch, size: int, spec) -> Any:
        """``batch`` padded to ``size`` (inactive positions: zero loss, zero gradient) so that
        every rank runs the same optimizer steps; ``batch`` None: an inactive batch of that size
        for a rank that ran out of data. Default: the batch itself; a task that
        cuts its batches into a varying number of chunks overrides both lockstep members."""
        if batch is None:
            raise NotImplementedError(f"task {self.name!r} cannot build an inactive batch")
        return batch

    def stream_batches(self, rows: Iterable[dict], spec, batch_size: int, *, seed: int,
                       buffer_rows: int, layout: Any = None) -> Iterator[Any]:
        """Batches of a stream of rows (a Ray Data shard): ``buffer_rows`` rows at a time go
        through :meth:`batches` (seed ``seed + k`` for the k-th buffer), so memory stays bounded.
        ``layout`` is passed on when it is not None (a task with one layout need not take it)."""
        extra = {} if layout is None else {"layout": layout}
        buffer: list[dict] = []
        chunk = 0
        for row in rows:
            buffer.append(row)
            if len(buffer) == buffer_rows:
                yield from self.batches(buffer, spec, batch_size, seed=seed + chunk, **extra)
                buffer, chunk = [], chunk + 1
        if buffer:
            yield from self.batches(buffer, spec, batch_size, seed=seed + chunk, **extra)

    def wrap_for_ddp(self, model) -> Any:
        """The module DistributedDataParallel wraps on a multi-rank run: every parameter must
        take part in every step's graph on every rank (default: the model itself)."""
        return model

    def model_name(self, model_cfg) -> str:
        """The model family's short name: the registered model is ``dynlm-<model_name>``, run
        names start with it (default: the task name)."""
        return self.name

    @abstractmethod
    def build_model(self, model_cfg, spec) -> Any:
        """An ``nn.Module`` of the task's model family for ``model_cfg`` (``model_config``)."""

    # The step is the loop's (dynlm.training.train_step: zero_grad, autocast, backward, clipping,
    # the optimizer and schedule steps); a task cuts a batch into chunks and computes a loss.
    def chunks(self, batch, train_cfg) -> Iterable[Any]:
        """The pieces of ``batch`` the loop takes one optimizer step on, in order (the LM: its
        truncated-BPTT chunks). Default: the batch itself, one step."""
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

    @abstractmethod
    def evaluate(self, model, batches: Iterable[Any]) -> dict:
        """``metrics().compute()`` over ``batches``: ``loss``, ``primary_metric``, ``tokens`` and raw sums."""

    def evaluate_documents(self, model, model_cfg, rows: list[dict], spec, batch_size: int) -> dict:
        """:meth:`evaluate` of ``model`` on encoded ``rows`` in order, in the layout
        :meth:`evaluation_layout` gives for ``model_cfg`` (``dynlm evaluate``, the run's final
        evaluation and retraining's champion-challenger comparison all read documents this way)."""
        if not rows:
            raise ValueError("no documents to evaluate")
        layout = self.evaluation_layout(model_cfg)
        extra = {} if layout is None else {"layout": layout}  # a task with one layout need not take it
        return self.evaluate(model, self.batches(rows, spec, batch_size, sort_by_length=True, seed=None, **extra))

    # ----------------------------------------------------------------------------- serving
    # What a served model (``mlflow models serve``, the pyfunc in pipelines/pyfunc_model.py)
    # reads and answers: ``(column, type)`` pairs, type one of SERVING_TYPES; every input
    # column is optional (the task says which it needs), and an example request.
    serving_inputs: ClassVar[tuple[tuple[str, str], ...]] = ()
    serving_outputs: ClassVar[tuple[tuple[str, str], ...]] = ()
    serving_example: ClassVar[dict[str, list]] = {}

    def serve(self, model, model_cfg, spec, preprocessor, request) -> list[dict]:
        """A served model's answer: ``request`` (a pandas DataFrame, or a dict/list/str the task
        accepts) -> one dict per output row, keyed by ``serving_outputs``. Bad input raises
        :class:`dynlm.requests.InputError` with a one-line reason (HTTP 400, no traceback)."""
        from dynlm.requests import InputError

        raise InputError(f"a {self.name!r} task model answers no requests; evaluate it with "
                         "`dynlm evaluate --model <its models:/ URI>`")

    # ------------------------------------------------------------------------------ report
    @abstractmethod
    def metric_table(self, metrics: dict, title: str) -> str:
        """The evaluation table ``dynlm evaluate`` prints for ``evaluate``'s dict."""

    def metric_figures(self, metrics: dict, title: str) -> dict[str, Any]:
        """``{artifact file name: matplotlib Figure}`` to log with the run (none by default)."""
        return {}

    def objective_display(self) -> ObjectiveDisplay:
        """How the search report's figure (:func:`dynlm.search.report.results_figure`) shows
        each trial's best ``primary_metric``: the y label, the plotted value, what colours the
        trials. Default: the objective itself, ``best valid <primary_metric>``, coloured by the
        first searched key with text values. A task whose objective is an error may show what
        it is the error of (the cloze task: accuracy in %); the LM colours by merge function."""
        return ObjectiveDisplay(f"best valid {self.primary_metric}", _unchanged)
