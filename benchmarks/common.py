"""What several benchmarks share: where things are, the runner over rows held in memory, the
batches a model is scored on, and the report files.

A benchmark trains its dynlm models the way ``dynlm train --local`` does, through
:mod:`dynlm.runner`: a :class:`dynlm.job.JobConfig` and a prepared folder give
``local_run(job, prepared)`` (model, optimizer, schedule, batch streams, ``fit``). Where the rows
are not a whole prepared folder (a part of one, the splits :func:`dynlm.tasks.local.prepare_in_memory`
returns, or seeded random rows), :func:`rows_run` builds the same run over them.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Iterable

from dynlm.job import JobConfig
from dynlm.runner import RankRun, build_rank_run
from dynlm.tasks import get_task
from dynlm.train_config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"  # the openly obtainable corpora (absent: a benchmark says so and stops)
RESULTS = REPO / "benchmarks" / "results"
# where the benchmarks' prepared folders go: keyed by what they hold, so a second run reuses them
PREPARED_ROOT = REPO / "runs" / "prepared"


def command_line(module: str, argv: list[str] | None) -> str:
    """The command that runs benchmark ``module`` with ``argv`` (default: this process's
    arguments), as a report opens with it: ``python -m benchmarks.<module> ...``."""
    arguments = argv if argv is not None else sys.argv[1:]
    return shlex.join(["python", "-m", f"benchmarks.{module}", *arguments])


def write_report(path: Path, text: str) -> None:
    """Write a Markdown report (its folder made if needed) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")


def format_value(value: float) -> str:
    """A perplexity as the tables print it (``nan`` where a category has no target)."""
    return "nan" if value != value else f"{value:.2f}"


def prepared_job(prepared, model, train: TrainConfig) -> JobConfig:
    """The job that trains ``model`` with ``train`` on a prepared folder: the folder's task, and as
    its ``data`` section the config the folder was prepared with (its ``manifest.json``)."""
    data = prepared.task.data_config.from_dict(prepared.manifest["config"])
    return JobConfig(task=prepared.manifest["task"], data=data, model=model, train=train)


def rows_run(job: JobConfig, spec, train_rows: list[dict], valid_rows: Iterable[dict] = (), *,
             device: Any = "cpu") -> RankRun:
    """The one-process :class:`dynlm.runner.RankRun` of ``job`` over rows held in memory:
    :func:`dynlm.runner.build_rank_run` with every row (rank 0 of 1), as
    :func:`dynlm.runner.local_run` builds it over a prepared folder.

    Args:
        job: the job (its ``task``, ``model`` and ``train`` sections are read).
        spec: the spec the rows were encoded with (what the model is built from).
        train_rows / valid_rows: encoded rows of the task, read again every epoch.

    Raises:
        ValueError: ``train.lr_schedule`` is ``cosine``: its length is counted from a prepared
            folder (:func:`dynlm.runner.total_steps`); prepare one and use ``local_run``.
    """
    if job.train.lr_schedule == "cosine":
        raise ValueError("rows_run: a cosine schedule needs a prepared folder (dynlm.runner.local_run)")
    valid_rows = list(valid_rows)
    return build_rank_run(job, spec, train_rows=lambda _buffer_rows: iter(train_rows),
                          valid_rows=lambda _buffer_rows: iter(valid_rows), steps=1, device=device)


def generated_rows_job(task: str, model, train: TrainConfig, *, generated_by: str) -> JobConfig:
    """The job of a benchmark that trains on rows it generates itself (no input file, no prepared
    folder): its ``data`` section only names the generator (``generated_by``); the runner reads
    the ``task``, ``model`` and ``train`` sections."""
    return JobConfig(task=task, data=get_task(task).data_config(inputs=[generated_by]), model=model, train=train)


def evaluation_batches(task, rows: Iterable[dict], spec, batch_size: int, *, layout=None,
                       device: Any = None) -> list:
    """``rows`` as the task batches them for scoring: in their order (no shuffling), in
    ``layout`` when given (the LM: sentence lockstep when None), moved to ``device`` when given."""
    extra = {} if layout is None else {"layout": layout}
    batches = task.batches(list(rows), spec, batch_size, seed=None, **extra)
    return [batch.to(device) if device is not None else batch for batch in batches]
