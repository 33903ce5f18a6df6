"""The import contracts of pyproject.toml ([tool.importlinter]) hold, and dashboard/ hides no import in a function."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Django loads an app's modules only once its registry is ready: AppConfig.ready() is where they are imported.
ALLOWED_LOCAL_IMPORTS = {("dashboard/apps.py", "ready")}


def test_it_keeps_the_import_contracts():
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def function_local_imports(path: Path) -> list[tuple[str, int, str]]:
    """(function, line, module) of every `from dashboard...` / `import dashboard...` inside a function."""
    found = []
    for func in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            found += [(func.name, node.lineno, name) for name in names if name.split(".")[0] == "dashboard"]
    return found


def test_it_finds_a_function_local_import(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(
        "from dashboard import models\n\ndef f():\n    from dashboard import tasks\n\n"
        "async def g():\n    import dashboard.live\n"
    )
    assert function_local_imports(path) == [("f", 4, "dashboard"), ("g", 7, "dashboard.live")]


def test_it_has_no_function_local_dashboard_import():
    """One that only dodges an import cycle hides the cycle: the layers must make it unneeded."""
    hidden = [
        (str(path.relative_to(REPO)), *found)
        for path in sorted((REPO / "dashboard").rglob("*.py"))
        if "migrations" not in path.parts
        for found in function_local_imports(path)
    ]
    assert [h for h in hidden if (h[0], h[1]) not in ALLOWED_LOCAL_IMPORTS] == []
