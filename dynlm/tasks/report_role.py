"""The report role of a :class:`dynlm.tasks.Task`: what people and programs read of a model's
results: the evaluation table and figures, how a search plots the objective, and what a served
model answers.

A task author writes (required): ``metric_table``. Optional: ``metric_figures``,
``objective_display``, and the serving members (``serving_inputs`` / ``serving_outputs`` /
``serving_example`` / ``serve``; without them a served model answers that it serves nothing).
Further roles are :class:`typing.Protocol` classes a task may meet (:class:`NameSuggester`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, NamedTuple, Protocol, runtime_checkable

# Column types of ``serving_inputs`` / ``serving_outputs`` (the pyfunc maps them to MLflow's).
SERVING_TYPES = ("string", "long", "double", "list<string>", "list<double>", "list<list<string>>")


class ObjectiveDisplay(NamedTuple):
    """How a search report plots a task's objective (:meth:`TaskReport.objective_display`).

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

    def suggestion_summary(self, functions: list[dict]) -> str:
        """Text that scores the suggestions of :meth:`suggest_source` (of one or more files)
        against the functions' actual names."""


def _unchanged(objective: float) -> float:
    return objective


class TaskReport(ABC):
    """The report role (module docstring)."""

    name: ClassVar[str]
    primary_metric: ClassVar[str]
    # What a served model (``mlflow models serve``, the pyfunc in pipelines/pyfunc_model.py)
    # reads and answers: ``(column, type)`` pairs, type one of SERVING_TYPES; every input
    # column is optional (the task says which it needs), and an example request.
    serving_inputs: ClassVar[tuple[tuple[str, str], ...]] = ()
    serving_outputs: ClassVar[tuple[tuple[str, str], ...]] = ()
    serving_example: ClassVar[dict[str, list]] = {}

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

    def dynamic_evaluation_text(self, result: dict, grid_source: str) -> str:
        """What ``dynlm evaluate --dynamic-eval`` prints of :meth:`~dynlm.tasks.model_role.TaskModel.dynamic_evaluate_documents`'s
        result (``grid_source``: which documents picked its settings)."""
        raise NotImplementedError(f"the {self.name!r} task has no dynamic evaluation")

    def serve(self, model, model_cfg, spec, preprocessor, request) -> list[dict]:
        """A served model's answer: ``request`` (a pandas DataFrame, or a dict/list/str the task
        accepts) -> one dict per output row, keyed by ``serving_outputs``. Bad input raises
        :class:`dynlm.requests.InputError` with a one-line reason (HTTP 400, no traceback)."""
        from dynlm.requests import InputError

        raise InputError(f"a {self.name!r} task model answers no requests; evaluate it with "
                         "`dynlm evaluate --model <its models:/ URI>`")
