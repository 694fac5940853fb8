"""The :class:`Task` interface: everything a pipeline needs to know about one kind of data and model.

A task owns its record formats and its model family; the prepare job, the runner, the training
loop and ``dynlm evaluate`` only call its members (the runner is task-blind; a new task is one
module: docs/ARCHITECTURE.md, "Tasks", with ``tests/dynlm/tasks/char_task.py`` as the worked
example). The contract is split by role, one short class each, so a task author reads one role
at a time:

* :class:`~dynlm.tasks.data_role.TaskData` (``data_role.py``): files -> records ->
  preprocessor -> encoded rows (``dynlm prepare``);
* :class:`~dynlm.tasks.batch_role.TaskBatching` (``batch_role.py``): encoded rows -> batches,
  the DDP lockstep;
* :class:`~dynlm.tasks.model_role.TaskModel` (``model_role.py``): build the model, a chunk's
  loss, evaluation, metrics (the step is the loop's, :func:`dynlm.training.train_step`);
* :class:`~dynlm.tasks.report_role.TaskReport` (``report_role.py``): tables, figures, the
  search figure's objective, serving.

Roles that only some tasks have are :class:`typing.Protocol` classes checked with
``isinstance`` (:class:`~dynlm.tasks.report_role.NameSuggester`) or a flag with a member
(``dynamic_evaluation``).
"""

from __future__ import annotations

from typing import ClassVar

from dynlm.tasks.batch_role import TaskBatching
from dynlm.tasks.data_role import PARSED_COLUMNS, TaskData, parsed_schema
from dynlm.tasks.model_role import TaskModel
from dynlm.tasks.report_role import SERVING_TYPES, NameSuggester, ObjectiveDisplay, TaskReport

__all__ = ["PARSED_COLUMNS", "SERVING_TYPES", "NameSuggester", "ObjectiveDisplay", "Task", "parsed_schema"]


class Task(TaskData, TaskBatching, TaskModel, TaskReport):
    """One kind of data + model family: the four roles. A subclass sets ``name`` (the key in
    :data:`dynlm.tasks.TASKS` and of the job's ``task:`` field) and each role's required members."""

    name: ClassVar[str]
