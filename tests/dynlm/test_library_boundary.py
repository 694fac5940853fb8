"""dynlm is a pure library: no module imports ray or mlflow, and nothing imports pipelines."""

from __future__ import annotations

import ast
from pathlib import Path

import dynlm

FORBIDDEN = ("ray", "mlflow", "pipelines")
DYNLM_ROOT = Path(dynlm.__file__).resolve().parent


def imported_modules(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, top-level module) of every import statement, including ones inside functions."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)
              and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value.split(".")[0]))
    return found


def test_checker_catches_every_import_form():
    source = "import ray.train\nfrom mlflow import log\ndef f():\n    import pipelines.cli\nimportlib.import_module('ray')\n"
    assert [m for _, m in imported_modules(source, "x.py")] == ["ray", "mlflow", "pipelines", "ray"]


def test_dynlm_never_imports_ray_mlflow_or_pipelines():
    files = sorted(DYNLM_ROOT.rglob("*.py"))
    assert len(files) > 10 and (DYNLM_ROOT / "data" / "readers.py") in files
    violations = [
        f"{path.relative_to(DYNLM_ROOT.parent)}:{line} imports {module}"
        for path in files
        for line, module in imported_modules(path.read_text(encoding="utf-8"), str(path))
        if module in FORBIDDEN
    ]
    assert violations == []
