"""The real parser as the judge: TensorRT's or TensorRT-RTX's own ONNX parser (and builder) on a graph.

:func:`parse_with` is the one public entry for "parse (and optionally build) this ModelProto with library X": it goes
through the TensorRT backends' build code (``pipeline.backends.tensorrt.build``), so what it accepts is what a
conversion builds. :func:`real_check` turns its verdict into the per-node :class:`CompatibilityReport` of
``pipeline.check``, with the parser's own error per rejected node and, where the static rules know it, their fix.

>>> verdict = parse_with(model, "tensorrt-rtx", build=True)    # doctest: +SKIP
>>> verdict.accepted, verdict.built, verdict.failures           # doctest: +SKIP
(True, True, ())
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnx

from converters.errors import BuildError
from converters.plugins.nodes import plugin_nodes
from pipeline.backends.tensorrt.build import ParseFailure
from pipeline.compatibility.static import BUILD_FAILED, PLUGIN, SUPPORTED, UNSUPPORTED, CompatibilityReport, NodeCheck
from pipeline.runtime.io_spec import IOSpec, TensorSpec
from pipeline.runtime.segments.partition import top_level_names
from pipeline.runtime.tensorrt.library import LIBRARIES, TrtLibrary
from pipeline.settings import DynamicDim, Settings


@dataclass(frozen=True)
class ParserVerdict:
    """What a real parser (and builder, when asked) said about a graph."""

    library: str  # the backend name: "tensorrt" or "tensorrt-rtx"
    title: str  # "TensorRT-RTX"
    version: str
    failures: tuple[ParseFailure, ...]
    build_error: str | None = None  # the builder's error, when a build was asked for and failed
    engine: bytes | None = field(default=None, repr=False)  # the serialized engine, when a build was asked for
    parse_seconds: float = 0.0
    build_seconds: float | None = None

    @property
    def accepted(self) -> bool:
        """The parser took every node."""
        return not self.failures

    @property
    def built(self) -> bool:
        """The builder made an engine (only when ``build=True`` was asked)."""
        return self.engine is not None

    @property
    def judge(self) -> str:
        """``TensorRT-RTX 1.7.1.116 ONNX parser`` (and builder)."""
        return f"{self.title} {self.version} ONNX parser" + (" and builder" if self.build_seconds is not None else "")


def parse_with(
    model: onnx.ModelProto,
    library: str | TrtLibrary = "tensorrt-rtx",
    *,
    build: bool = False,
    settings: Settings | None = None,
    io: IOSpec | None = None,
    base_dir: Path | None = None,
) -> ParserVerdict:
    """Parse ``model`` with ``library``'s real ONNX parser (``"tensorrt"`` or ``"tensorrt-rtx"``); with ``build=True``
    also build an engine through the backend's build code (TensorRT-RTX builds on the CPU; TensorRT needs a GPU).

    ``settings`` give the engine settings and declared dynamic dimensions (``Settings(dynamic=...)``); ``io`` the
    graph's inputs (default: read from the graph). A symbolic dimension without a declared range is built as 1.
    ``base_dir`` is the directory of the graph's external weights (default: the pipeline's weights directory).
    A missing library is a BuildError with the pip command; parser and builder errors are in the verdict.
    """
    from pipeline.backends.tensorrt.build import engine_from_network, parse_onnx, timing_cache_path

    lib = library if isinstance(library, TrtLibrary) else _library(library)
    version = lib.version()
    settings = settings or Settings()
    start = time.perf_counter()
    parsed, failures = parse_onnx(model, base_dir, library=lib, for_build=False)
    verdict = ParserVerdict(lib.backend, lib.title, version, tuple(failures), parse_seconds=time.perf_counter() - start)
    if not build or failures:
        return verdict
    io, settings = _build_inputs(model, io, settings)
    start = time.perf_counter()
    try:
        engine = engine_from_network(parsed, io, settings, timing_cache_path(settings, lib), lib)
    except BuildError as exc:
        return replace(verdict, build_error=str(exc), build_seconds=time.perf_counter() - start)
    return replace(verdict, engine=engine, build_seconds=time.perf_counter() - start)


def real_check(
    model: onnx.ModelProto,
    library: str | TrtLibrary,
    *,
    build: bool = False,
    settings: Settings | None = None,
    base_dir: Path | None = None,
) -> CompatibilityReport:
    """The per-node report of ``library``'s real parser (and builder, with ``build``): rejected nodes carry the
    parser's own message and, where the static rules know the node, their fix."""
    from pipeline.compatibility.static import check as static_check

    verdict = parse_with(model, library, build=build, settings=settings, base_dir=base_dir)
    failed = _by_top_level_node(model, verdict.failures)
    static = {n.node: n for n in static_check(model).nodes}
    plugins = {n.name for n in plugin_nodes(model)}
    nodes = []
    for node in model.graph.node:
        name = node.name or f"<unnamed {node.op_type}>"
        failure = failed.get(node.name) if node.name else None
        if failure is None:
            nodes.append(NodeCheck(name, node.op_type, node.domain, PLUGIN if node.name in plugins else SUPPORTED))
            continue
        if node.name in plugins and verdict.library == "tensorrt-rtx":  # a plugin for NVIDIA TensorRT, not RTX
            reason = f"a plugin node; {verdict.title} cannot load plugins here ({failure.message})"
            fix = "build with backend='tensorrt' (NVIDIA TensorRT registers the plugin), or lower the op to ONNX ops"
            nodes.append(NodeCheck(name, node.op_type, node.domain, PLUGIN, reason, fix))
            continue
        fix = static[name].fix if name in static and static[name].fix else _generic_fix(node.op_type, verdict)
        reason = f"{failure.message} [{failure.code}]"
        nodes.append(NodeCheck(name, node.op_type, node.domain, UNSUPPORTED, reason, fix))
    known = top_level_names(model.graph)
    for failure in verdict.failures:
        if not failure.node or failure.node not in known:
            nodes.append(NodeCheck("<graph>", failure.op, "", UNSUPPORTED, f"{failure.message} [{failure.code}]"))
    if verdict.build_error is not None:
        nodes.append(
            NodeCheck(
                "<build>",
                "",
                "",
                BUILD_FAILED,
                verdict.build_error.split("\n")[0],
                f"the graph parses but {verdict.title} cannot build it: read its log; convert with a precision or "
                "pass that avoids the failing pattern, or backend='onnxruntime'",
            )
        )
    return CompatibilityReport(verdict.version, tuple(nodes), parser=verdict.judge)


