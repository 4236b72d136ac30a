"""Every module imports on a machine without TensorRT, and importing them does not import tensorrt; the import
graph has no cycles and no module imports another's private names; inside ``pipeline/`` no import runs back up its
layers, and loading an artifact and calling it imports the runtime alone (DESIGN.md, "Packages and who may import
whom")."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

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
print(len(names), pipeline.runtime.executors.select_backend("auto").name)
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


def _runtime_nodes(tree: ast.AST, type_only: bool = False) -> Iterator[ast.AST]:
    """Every node, inside functions too, except the bodies of ``if TYPE_CHECKING:`` (their ``else`` counts) unless
    ``type_only``."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and _is_type_checking(child.test) and not type_only:
            for other in child.orelse:
                yield other
                yield from _runtime_nodes(other, type_only)
            continue
        yield child
        yield from _runtime_nodes(child, type_only)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def import_graph(root: Path, packages: Sequence[str] = PACKAGES, type_only: bool = False) -> ImportGraph:
    """The import graph of ``packages`` under ``root``, read from the source (nothing is imported); ``type_only``
    counts the imports under ``if TYPE_CHECKING:`` too."""
    files = module_files(root, packages)
    edges: dict[str, dict[str, int]] = {}
    private: list[tuple[str, int, str]] = []
    for name, path in files.items():
        out = edges.setdefault(name, {})
        aliases: dict[str, str] = {}  # local name -> project module it is bound to
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path)), type_only):
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
    """Imports inside functions count, and so do ``if TYPE_CHECKING:`` imports (a circle of annotations is still two
    modules that cannot be read apart)."""
    graph = import_graph(Path(__file__).resolve().parents[1], type_only=True)
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


# -- the layers of pipeline/ --------------------------------------------------------------------------------------

#: pipeline/'s units, bottom to top: a module may import modules of its own unit and of the units before it, never
#: one after it (a module belongs to the longest unit that prefixes it). The first four are the base every layer
#: reads; ``pipeline.runtime`` is the runtime a deployment imports alone (artifacts, executors, the converted modules,
#: the generation loop, the reports as data); everything after it is the conversion, in the order its stages are
#: built on each other; the CLI and the package's facade (``pipeline``, its names loaded on first use) stand on top.
PIPELINE_UNITS = (
    "pipeline.settings",
    "pipeline.versions",
    "pipeline.noise",
    "pipeline.progress",
    "pipeline.runtime",
    "pipeline.serving",  # Triton: serving artifacts and exporting model repositories (the runtime alone)
    "pipeline.accuracy",  # the accuracy policy: tolerances, anchors, statistics (validation, comparison, stages)
    "pipeline.exporting",
    "pipeline.validation",
    "pipeline.precision",
    "pipeline.compatibility.data",  # the parser's static table, which the segment builder reads
    "pipeline.compatibility.ops",
    "pipeline.compatibility.rules",
    "pipeline.compatibility.static",
    "pipeline.backends",  # building engines (loading them is the runtime's)
    "pipeline.compatibility",  # the real parser's verdict (it parses with the build's parser)
    "pipeline.comparison",
    "pipeline.quantize",
    "pipeline.rewrite",
    "pipeline.final_graph",
    "pipeline.generation",  # converting a generative model: the step graph and its validation
    "pipeline.refitting",
    "pipeline.conversion",
    "pipeline.first_call",
    "pipeline.testing",
    "pipeline",  # the facade: exactly pipeline/__init__.py
    "pipeline.cli",
    "pipeline.__main__",
)

#: What the runtime may read of the packages below pipeline/: errors, files, settings, plugin records, model I/O and
#: the format facts of the graphs it runs; not the converters, the passes or their machinery.
RUNTIME_MAY_IMPORT = (
    "converters",
    "converters.errors",
    "converters.files",
    "converters.lazy",
    "converters.settings",
    "converters.setting_choices",
    "converters.block_settings",
    "converters.generation_settings",
    "converters.shapes",
    "converters.plugins",
    "converters.plugins.nodes",
    "converters.plugins.shapes",
    "converters.plugins.spec",
    "passes",
    "passes.records",
    "passes.model_io",
    "passes.model_io.external_data",
    "passes.model_io.weightless",
    "passes.model_io.gc_pause",
    "passes.model_io.graphs",
    "passes.model_io.onnx_export",
    "passes.model_io.onnx_import",
    "passes.precision",
    "passes.precision.types",
    "passes.quantize",
    "passes.quantize.blockwise",
    "passes.quantize.dynamic_fp4",
    "passes.quantize.formats",
)
BASE_UNITS = PIPELINE_UNITS[:4]


