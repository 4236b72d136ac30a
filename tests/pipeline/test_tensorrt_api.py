"""TensorRT API conformance: every TensorRT name our code uses exists in TensorRT 10.16 and in 11.4.

The names are read from our source with ``ast``, so a name someone adds is checked without editing this file.
In every module under ``pipeline/`` that imports ``tensorrt``:

- attribute chains on the module: ``trt.MemoryPoolType.WORKSPACE``, ``trt.OnnxParser``;
- attributes of a variable annotated with a TensorRT class: after ``context: trt.IExecutionContext = ...``,
  ``context.set_input_shape`` is ``IExecutionContext.set_input_shape`` (the annotation is the convention that
  makes a method call checkable, see ``pipeline.backends.tensorrt.build``);
- methods a subclass of a TensorRT interface defines (``reallocate_output`` of an ``IOutputAllocator``), checked
  against the interface's documented methods (pybind11 does not expose overridable methods as attributes);
- what Polygraphy does in TensorRT for each option we pass its TensorRT loaders (the table below).

A name inside ``if trt_major() >= 11:`` (any comparison with an int) is checked only against the versions the
condition admits, and a name in its ``else`` against the others. Each version is checked in a subprocess with the
real bindings from the shared trt-api tool (``../shared/tools/trt-api``; CI has it).
"""

from __future__ import annotations

import ast
import json
import operator
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from test_backends import SETUP, VERSIONS, prepare_trt_api

ROOT = Path(__file__).resolve().parents[2]

#: What Polygraphy 0.53 does in TensorRT for each option our code passes to its TensorRT loaders (read from
#: polygraphy/backend/trt/{loader,config,runner}.py). An option missing here fails the test: add its names.
POLYGRAPHY_OPTIONS: dict[str, tuple[str, ...]] = {
    "CreateNetwork.strongly_typed": ("Builder.create_network", "NetworkDefinitionCreationFlag.STRONGLY_TYPED"),
    "CreateConfig.tf32": ("BuilderFlag.TF32", "IBuilderConfig.set_flag", "IBuilderConfig.clear_flag"),
    "CreateConfig.profiles": (
        "Builder.create_optimization_profile",
        "IOptimizationProfile.set_shape",
        "IBuilderConfig.add_optimization_profile",
    ),
    "CreateConfig.memory_pool_limits": ("IBuilderConfig.set_memory_pool_limit",),
    "CreateConfig.builder_optimization_level": ("IBuilderConfig.builder_optimization_level",),
    "CreateConfig.hardware_compatibility_level": ("IBuilderConfig.hardware_compatibility_level",),
    "CreateConfig.version_compatible": ("BuilderFlag.VERSION_COMPATIBLE", "IBuilderConfig.set_flag"),
    "CreateConfig.load_timing_cache": ("IBuilderConfig.create_timing_cache", "IBuilderConfig.set_timing_cache"),
    "EngineBytesFromNetwork.save_timing_cache": (
        "Builder.build_serialized_network",
        "IBuilderConfig.get_timing_cache",
        "ITimingCache.combine",
        "ITimingCache.serialize",
    ),
    "TrtRunner.name": (),
    "PostprocessConfig.func": (),  # our own function, whose TensorRT names are read from our source
}

CHECK = """
import json, sys
import tensorrt as trt

def exists(name, kind):
    head, _, rest = name.partition(".")
    if kind == "override":  # an overridable method of an interface: documented in the class docstring
        cls = getattr(trt, head, None)
        return cls is not None and (hasattr(cls, rest) or f"def {rest}(" in (cls.__doc__ or ""))
    obj = trt
    for part in name.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True

uses = json.load(sys.stdin)
print(json.dumps(sorted({name for name, kind in uses if not exists(name, kind)})))
"""