def _by_top_level_node(model: onnx.ModelProto, failures: tuple[ParseFailure, ...]) -> dict[str, ParseFailure]:
    """Top-level node name -> its failure; a node inside an If/Loop body is reported on the If/Loop that holds it."""
    names = top_level_names(model.graph)
    failed: dict[str, ParseFailure] = {}
    for failure in failures:
        index = names.get(failure.node) if failure.node else None
        if index is None:
            continue
        outer = model.graph.node[index].name
        if outer != failure.node:
            failure = replace(failure, message=f"in its subgraph, {failure.op} {failure.node!r}: {failure.message}")
        failed.setdefault(outer, failure)
    return failed


def _generic_fix(op: str, verdict: ParserVerdict) -> str:
    return (
        f"{verdict.title}'s parser rejects this {op}: lower it with a converter or pass into ops the parser takes, "
        "or register a plugin (NVIDIA TensorRT only), or convert with backend='onnxruntime'"
    )


def _library(name: str) -> TrtLibrary:
    if name not in LIBRARIES:
        raise BuildError(f"unknown parser library {name!r}", fix=f"use one of {', '.join(LIBRARIES)}")
    return LIBRARIES[name]


def _build_inputs(model: onnx.ModelProto, io: IOSpec | None, settings: Settings) -> tuple[IOSpec, Settings]:
    """The graph's inputs as an IOSpec, and settings that declare every symbolic dimension (1 when undeclared)."""
    if io is None:
        inputs = tuple(
            TensorSpec(v.name, _dtype_name(v.type.tensor_type.elem_type), _shape(v)) for v in _graph_inputs(model)
        )
        io = IOSpec(inputs, (), "", (), "", (), ())
    declared = {(d.input, d.axis) for d in settings.dynamic}
    ranges = {d.name: d for d in settings.dynamic}
    extra = []
    for spec in io.inputs:
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, str) and (spec.name, axis) not in declared:
                known = ranges.get(dim)
                lo, opt, hi = (known.min, known.opt, known.max) if known else (1, 1, 1)
                extra.append(DynamicDim(spec.name, axis, dim or f"{spec.name}_{axis}", lo, opt, hi))
    return io, replace(settings, dynamic=(*settings.dynamic, *extra)) if extra else settings


def _graph_inputs(model: onnx.ModelProto) -> list[Any]:
    initializers = {i.name for i in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in initializers]


def _shape(value: Any) -> tuple[int | str, ...]:
    dims = value.type.tensor_type.shape.dim
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims)


def _dtype_name(elem_type: int) -> str:
    if elem_type == onnx.TensorProto.BFLOAT16:
        return "bfloat16"
    return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type).name)