def pipeline_unit(module: str) -> int | None:
    """The index in :data:`PIPELINE_UNITS` of ``module``'s unit (None outside pipeline/)."""
    if module == "pipeline":
        return PIPELINE_UNITS.index("pipeline")
    found = [i for i, unit in enumerate(PIPELINE_UNITS) if unit != "pipeline" and (module + ".").startswith(unit + ".")]
    return max(found, key=lambda i: len(PIPELINE_UNITS[i])) if found else None


def upward_imports(graph: ImportGraph) -> list[str]:
    """Every import inside pipeline/ from a unit to a later one, as ``module:line -> target``."""
    found = []
    for module, targets in sorted(graph.edges.items()):
        here = pipeline_unit(module)
        for target, line in targets.items():
            there = pipeline_unit(target)
            if here is not None and there is not None and there > here:
                found.append(f"{module}:{line} -> {target}")
    return found


def test_every_pipeline_module_has_a_layer() -> None:
    graph = import_graph(Path(__file__).resolve().parents[1])
    unplaced = [m for m in graph.edges if m.startswith("pipeline") and pipeline_unit(m) is None]
    assert unplaced == [], "add their unit to PIPELINE_UNITS"


def test_no_import_inside_pipeline_runs_back_up_its_layers() -> None:
    """Imports inside functions and under ``if TYPE_CHECKING:`` count, except the facade's type-only names."""
    root = Path(__file__).resolve().parents[1]
    graph = import_graph(root, type_only=True)
    graph.edges["pipeline"] = import_graph(root).edges["pipeline"]  # its TYPE_CHECKING block names the public API
    assert upward_imports(graph) == []


def test_the_runtime_reads_only_its_share_of_converters_and_passes() -> None:
    graph = import_graph(Path(__file__).resolve().parents[1], type_only=True)
    runtime = [m for m in graph.edges if pipeline_unit(m) is not None and pipeline_unit(m) <= 4]  # base + runtime
    outside = sorted(
        f"{m} -> {t}"
        for m in runtime
        for t in graph.edges[m]
        if not t.startswith("pipeline") and t not in RUNTIME_MAY_IMPORT
    )
    assert outside == []


def test_the_layer_rule_finds_an_import_that_runs_back_up() -> None:
    edges = {
        "pipeline.runtime.module": {"pipeline.comparison.run": 3, "pipeline.settings": 1},
        "pipeline.conversion": {"pipeline.runtime.module": 9},
        "pipeline.cli.generate": {"pipeline": 2},
        "pipeline": {"pipeline.backends": 5},
    }
    assert upward_imports(ImportGraph(edges, [])) == ["pipeline.runtime.module:3 -> pipeline.comparison.run"]
    assert pipeline_unit("pipeline.compatibility.static") < pipeline_unit("pipeline.backends")
    assert pipeline_unit("pipeline.compatibility.real") > pipeline_unit("pipeline.backends")
    assert pipeline_unit("pipeline.precision.stage") == PIPELINE_UNITS.index("pipeline.precision")


LOAD_AND_CALL = """
import json, sys
import torch
import pipeline
module = pipeline.load(sys.argv[1])
if hasattr(module, "generate"):
    module.generate(torch.tensor([[3, 1, 4]]), max_new_tokens=2)
else:
    module(torch.randn(2, 8))
print(json.dumps(sorted(sys.modules)))
"""

#: Third-party packages only the conversion uses: none of them may load with an artifact.
CONVERSION_ONLY = ("onnxscript", "onnx_ir", "polygraphy", "transformers", "tensorrt", "tensorrt_rtx")


