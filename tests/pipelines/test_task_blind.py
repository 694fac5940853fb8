"""The runner and the shared library are task-blind (issue 36): outside ``dynlm/tasks/`` no code
asks which task it has (``task.name ==``, ``base.task == "lm"``), probes a task for a member
(``hasattr(task, ...)``) or imports the LM task (docs may name it); a task's abilities are its members and roles
(``Task.dynamic_evaluation``, ``dynlm.tasks.base.NameSuggester``)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ASKING = re.compile(r"""task\.name\s*[!=]=|\.task\s*[!=]=\s*["']|hasattr\(\s*task\b"""
                    r"""|^\s*from dynlm\.tasks\.lm import|import .*\bLMTask\b""")


def offenders(repo: Path, folders: tuple[str, ...] = ("pipelines", "dynlm")) -> list[str]:
    """``path:line: text`` of every line of the Python files under ``repo``'s ``folders``
    (``dynlm/tasks/`` left out) that asks which task it has."""
    found = []
    for folder in folders:
        for path in sorted((repo / folder).rglob("*.py")):
            relative = path.relative_to(repo)
            if relative.parts[:2] == ("dynlm", "tasks"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if ASKING.search(line):
                    found.append(f"{relative}:{number}: {line.strip()}")
    return found


def test_no_code_outside_the_tasks_asks_which_task_it_has():
    assert offenders(REPO) == []


def test_the_check_finds_a_task_name_test(tmp_path):
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "dynlm" / "tasks").mkdir(parents=True)
    (tmp_path / "pipelines" / "cmd.py").write_text('if task.name == "lm":\n    pass\nif hasattr(task, "x"):\n    pass\n'
                                                  '    from dynlm.tasks.lm import LMTask\n# LMTask.batches does it\n')
    (tmp_path / "dynlm" / "tasks" / "lm.py").write_text('class LMTask:\n    pass\n')  # the tasks' own: allowed
    assert offenders(tmp_path) == ['pipelines/cmd.py:1: if task.name == "lm":',
                                   'pipelines/cmd.py:3: if hasattr(task, "x"):',
                                   'pipelines/cmd.py:5: from dynlm.tasks.lm import LMTask']
