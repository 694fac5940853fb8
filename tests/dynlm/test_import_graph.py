"""The library imports in one direction: no module of ``dynlm/`` reaches itself through its
imports (the task contract, issue 36: tasks import the loop, the loop never a task).
``test_library_boundary.py`` checks that it never imports the runner."""

from __future__ import annotations

import ast
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[2] / "dynlm"


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = LIBRARY) -> dict[str, set[str]]:
    """``{module: the dynlm modules it imports}``, from every ``import`` statement of every file
    (inside functions and ``TYPE_CHECKING`` too:
    a lazy import is still a dependency). ``from a.b import c`` names ``a.b.c`` when that is a
    module, else ``a.b``."""
    files = {_module_name(path, root): path for path in root.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level - 1
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            else:
                continue
            for target in targets:
                while target and target not in files:  # the nearest enclosing module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
                    break
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_library_has_no_import_cycle():
    graph = import_graph()
    assert "dynlm.training" in graph and "dynlm.tasks.lm" in graph["dynlm.tasks"]
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle(tmp_path):
    """The check can fail: two modules importing each other (one lazily) are one cycle."""
    package = tmp_path / "dynlm"
    (package / "tasks").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tasks" / "__init__.py").write_text("from dynlm.tasks.lm import LMTask\n")
    (package / "tasks" / "lm.py").write_text("from dynlm import training\n")
    (package / "training.py").write_text("def default():\n    from dynlm.tasks.lm import LMTask\n")
    graph = import_graph(package)
    assert cycles(graph) == [["dynlm.tasks.lm", "dynlm.training"]]

