"""What a finished search reports: one :class:`TrialSummary` per trial, the results table (text
and CSV), the results figure, the best trial, and the first line of a trial's error.

matplotlib is imported inside :func:`results_figure` and the figure is a
``matplotlib.figure.Figure`` built without pyplot (as in ``dynlm/tasks/lm_figure.py``).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import Any


@dataclass
class TrialSummary:
    """One row of the results table."""

    trial_id: str
    params: dict[str, Any]
    status: str  # Tune's trial status: TERMINATED | ERROR | RUNNING | PENDING ...
    best_valid_objective: float  # min over the trial's reports (nan: none)
    epochs: int  # reports (= epochs) the trial made before it ended or ASHA stopped it
    time_s: float
    run_id: str | None  # the MLflow child run that finished (None: none finished)
    run_status: str | None  # MLflow status of that run
    error: str | None = None  # first line of the trial's error (status ERROR)


def finished_trials(trials: list[TrialSummary]) -> list[TrialSummary]:
    """The trials whose run FINISHED with a (finite) validation perplexity."""
    return [t for t in trials if t.run_status == "FINISHED" and math.isfinite(t.best_valid_objective)]


def best_trial(trials: list[TrialSummary], mode: str) -> TrialSummary | None:
    """The finished trial with the lowest (``mode="min"``) or highest (``"max"``) perplexity."""
    finished = finished_trials(trials)
    sign = 1.0 if mode == "min" else -1.0
    return min(finished, key=lambda t: sign * t.best_valid_objective) if finished else None


def error_line(error: BaseException | None) -> str | None:
    """``Type: first line of the message`` of a trial's error, unwrapped from its wrappers: a
    ``worker_failures`` mapping ``{rank: exception}`` (Ray Train's WorkerGroupError; the lowest
    rank wins), a ``cause`` exception (RayTaskError) and ``raise ... from exc``."""
    if error is None:
        return None
    cause, seen = error, set()
    while id(cause) not in seen:
        seen.add(id(cause))
        failures = getattr(cause, "worker_failures", None)
        if failures:
            cause = failures[min(failures)]
        elif isinstance(getattr(cause, "cause", None), BaseException):
            cause = cause.cause
        elif isinstance(cause.__cause__, BaseException):
            cause = cause.__cause__
    lines = [line for line in str(cause).strip().splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_table(trials: list[TrialSummary], keys: list[str]) -> str:
    """The results table as aligned text (trial, settings, best valid ppl, epochs, time)."""
    header = ["trial", *keys, "best_valid_objective", "epochs", "time_s", "status"]
    body = [[t.trial_id, *[_format_value(t.params.get(k)) for k in keys], f"{t.best_valid_objective:.3f}",
             str(t.epochs), f"{t.time_s:.1f}", t.status] for t in trials]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in [header, *body])


def results_csv(trials: list[TrialSummary], keys: list[str]) -> str:
    """The results table as CSV (with the MLflow run id of each trial)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["trial", *keys, "best_valid_objective", "epochs", "time_s", "status", "run_id"])
    for t in trials:
        writer.writerow([t.trial_id, *[t.params.get(k) for k in keys], t.best_valid_objective, t.epochs,
                         round(t.time_s, 3), t.status, t.run_id or ""])
    return out.getvalue()


def results_figure(trials: list[TrialSummary], base, keys: list[str] | None = None):
    """The search's objective against the settings it searched.

    One panel per searched key in ``keys`` (categorical values at integer positions with their
    labels; a log x axis for a positive setting that spans a decade or more, such as a learning
    rate), one colour per value of a categorical key: ``model.dntm.merge_fn`` for the LM, else the
    first categorical key searched. An LM search given no keys shows ``data.bpe_merges`` and
    ``data.gamma``. A trial the scheduler stopped early (its MLflow run KILLED) is drawn hollow.
    The y values and the y label are the task's :meth:`~dynlm.tasks.base.Task.objective_display`
    of each trial's best objective (the cloze task: valid accuracy in %, ``1 - error``; the LM:
    best valid perplexity).

    Args:
        trials: the search's trials (those without a finite objective are left out).
        base: the base JobConfig (the value of a setting a trial did not search).
        keys: the searched dotted keys.
    Returns:
        A ``matplotlib.figure.Figure`` (at least 10 x 4 inches).
    """
    base_values = base.to_dict()

    def value(t: TrialSummary, key: str) -> Any:
        if t.params.get(key) is not None:
            return t.params[key]
        node: Any = base_values
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    points = [t for t in trials if math.isfinite(t.best_valid_objective)]
    display = base.get_task().objective_display()
    keys = list(keys or [])
    colour_key = display.colour_key
    if colour_key is None:
        categorical = [k for k in keys if any(isinstance(t.params.get(k), str) for t in points)]
        colour_key = categorical[0] if categorical else None
    panels = [key for key in keys if key != colour_key] or list(display.default_panels) or [colour_key]
    return _scatter_panels(points, panels, colour_key, display.label, value, display.value)


def _scatter_panels(points: list[TrialSummary], panels: list[str | None], colour_key: str | None, ylabel: str,
                    value, shown):
    """Scatter plots of ``shown(objective)``, one per key in ``panels``, coloured by ``colour_key``."""
    import matplotlib
    from matplotlib.figure import Figure

    def colour_of(t: TrialSummary) -> str:
        return str(value(t, colour_key)) if colour_key else "trial"

    groups = sorted({colour_of(t) for t in points})
    colours = {g: matplotlib.colormaps["tab10"](i % 10) for i, g in enumerate(groups)}
    colour_name = colour_key.rsplit(".", 1)[-1] if colour_key == "model.dntm.merge_fn" else colour_key
    fig = Figure(figsize=(max(10, 4 * len(panels)), 4))
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for axis, key in zip(axes, panels):
        values = [value(t, key) for t in points]
        labels = sorted({str(v) for v in values if isinstance(v, str)})
        position = {label: i for i, label in enumerate(labels)}
        for name in groups:
            for stopped in (False, True):
                group = [t for t in points if colour_of(t) == name and (t.run_status == "KILLED") == stopped]
                if not group:
                    continue
                xs = [value(t, key) for t in group]
                xs = [position[x] if isinstance(x, str) else x for x in xs]
                label = f"{colour_name}={name}" if colour_name else name
                axis.scatter(xs, [shown(t.best_valid_objective) for t in group], s=30,
                             label=label + (" (stopped early)" if stopped else ""),
                             facecolors="none" if stopped else colours[name], edgecolors=colours[name])
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if numbers and min(numbers) > 0 and max(numbers) / min(numbers) >= 10:
            axis.set_xscale("log")  # a rate searched over decades
        if labels:
            axis.set_xticks(range(len(labels)), labels)
        axis.set_xlabel(key or "")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel(ylabel)
    if groups:
        axes[-1].legend(fontsize=8)
    fig.suptitle(f"{len(points)} trials")
    fig.tight_layout()
    return fig
