"""The results of a search: table, CSV, figure, best trial and the first line of a trial's error."""

from __future__ import annotations

import csv
import io

import pytest

from dynlm.search.report import (
    TrialSummary,
    best_trial,
    error_line,
    finished_trials,
    format_table,
    results_csv,
    results_figure,
)
from pipelines.defaults import default_job

KEYS = ["data.bpe_merges", "model.dntm.merge_fn"]


@pytest.fixture
def trials() -> list[TrialSummary]:
    return [
        TrialSummary("t0", {"data.bpe_merges": 0, "model.dntm.merge_fn": "max"}, "TERMINATED", 41.25, 2, 10.0, "r0", "FINISHED"),
        TrialSummary("t1", {"data.bpe_merges": 50, "model.dntm.merge_fn": "gru"}, "TERMINATED", 38.5, 1, 5.5, "r1", "KILLED"),
        TrialSummary("t2", {"data.bpe_merges": 50, "model.dntm.merge_fn": "max"}, "ERROR", float("nan"), 0, 1.0, None, None),
    ]


def test_results_table_and_csv(trials):
    lines = format_table(trials, KEYS).splitlines()
    assert lines[0].split() == ["trial", *KEYS, "best_valid_objective", "epochs", "time_s", "status"]
    assert lines[1].split() == ["t0", "0", "max", "41.250", "2", "10.0", "TERMINATED"]
    rows = list(csv.DictReader(io.StringIO(results_csv(trials, KEYS))))
    assert [r["trial"] for r in rows] == ["t0", "t1", "t2"]
    assert rows[1]["best_valid_objective"] == "38.5" and rows[1]["run_id"] == "r1" and rows[2]["run_id"] == ""


def _plotted(axis) -> dict[str, list[tuple[float, float]]]:
    """``{legend label: [(x, y), ...]}`` of a panel's scatter plots."""
    return {c.get_label(): [tuple(map(float, xy)) for xy in c.get_offsets()] for c in axis.collections}


def test_results_figure(trials, tmp_path):
    png = tmp_path / "plot.png"
    figure = results_figure(trials, default_job())
    left, right = figure.axes
    assert (left.get_xlabel(), right.get_xlabel(), left.get_ylabel()) == ("data.bpe_merges", "data.gamma",
                                                                          "best valid perplexity")
    # the LM's objective as it is (perplexity); t2 has none; gamma is the base's for both; t1 was
    # stopped by the scheduler (its run KILLED): drawn hollow, named so in the legend
    assert _plotted(left) == {"merge_fn=gru (stopped early)": [(50.0, 38.5)], "merge_fn=max": [(0.0, 41.25)]}
    assert _plotted(right) == {"merge_fn=gru (stopped early)": [(0.9, 38.5)], "merge_fn=max": [(0.9, 41.25)]}
    stopped = next(c for c in left.collections if c.get_label().endswith("(stopped early)"))
    assert stopped.get_facecolor().size == 0 or stopped.get_facecolor()[0][3] == 0  # hollow
    figure.savefig(png, dpi=100)  # what log_figure stores
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    pixels = matplotlib.image.imread(png)
    assert pixels.shape[:2] == (400, 1000)  # figsize (10, 4) at 100 dpi
    # the two finished trials are drawn in their merge_fn colours (tab10 blue for gru, orange for max)
    rgb = pixels[..., :3].reshape(-1, 3)
    for colour in ((0.122, 0.467, 0.706), (1.0, 0.498, 0.055)):
        assert (abs(rgb - colour).max(axis=1) < 0.02).sum() > 20, colour


def test_best_trial_is_a_finished_one(trials):
    assert [t.trial_id for t in finished_trials(trials)] == ["t0"]  # t1's run was KILLED, t2 errored
    assert best_trial(trials, "min").trial_id == "t0"
    trials[1].run_status = "FINISHED"
    assert best_trial(trials, "min").trial_id == "t1" and best_trial(trials, "max").trial_id == "t0"
    assert best_trial(trials[2:], "min") is None


class _WorkerGroupError(Exception):
    """Shaped like Ray Train's WorkerGroupError: ``worker_failures = {rank: exception}``."""

    def __init__(self, message, worker_failures):
        super().__init__(message)
        self.worker_failures = worker_failures


class _TaskError(Exception):
    """Shaped like Ray's RayTaskError: the remote exception in ``cause``."""

    def __init__(self, cause):
        super().__init__("task failed")
        self.cause = cause