COMPARE: dict[type[ast.cmpop], Callable[[int, int], bool]] = {
    ast.GtE: operator.ge,
    ast.Gt: operator.gt,
    ast.LtE: operator.le,
    ast.Lt: operator.lt,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


@dataclass(frozen=True)
class Use:
    """One TensorRT name (a path under the ``tensorrt`` module) used at ``where``, under version conditions."""

    name: str
    where: str
    kind: str = "attribute"  # or "override"
    guards: tuple[tuple[type[ast.cmpop], int, bool], ...] = ()  # (comparison, major, holds) from enclosing ifs

    def applies_to(self, major: int) -> bool:
        return all(COMPARE[op](major, value) == holds for op, value, holds in self.guards)


def collect(source: str, filename: str, module: str = "tensorrt") -> list[Use]:
    """Every name of ``module`` (TensorRT, or ``tensorrt_rtx``) ``source`` uses; empty if it does not import it.

    A variable assigned ``library.import_module()`` (the library-parametrised code of the TensorRT backends) is the
    module too: ``tensorrt = library.import_module(); tensorrt.Builder(...)`` uses ``Builder``.
    """
    tree = ast.parse(source)
    imports = [a for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names if a.name == module]
    roots = {a.asname or a.name for a in imports}
    if roots:
        roots |= {
            t.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Call)
            and (_dotted(n.value.func) or "").endswith(".import_module")
            for t in n.targets
            if isinstance(t, ast.Name)
        }
    imported = [
        f"{filename}:{n.lineno}"
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.module or "") in (module, *(f"{module}.{x}" for x in ("plugin",)))
    ]
    assert not imported, f"write `import {module} as trt` and `trt.Name`, not `from {module} import` ({imported})"
    if not roots:
        return []
    collector = _Collector(roots, tree, filename)
    collector.visit(tree)
    assert not collector.unannotated, (
        f"annotate the TensorRT objects assigned at {', '.join(collector.unannotated)} with their class "
        "(x: trt.Runtime = trt.Runtime(...)): their attributes cannot be checked otherwise"
    )
    return collector.uses


def polygraphy_options(source: str) -> set[str]:
    """``Loader.keyword`` for every keyword our code passes to a name imported from polygraphy.backend.trt."""
    tree = ast.parse(source)
    loaders = {
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("polygraphy.backend.trt")
        for a in n.names
    }
    return {
        f"{n.func.id}.{k.arg}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in loaders
        for k in n.keywords
    }


class _Collector(ast.NodeVisitor):
    """Walks a module with the TensorRT classes of annotated names in scope: ``self.x`` annotations and module
    level ones everywhere, a function's annotated arguments and locals inside it."""

    def __init__(self, roots: set[str], tree: ast.Module, filename: str) -> None:
        self.roots, self.filename = roots, filename
        module = [n for n in ast.walk(tree) if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Attribute)]
        module += [n for n in tree.body if isinstance(n, ast.AnnAssign)]
        self.scopes = [self._typed(module, [])]
        self.guards: tuple[tuple[type[ast.cmpop], int, bool], ...] = ()
        self.uses: list[Use] = []
        self.unannotated: list[str] = []  # `x = trt.Factory(...)`: x's later uses could not be checked

    def _typed(self, assignments: list[ast.AnnAssign], args: list[ast.arg]) -> dict[str, str]:
        typed = {a.arg: cls for a in args if a.annotation and (cls := _trt_class(a.annotation, self.roots))}
        for node in assignments:
            if (target := _dotted(node.target)) and (cls := _trt_class(node.annotation, self.roots)):
                typed[target] = cls
        return typed

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        local = [n for n in ast.walk(node) if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
        args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs, node.args.vararg, node.args.kwarg]
        self.scopes.append(self._typed(local, [a for a in args if a is not None]))
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def lookup(self, name: str) -> str | None:
        return next((scope[name] for scope in reversed(self.scopes) if name in scope), None)

    def add(self, name: str, node: ast.AST, kind: str = "attribute") -> None:
        self.uses.append(Use(name, f"{self.filename}:{getattr(node, 'lineno', '?')}", kind, self.guards))

    def visit_If(self, node: ast.If) -> None:
        guard = _version_guard(node.test)
        if guard is None:
            self.generic_visit(node)
            return
        outer = self.guards
        for holds, body in ((True, node.body), (False, node.orelse)):
            self.guards = (*outer, (*guard, holds))
            for statement in body:
                self.visit(statement)
        self.guards = outer

    def visit_Assign(self, node: ast.Assign) -> None:
        if isinstance(node.value, ast.Call) and (_dotted(node.value.func) or ".").split(".")[0] in self.roots:
            self.unannotated.append(f"{self.filename}:{node.lineno}")
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            if cls := _trt_class(base, self.roots):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name != "__init__":
                        self.add(f"{cls}.{item.name}", item, "override")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        parts = (_dotted(node) or "").split(".")
        if parts[0] in self.roots:
            self.add(".".join(parts[1:]), node)
            return
        for cut in range(len(parts) - 1, 0, -1):
            if (cls := self.lookup(".".join(parts[:cut]))) is not None:
                self.add(".".join([cls, *parts[cut:]]), node)
                return
        self.generic_visit(node)


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (head := _dotted(node.value)):
        return f"{head}.{node.attr}"
    return None


