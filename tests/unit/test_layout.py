"""The layout rules no linter checks: benchmarks import no tests, and no two modules share a
name with different jobs where they sit side by side (the layers themselves are checked by
lint-imports in ./scripts/test)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_benchmarks_import_no_tests():
    offenders = {path.name: sorted(m for m in imported_modules(path)
                                   if m == "tests" or m.startswith("tests."))
                 for path in (ROOT / "benchmarks").glob("*.py")}
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_every_python_package_is_a_regular_package():
    """A directory of modules without ``__init__.py`` is a namespace package: import-linter
    cannot check it and its docstring (what the package is for) has nowhere to live."""
    missing = [str(d.relative_to(ROOT)) for top in ("otela", "ingress", "simulator", "traces")
               for d in (ROOT / top).rglob("*") if d.is_dir() and d.name != "__pycache__"
               and any(d.glob("*.py")) and not (d / "__init__.py").exists()]
    assert missing == []
