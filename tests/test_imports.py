"""Every module imports on a machine without TensorRT, and importing them does not import tensorrt; the import
graph has no cycles and no module imports another's private names (DESIGN.md, "Packages and who may import
whom")."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SCRIPT = """
import importlib, pkgutil, sys
sys.modules["tensorrt"] = None  # as if TensorRT were not installed, even where it is
names = []
for package in ("converters", "passes", "pipeline"):
    module = importlib.import_module(package)
    names.append(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        if info.name != "pipeline.__main__":
            importlib.import_module(info.name)
            names.append(info.name)
import pipeline
print(len(names), pipeline.backends.select_backend("auto").name)
"""


def test_every_module_imports_without_tensorrt() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    count, backend = done.stdout.split()
    assert int(count) >= 15
    assert backend == "onnxruntime"


def test_layering_nothing_below_pipeline_imports_it() -> None:
    """converters/ and passes/ must not import pipeline (the design's one-way flow)."""
    root = Path(__file__).resolve().parents[1]
    offenders = [
        str(path.relative_to(root))
        for package in ("converters", "passes")
        for path in (root / package).rglob("*.py")
        if any(line.strip().startswith(("import pipeline", "from pipeline")) for line in path.read_text().splitlines())
    ]
    assert offenders == []
    converters_importing_passes = [
        str(p.relative_to(root))
        for p in (root / "converters").rglob("*.py")
        if "from passes" in p.read_text() or "import passes" in p.read_text()
    ]
    assert converters_importing_passes == []


# -- no import cycles, no private imports ------------------------------------------------------------------------

PACKAGES = ("pipeline", "passes", "converters")


@dataclass(frozen=True)
class ImportGraph:
    """Module -> the project modules it imports (with the line of the first such import), and every import of
    another module's private (``_name``) name, as ``(module, line, what)``."""

    edges: dict[str, dict[str, int]]
    private: list[tuple[str, int, str]]


def module_files(root: Path, packages: Sequence[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``packages`` under ``root`` (``__init__`` is the
    package itself)."""
    files = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, inside functions too, except the bodies of ``if TYPE_CHECKING:`` (their ``else`` counts)."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _runtime_nodes(other)
            continue
        yield child
        yield from _runtime_nodes(child)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def import_graph(root: Path, packages: Sequence[str] = PACKAGES) -> ImportGraph:
    """The import graph of ``packages`` under ``root``, read from the source (nothing is imported)."""
    files = module_files(root, packages)
    edges: dict[str, dict[str, int]] = {}
    private: list[tuple[str, int, str]] = []
    for name, path in files.items():
        out = edges.setdefault(name, {})
        aliases: dict[str, str] = {}  # local name -> project module it is bound to
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in files:
                        out.setdefault(alias.name, node.lineno)
                        aliases[alias.asname or alias.name] = alias.name
                        private += [(name, node.lineno, alias.name)] * any(map(_private, alias.name.split(".")))
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                source = ".".join([*base, *([node.module] if node.module else [])])
                if source.split(".")[0] not in packages:
                    continue
                for alias in node.names:
                    target = f"{source}.{alias.name}"
                    if target in files:  # ``from pkg import module``: an edge to that module
                        out.setdefault(target, node.lineno)
                        aliases[alias.asname or alias.name] = target
                    else:
                        out.setdefault(source, node.lineno)
                    if _private(alias.name) and source != name:
                        private.append((name, node.lineno, f"{source}.{alias.name}"))
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                owner = aliases.get(node.value.id) if isinstance(node.value, ast.Name) else None
                if owner is not None and owner != name:
                    private.append((name, node.lineno, f"{owner}.{node.attr}"))
    return ImportGraph({m: {t: line for t, line in out.items() if t != m} for m, out in edges.items()}, private)


def import_cycles(edges: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each holds at least one cycle), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan; the module graph is small, recursion is fine
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in edges.get(module, {}):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return sorted(found)


def describe_cycles(graph: ImportGraph) -> str:
    """Each cycle with the imports that make it (``a:12 -> b``), for the assertion message."""
    lines = []
    for component in import_cycles(graph.edges):
        lines.append("cycle among " + ", ".join(component))
        members = set(component)
        lines += [
            f"  {module}:{line} -> {target}"
            for module in component
            for target, line in graph.edges[module].items()
            if target in members
        ]
    return "\n".join(lines)


def test_no_import_cycles_among_the_projects_modules() -> None:
    """Imports inside functions count; ``if TYPE_CHECKING:`` imports do not."""
    graph = import_graph(Path(__file__).resolve().parents[1])
    assert len(graph.edges) >= 80
    assert import_cycles(graph.edges) == [], describe_cycles(graph)


def test_no_module_imports_another_modules_private_names() -> None:
    graph = import_graph(Path(__file__).resolve().parents[1])
    assert graph.private == []


SYNTHETIC = {
    "pkg/__init__.py": "from pkg.api import run\n",
    "pkg/api.py": "from pkg import engine\n\ndef run():\n    return engine.go()\n",
    "pkg/engine.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.report import Report\n"  # type-only: no edge
        "def go():\n    from pkg.report import render\n    return render()\n"  # in a function: an edge
    ),
    "pkg/report.py": "from . import api\nfrom pkg.engine import _helper\n\ndef render():\n    return api\n",
    "pkg/leaf.py": "import pkg.engine as engine\n\nx = engine._state\n",
    "other/__init__.py": "",
    "other/tool.py": "from pkg.report import render\n",
}


def test_the_detectors_find_a_cycle_and_private_imports_in_a_synthetic_package(tmp_path: Path) -> None:
    for relative, text in SYNTHETIC.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    graph = import_graph(tmp_path, ("pkg", "other"))
    assert graph.edges["pkg.engine"] == {"pkg.report": 5}  # the function-level import, not the TYPE_CHECKING one
    assert graph.edges["pkg.api"] == {"pkg.engine": 1}  # ``from pkg import engine`` names the submodule
    assert graph.edges["pkg.report"] == {"pkg.api": 1, "pkg.engine": 2}  # relative import resolved
    assert import_cycles(graph.edges) == [["pkg.api", "pkg.engine", "pkg.report"]]
    assert "pkg.engine:5 -> pkg.report" in describe_cycles(graph)
    assert graph.private == [("pkg.leaf", 3, "pkg.engine._state"), ("pkg.report", 2, "pkg.engine._helper")]
    # cut the function-level import and nothing is left
    (tmp_path / "pkg/engine.py").write_text("def go():\n    return 1\n")
    assert import_cycles(import_graph(tmp_path, ("pkg", "other")).edges) == []