def test_error_line_unwraps_wrapped_errors():
    try:
        try:
            raise FileNotFoundError("no prepared folder x\nsecond line")
        except FileNotFoundError as inner:
            raise RuntimeError("Training failed due to worker errors") from inner
    except RuntimeError as outer:
        assert error_line(outer) == "FileNotFoundError: no prepared folder x"
    grouped = _WorkerGroupError("[Rank 0 Error Snippet]: ...", {1: ValueError("b"), 0: KeyError("first rank")})
    assert error_line(grouped) == "KeyError: 'first rank'"
    assert error_line(_TaskError(_WorkerGroupError("x", {0: OSError("disk full")}))) == "OSError: disk full"
    assert error_line(RuntimeError("")) == "RuntimeError"
    assert error_line(None) is None


def test_results_figure_of_another_task(tmp_path):
    """A naming search: one panel per searched key, coloured by the categorical one (model.type)."""
    from dynlm.search.space_file import job_for_task

    base = job_for_task(default_job(), "naming")
    trials = [TrialSummary(trial_id=f"t{i}", params={"model.type": kind, "model.embed_dim": dim}, status="TERMINATED",
                           best_valid_objective=objective, epochs=1, time_s=1.0, run_id=f"r{i}", run_status="FINISHED")
              for i, (kind, dim, objective) in enumerate([("name", 32, 0.7), ("subtoken", 64, 0.5), ("subtoken", 32, 0.6)])]
    figure = results_figure(trials, base, ["model.embed_dim", "model.type"])
    (axis,) = figure.axes
    assert axis.get_xlabel() == "model.embed_dim" and axis.get_ylabel() == "best valid f1_error"
    assert _plotted(axis) == {"model.type=name": [(32.0, 0.7)], "model.type=subtoken": [(64.0, 0.5), (32.0, 0.6)]}
    assert sorted(text.get_text() for text in axis.get_legend().get_texts()) == ["model.type=name", "model.type=subtoken"]
    figure.savefig(tmp_path / "t.png", dpi=50)


def test_results_figure_of_the_saw_search_shows_accuracy(tmp_path):
    """The cloze task minimises its error; its figure shows valid accuracy (%) = 100 (1 - error)
    against bpe_merges and gamma, one colour per model.combine (tune_spaces/saw.yaml's keys)."""
    from dynlm.search.space_file import job_for_task

    base = job_for_task(default_job(), "cloze", inputs=["cmrc2017/cloze.valid.doc_query.gz"])
    settings = [(0, 0.5, "concat", 0.25), (1000, 0.75, "sum", 0.375), (1000, 0.25, "concat", 0.5),
                (5000, 0.5, "mul", float("nan"))]  # the last trial reported nothing
    trials = [TrialSummary(trial_id=f"t{i}", params={"data.bpe_merges": merges, "data.gamma": gamma,
                                                     "model.combine": combine},
                           status="TERMINATED", best_valid_objective=error, epochs=2, time_s=1.0, run_id=f"r{i}",
                           run_status="FINISHED") for i, (merges, gamma, combine, error) in enumerate(settings)]
    figure = results_figure(trials, base, ["data.bpe_merges", "data.gamma", "model.combine"])
    merges_axis, gamma_axis = figure.axes
    assert (merges_axis.get_xlabel(), gamma_axis.get_xlabel()) == ("data.bpe_merges", "data.gamma")
    assert merges_axis.get_ylabel() == "valid accuracy (%)"
    assert _plotted(merges_axis) == {"model.combine=concat": [(0.0, 75.0), (1000.0, 50.0)],
                                     "model.combine=sum": [(1000.0, 62.5)]}
    assert _plotted(gamma_axis) == {"model.combine=concat": [(0.5, 75.0), (0.25, 50.0)],
                                    "model.combine=sum": [(0.75, 62.5)]}
    figure.savefig(tmp_path / "saw.png", dpi=50)


def test_results_figure_shows_what_was_searched(tmp_path):
    """An LM search over the learning rate: one panel, train.lr on a log axis (not bpe_merges and a
    degenerate gamma axis)."""
    trials = [TrialSummary(f"t{i}", {"train.lr": lr, "model.dntm.merge_fn": "max"}, "TERMINATED", ppl, 2, 1.0,
                           f"r{i}", "FINISHED") for i, (lr, ppl) in enumerate([(1e-4, 90.0), (1e-3, 60.0), (1e-2, 75.0)])]
    figure = results_figure(trials, default_job(), ["train.lr", "model.dntm.merge_fn"])
    (axis,) = figure.axes
    assert axis.get_xlabel() == "train.lr" and axis.get_xscale() == "log"
    assert _plotted(axis) == {"merge_fn=max": [(1e-4, 90.0), (1e-3, 60.0), (1e-2, 75.0)]}
    figure.savefig(tmp_path / "t.png", dpi=50)
