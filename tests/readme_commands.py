"""The README's commands as a user copies them: the lines of a task's bash block, each run through
the real ``dynlm`` entry point (``pipelines.cli.main``) in the current folder, its words unchanged.

What a test may add is explicit: ``cuts`` (arguments appended to a verb's lines, which only shrink
sizes for time: epochs, dimensions, samples) and the ``<key>`` of a prepared folder, which the
README leaves to the user to paste from what ``dynlm prepare`` printed. A line that is not a
``dynlm`` command fails the test, so the block stays runnable as written.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
#: What a fresh clone brings that the README's commands read (the job and search-space files).
CLONE_FILES = ("configs", "tune_spaces")


def readme_block(heading: str) -> list[list[str]]:
    """The command lines (split as a shell does, comments dropped) of the first bash block under
    the README heading ``heading`` (the whole heading line, e.g. ``"### The naming task: ..."``)."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    body = text[text.index("```bash\n", start) + len("```bash\n"):]
    body = body[:body.index("```")]
    return [words for line in body.splitlines() if (words := shlex.split(line, comments=True))]


def fresh_clone(folder: Path) -> None:
    """Make ``folder`` (empty) look like the root of a fresh clone to the commands: the files they
    read, nothing they write (no ``runs/``, no ``mlflow.db``)."""
    for name in CLONE_FILES:
        (folder / name).symlink_to(REPO / name, target_is_directory=True)


def argv(words: list[str], cuts: Callable[[list[str]], list[str]], key: str | None = None) -> list[str]:
    """``main``'s arguments for a README line: without the leading ``dynlm``, ``<key>`` replaced by
    ``key``, then ``cuts(arguments)`` appended."""
    assert words[0] == "dynlm", f"not a dynlm command: {shlex.join(words)}"
    args = words[1:]
    if any("<key>" in word for word in args):
        assert key is not None, f"{shlex.join(words)} needs a prepared folder's key; none was printed yet"
        args = [word.replace("<key>", key) for word in args]
    return [*args, *cuts(args)]


def sets(*items: str) -> list[str]:
    """``--set`` arguments for ``items``."""
    return [arg for item in items for arg in ("--set", item)]