def _trt_class(annotation: ast.AST, roots: set[str]) -> str | None:
    """``IExecutionContext`` for ``trt.IExecutionContext`` (also inside ``X | None`` and string annotations)."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return _trt_class(ast.parse(annotation.value, mode="eval").body, roots)
    if isinstance(annotation, ast.BinOp):
        return _trt_class(annotation.left, roots) or _trt_class(annotation.right, roots)
    head, _, rest = (_dotted(annotation) or "").partition(".")
    return rest if head in roots and rest else None


def _version_guard(test: ast.expr) -> tuple[type[ast.cmpop], int] | None:
    """(comparison, major) for the one guard form, ``trt_major() OP <int>``."""
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and type(test.ops[0]) in COMPARE
        and isinstance(test.left, ast.Call)
        and (_dotted(test.left.func) or "").endswith("trt_major")
        and isinstance(test.comparators[0], ast.Constant)
        and isinstance(test.comparators[0].value, int)
    ):
        return type(test.ops[0]), test.comparators[0].value
    return None


def our_modules() -> Iterator[Path]:
    yield from sorted((ROOT / "pipeline").rglob("*.py"))


def our_uses() -> list[Use]:
    uses = [u for path in our_modules() for u in collect(path.read_text(), str(path.relative_to(ROOT)))]
    options = set().union(*(polygraphy_options(path.read_text()) for path in our_modules()))
    for option in sorted(options):
        uses += [Use(name, f"Polygraphy {option}") for name in POLYGRAPHY_OPTIONS.get(option, ())]
    return uses


@cache
def missing_in(version: str, names: tuple[tuple[str, str], ...]) -> frozenset[str]:
    """The names (with their kind) that the real TensorRT ``version`` does not have."""
    prepare_trt_api(version)
    script = f'eval "$(bash {SETUP} --env {version})" && exec "$0" -c "$1"'
    command = ["bash", "-c", script, sys.executable, CHECK]
    done = subprocess.run(command, input=json.dumps(names), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return frozenset(json.loads(done.stdout))


def unknown(uses: list[Use], version: str) -> list[str]:
    """``name (where)`` for each use that applies to ``version`` and does not exist there."""
    applying = [u for u in uses if u.applies_to(int(version.split(".")[0]))]
    missing = missing_in(version, tuple(sorted({(u.name, u.kind) for u in applying})))
    return [f"{u.name} ({u.where})" for u in applying if u.name in missing]


# -- the tests -----------------------------------------------------------------------------------------------------

FP16 = """
import tensorrt as trt

