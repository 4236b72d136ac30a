"""Every public module, class and function of the three packages says what it is (a docstring)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "passes", "converters")


def missing_docstrings() -> list[str]:
    """``file:line name`` of every public module, class, function and method without a docstring."""
    missing = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            where = path.relative_to(ROOT)
            if path.name != "__main__.py" and not ast.get_docstring(tree):
                missing.append(f"{where}: module")
            missing += _walk(tree.body, str(where), "")
    return missing


def _walk(body: list[ast.stmt], where: str, prefix: str) -> list[str]:
    out = []
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and not node.name.startswith("_"):
            if not ast.get_docstring(node):
                out.append(f"{where}:{node.lineno} {prefix}{node.name}")
            if isinstance(node, ast.ClassDef):
                out += _walk(node.body, where, f"{node.name}.")
    return out


def test_every_public_name_has_a_docstring() -> None:
    missing = missing_docstrings()
    assert not missing, "public names without a docstring:\n" + "\n".join(missing)