def conversion_modules(loaded: Sequence[str]) -> list[str]:
    """The modules of ``loaded`` that belong to the conversion: pipeline/ above the runtime, converters and passes
    beyond the runtime's share, and the conversion's own third-party packages."""
    above_runtime = PIPELINE_UNITS.index("pipeline.runtime")

    def of_conversion(name: str) -> bool:
        unit = pipeline_unit(name)
        if name.startswith("pipeline"):
            return name != "pipeline" and unit is not None and unit > above_runtime
        if name.split(".")[0] in ("converters", "passes"):
            return name not in RUNTIME_MAY_IMPORT
        return name.split(".")[0] in CONVERSION_ONLY

    ours = [name for name in loaded if of_conversion(name)]
    return ours


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A plain artifact and a generation artifact (a tiny random Llama, not validated: only the loading is tested)."""
    import importlib.util

    import torch

    import pipeline

    out = tmp_path_factory.mktemp("artifacts")
    plain = pipeline.convert(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(), torch.randn(2, 8))
    spec = importlib.util.spec_from_file_location("tiny_llama", ROOT / "examples" / "tiny_llama.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    llama, ids = example.build()
    generative = pipeline.convert(llama, ids, generation={"max_length": 16, "max_batch": 1}, validate=False)
    return {"plain": plain.save(out / "plain.ptrt"), "generation": generative.save(out / "generation.ptrt")}


@pytest.mark.parametrize("kind", ["plain", "generation"])
def test_load_and_call_import_no_conversion_module(artifacts: dict[str, Path], kind: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOAD_AND_CALL, str(artifacts[kind])], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert "pipeline.runtime.loading" in loaded  # the probe did load through the runtime
    assert conversion_modules(loaded) == []
    # the conversion report is read from the artifact when asked for (30 ms of imports a load does not pay)
    assert [m for m in loaded if m.startswith("pipeline.runtime.reports")] == []


def test_the_probe_would_see_a_conversion_module() -> None:
    assert conversion_modules(
        ["pipeline.runtime.module", "pipeline.comparison.run", "onnxscript.ir", "passes.base"]
    ) == [
        "pipeline.comparison.run",
        "onnxscript.ir",
        "passes.base",
    ]


CLI_ON_ARTIFACT = """
import json, sys
from pipeline.cli import main
assert main(sys.argv[1:]) == 0
print(json.dumps(sorted(sys.modules)))
"""

#: What the command line may load on its runtime paths besides itself: the comparison package's names (the runner
#: names and defaults the ``compare`` subcommand offers), which import nothing.
CLI_NAMES = ("pipeline.comparison",)


@pytest.mark.parametrize(
    "command",
    [
        ["generate", "{generation}", "--prompt-ids", "3,1,4", "--max-new-tokens", "2"],
        ["bench", "{generation}", "--generate", "--prompt-length", "4", "--new-tokens", "2", "--iterations", "1"],
        ["bench", "{plain}", "--input", "input:2x8", "--warmup", "1", "--iterations", "2"],
        ["inspect", "{plain}"],
    ],
    ids=["generate", "bench-generate", "bench", "inspect"],
)
def test_the_cli_on_an_artifact_imports_no_conversion_module(artifacts: dict[str, Path], command: list[str]) -> None:
    argv = [part.format(**{k: str(v) for k, v in artifacts.items()}) for part in command]
    done = subprocess.run([sys.executable, "-c", CLI_ON_ARTIFACT, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert [m for m in conversion_modules(loaded) if not m.startswith("pipeline.cli") and m not in CLI_NAMES] == []


CLI_VERSION = """
import contextlib, json, sys
from pipeline.cli import main
with contextlib.suppress(SystemExit):  # argparse's --version exits
    main(["--version"])
print(json.dumps(sorted(sys.modules)))
"""


def test_the_cli_parser_imports_no_torch() -> None:
    """``pipeline --version`` and ``--help`` answer without importing torch (3 s of CPU on this machine): each command
    imports what it runs with."""
    done = subprocess.run([sys.executable, "-c", CLI_VERSION], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("pipeline "), done.stdout + done.stderr
    assert "torch" not in json.loads(done.stdout.splitlines()[-1])


CLI_STATIC_CHECK = """
import json, sys
from pipeline.cli import main
assert main(["check", sys.argv[1], "--parser", "static"]) == 0
print(json.dumps(sorted(sys.modules)))
"""


def test_the_static_check_imports_no_torch(tmp_path: Path) -> None:
    """``pipeline check model.onnx --parser static`` judges an ONNX file against the operator table alone: no torch."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "relu.onnx")
    run = [sys.executable, "-c", CLI_STATIC_CHECK, str(tmp_path / "relu.onnx")]
    done = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(1 supported)" in done.stdout, done.stdout
    assert "torch" not in json.loads(done.stdout.splitlines()[-1])