def build(config: trt.IBuilderConfig) -> None:
    config.set_flag(trt.BuilderFlag.FP16)
"""

GUARDED = """
import tensorrt as trt
from pipeline.backends.tensorrt.build import trt_major

def build(config: trt.IBuilderConfig) -> None:
    if trt_major() < 11:
        config.set_flag(trt.BuilderFlag.FP16)
    else:
        config.set_flag(trt.BuilderFlag.TF32)
    if trt_major() >= 11:
        config.set_flag(trt.BuilderFlag.BF16)
"""


def test_collector_reads_module_chains_annotated_receivers_overrides_and_guards() -> None:
    uses = collect(GUARDED + OVERRIDE, "snippet.py")
    by_name = {u.name: u for u in uses}
    assert set(by_name) == {
        "IBuilderConfig",
        "IBuilderConfig.set_flag",
        "BuilderFlag.FP16",
        "BuilderFlag.TF32",
        "BuilderFlag.BF16",
        "IOutputAllocator",
        "IOutputAllocator.__init__",
        "IOutputAllocator.notify_shape",
        "IExecutionContext",
        "IExecutionContext.execute_async_v3",
    }
    assert by_name["IOutputAllocator.notify_shape"].kind == "override"
    assert by_name["BuilderFlag.FP16"].applies_to(10) and not by_name["BuilderFlag.FP16"].applies_to(11)
    assert by_name["BuilderFlag.TF32"].applies_to(11) and not by_name["BuilderFlag.TF32"].applies_to(10)
    assert by_name["BuilderFlag.BF16"].applies_to(11) and not by_name["BuilderFlag.BF16"].applies_to(10)
    assert collect("import torch\nx = torch.cuda.Stream()", "no_trt.py") == []


OVERRIDE = """
class Allocator(trt.IOutputAllocator):
    def __init__(self) -> None:
        trt.IOutputAllocator.__init__(self)

    def notify_shape(self, tensor_name, shape) -> None:
        pass

def run(context: trt.IExecutionContext | None, stream: int) -> None:
    context.execute_async_v3(stream)
"""


SCOPES = """
import tensorrt as trt

def to_torch(dtype: trt.DataType) -> None:
    return dtype.name

def size(dtype) -> int:
    return dtype.itemsize  # another function's `dtype`: not a TensorRT object here
