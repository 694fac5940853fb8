"""Tasks: one kind of data + model family each, behind the :class:`dynlm.tasks.base.Task` interface.

``TASKS`` is the registry a config's task name is looked up in: a plain dict, so where a name
comes from is one line here. Adding a task = one module under ``dynlm/tasks/`` (plus its models
file and a search space) and one entry below (docs/ARCHITECTURE.md, "Tasks").
"""

from __future__ import annotations

from dynlm.tasks.base import Task
from dynlm.tasks.lm import LMTask

TASKS: dict[str, type[Task]] = {"lm": LMTask}


def get_task(name: str) -> Task:
    """An instance of the task registered as ``name``; a ValueError names the known ones."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r} (known: {', '.join(sorted(TASKS))})")
    return TASKS[name]()


__all__ = ["TASKS", "Task", "get_task"]
