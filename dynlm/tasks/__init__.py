"""Tasks: one kind of data + model family each, behind the :class:`dynlm.tasks.base.Task` interface.

``TASKS`` is the registry a config's task name is looked up in: a plain dict, so where a name
comes from is one line here. Adding a task = one module under ``dynlm/tasks/`` (plus its models
file and a search space) and one entry below (docs/ARCHITECTURE.md, "Tasks").
"""

from __future__ import annotations

import importlib

from dynlm.tasks.base import Task
from dynlm.tasks.cloze import ClozeTask
from dynlm.tasks.lm import LMTask
from dynlm.tasks.naming import NamingTask

TASKS: dict[str, type[Task]] = {"lm": LMTask, "naming": NamingTask, "cloze": ClozeTask}
DEFAULT_TASK = "lm"


def get_task(name: str) -> Task:
    """An instance of the task ``name``: a key of :data:`TASKS`, or ``package.module:Class`` (a
    task outside the registry, e.g. in a plugin package or a test folder; every Ray worker must
    be able to import it). A ValueError names the known ones.
    """
    if ":" in name:
        module_name, _, class_name = name.partition(":")
        task_cls = getattr(importlib.import_module(module_name), class_name, None)
        if not (isinstance(task_cls, type) and issubclass(task_cls, Task)):
            raise ValueError(f"task {name!r}: {module_name} has no Task subclass {class_name!r}")
        return task_cls()
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r} (known: {', '.join(sorted(TASKS))}, or package.module:Class)")
    return TASKS[name]()


def task_ref(task: Task) -> str:
    """The name :func:`get_task` finds ``task`` by: its registry key, else ``module:Class``
    (what prepared folders, checkpoints and logged models record)."""
    task_cls = type(task)
    if TASKS.get(task.name) is task_cls:
        return task.name
    return f"{task_cls.__module__}:{task_cls.__qualname__}"


__all__ = ["DEFAULT_TASK", "TASKS", "Task", "get_task", "task_ref"]