"""


def test_collector_scopes_annotations_to_their_function_and_requires_them() -> None:
    assert {u.name for u in collect(SCOPES, "scopes.py")} == {"DataType", "DataType.name"}
    with pytest.raises(AssertionError, match=r"annotate the TensorRT objects assigned at unannotated.py:3"):
        collect("import tensorrt as trt\n\nruntime = trt.Runtime(logger)\n", "unannotated.py")
    with pytest.raises(AssertionError, match="not `from tensorrt import`"):
        collect("from tensorrt import Runtime\n", "from_import.py")


def test_our_code_is_read_where_it_uses_tensorrt() -> None:
    uses = our_uses()
    files = {u.where.split(":")[0] for u in uses if not u.where.startswith("Polygraphy")}
    assert files == {
        "pipeline/backends/tensorrt/build.py",
        "pipeline/runtime/tensorrt/identity.py",  # the version an engine was built with, the one here
        "pipeline/runtime/tensorrt/runner.py",
        "pipeline/runtime/tensorrt/weights.py",
        "pipeline/runtime/generation/trt_cache.py",  # the decoder step's cache buffers, aliased in place
    }
    names = {u.name for u in uses}
    for expected in (
        "OnnxParser.parse",
        "ParserError.node_name",
        "MemoryPoolType.WORKSPACE",
        "HardwareCompatibilityLevel.AMPERE_PLUS",
        "Runtime.deserialize_cuda_engine",
        "ICudaEngine.get_tensor_profile_shape",
        "IExecutionContext.set_input_shape",
        "IExecutionContext.set_output_allocator",
        "IExecutionContext.execute_async_v3",
        "IOutputAllocator.reallocate_output_async",
        "DataType.FP8",
        "NetworkDefinitionCreationFlag.STRONGLY_TYPED",  # through Polygraphy's CreateNetwork(strongly_typed=True)
        "BuilderFlag.STRIP_PLAN",  # the engine options (pipeline.runtime.tensorrt.weights)
        "BuilderFlag.REFIT_IDENTICAL",
        "BuilderFlag.WEIGHT_STREAMING",
        "BuilderFlag.SPARSE_WEIGHTS",
        "Refitter.refit_cuda_engine",
        "Refitter.get_missing_weights",
        "OnnxParserRefitter.refit_from_bytes",
        "ICudaEngine.refittable",
        "ICudaEngine.weight_streaming_budget_v2",
        "ICudaEngine.get_weight_streaming_automatic_budget",
        "ICudaEngine.serialize",
    ):
        assert expected in names, expected


def test_every_polygraphy_option_we_pass_is_in_the_table() -> None:
    options = set().union(*(polygraphy_options(path.read_text()) for path in our_modules()))
    assert options, "no Polygraphy TensorRT loader call found"
    assert options - set(POLYGRAPHY_OPTIONS) == set(), "add the TensorRT names these options rely on to the table"


@pytest.mark.parametrize("version", VERSIONS)
def test_every_tensorrt_name_we_use_exists(version: str) -> None:
    assert unknown(our_uses(), version) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_builder_flag_fp16_is_caught_under_11_and_allowed_behind_a_version_check(version: str) -> None:
    on_11 = version.startswith("11.")
    reported = unknown(collect(FP16, "fp16.py"), version)
    assert reported == (["BuilderFlag.FP16 (fp16.py:5)"] if on_11 else [])
    # FP16 behind `trt_major() < 11` is checked against 10.16 only; BF16 behind `>= 11` is (rightly) reported.
    guarded = unknown(collect(GUARDED, "guarded.py"), version)
    assert guarded == (["BuilderFlag.BF16 (guarded.py:11)"] if on_11 else [])


RTX_CHECK = CHECK.replace("import tensorrt as trt", "import tensorrt_rtx as trt")


def rtx_uses() -> list[Use]:
    """What our code uses of TensorRT-RTX: the shared TensorRT code (build.py, runtime.py), outside guards for one
    TensorRT major, and the TensorRT-RTX-only modules (``import tensorrt_rtx``)."""
    shared = [u for u in our_uses() if not u.guards and not u.where.startswith("Polygraphy")]
    only = [u for path in our_modules() for u in collect(path.read_text(), str(path.relative_to(ROOT)), "tensorrt_rtx")]
    return shared + only


def test_every_tensorrt_name_we_use_exists_in_tensorrt_rtx() -> None:
    """The real TensorRT-RTX 1.7 bindings (the dev extra) have every name the shared build and runtime code and the
    TensorRT-RTX modules use; TensorRT-only code paths are listed here, each with the reason."""
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is in the dev extra")
    uses = rtx_uses()
    assert {u.where.split(":")[0] for u in uses} >= {
        "pipeline/backends/tensorrt/build.py",
        "pipeline/runtime/tensorrt/runner.py",
        "pipeline/runtime/tensorrt/rtx.py",
    }
    names = tuple(sorted({(u.name, u.kind) for u in uses}))
    done = subprocess.run(
        [sys.executable, "-c", RTX_CHECK], input=json.dumps(names), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    missing = set(json.loads(done.stdout)) - TENSORRT_ONLY
    assert sorted(f"{u.name} ({u.where})" for u in uses if u.name in missing) == []


#: Names the shared code uses only on NVIDIA TensorRT's path, and why TensorRT-RTX never reaches them.
TENSORRT_ONLY: frozenset[str] = frozenset()
