"""``pipeline.check``: will TensorRT accept this graph, judged by the best parser this machine has.

``parser="auto"`` asks the real ONNX parser of an importable TensorRT, else of TensorRT-RTX, else the static table
(``pipeline.compatibility.static``); ``"tensorrt"``, ``"tensorrt-rtx"`` and ``"static"`` choose. The report names the
judge (``report.parser``) and keeps one line per node: the node, its op, the reason (the real parser's own error) and a
fix.

>>> report = check("model.onnx")                  # doctest: +SKIP
>>> report.parser                                 # doctest: +SKIP
'TensorRT-RTX 1.7.1.116 ONNX parser'
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import onnx

from converters.errors import InputError
from passes.model_io.external_data import check_model
from pipeline.compatibility.ops import DEFAULT_TRT_VERSION, parse_version
from pipeline.compatibility.static import CompatibilityReport, load_model
from pipeline.compatibility.static import check as static_check
from pipeline.runtime.tensorrt.library import TENSORRT, TENSORRT_RTX, TrtLibrary
from pipeline.settings import CHECK_PARSERS, Settings


def check(
    model: onnx.ModelProto | str | Path,
    trt_version: str | None = None,
    *,
    parser: str = "auto",
    build: bool = False,
    **settings: Any,
) -> CompatibilityReport:
    """Check every node of ``model`` (a ModelProto, a path to an ONNX file or to a ``.ptrt`` artifact) with ``parser``.

    The graph must first pass ONNX's own checker (full, with shape inference): a graph ONNX itself rejects (a cycle,
    a dangling input) is an InputError, not a verdict. ``trt_version`` asks about one TensorRT version (10.x or
    11.x): the static table answers unless the installed TensorRT is that version. ``build=True`` also runs the real
    builder through the backend's build code (TensorRT-RTX builds without a GPU); ``settings`` are
    :class:`Settings` fields for that build, e.g. ``dynamic={"x": {0: ("b", 1, 4, 8)}}``.
    """
    if trt_version is not None:
        _check_version(trt_version)
    graph, base_dir, keep = _graph_of(model)
    _check_valid_onnx(graph, model)
    library = judge_library(parser, trt_version)
    if library is None:
        if build:
            raise InputError(
                "build=True needs a real builder, but the static table was chosen (or no TensorRT imports)",
                fix="pip install tensorrt-rtx (builds on the CPU) or pass parser='tensorrt-rtx'",
            )
        return static_check(graph, trt_version or DEFAULT_TRT_VERSION)
    from pipeline.compatibility.real import real_check

    try:
        return real_check(graph, library, build=build, settings=Settings.from_kwargs(settings), base_dir=base_dir)
    finally:
        del keep  # an artifact's unpacked weights live until the check is done


def _graph_of(model: Any) -> tuple[onnx.ModelProto, Path | None, Any]:
    """The graph to check, the directory of its external weights, and what keeps those alive."""
    if isinstance(model, onnx.ModelProto):
        return model, None, None
    if not isinstance(model, str | Path):
        raise InputError(
            f"cannot check a {type(model).__name__}",
            fix="pass an onnx.ModelProto, a path to an .onnx file or a .ptrt artifact, or an nn.Module with "
            "sample= (pipeline.check(model, sample=x))",
        )
    path = Path(model)
    if path.suffix == ".ptrt" or (path.is_file() and zipfile.is_zipfile(path)):
        from pipeline.runtime.artifact_reading import read_artifact

        artifact = read_artifact(path)
        return artifact.onnx_model, None, artifact
    return load_model(path), path.parent, None  # external weights sit beside the file


def _check_valid_onnx(graph: onnx.ModelProto, source: Any) -> None:
    try:
        if isinstance(source, str | Path) and not zipfile.is_zipfile(source):
            onnx.checker.check_model(str(source), full_check=True)
        else:
            check_model(graph, full_check=True)
        return
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        message = str(exc).strip()
    # Value infos without a shape (unknown rank) are common in hand-built and tool-made graphs, and TensorRT's parser
    # takes them, though the checker wants the field; such a graph still gets the structural check.
    problem = None if SHAPELESS in message else message
    problem = problem or _structure_problem(graph.graph)
    if problem:
        raise InputError(
            f"the graph is not valid ONNX (onnx.checker, full check): {problem.splitlines()[0]}",
            fix="fix the graph so that onnx.checker.check_model(model, full_check=True) passes; TensorRT's parser "
            "assumes a valid graph",
        )


SHAPELESS = "Field 'shape' of 'type' is required but missing"


def _structure_problem(graph: onnx.GraphProto) -> str | None:
    """Nodes in topological order, each input defined before it is used (no cycle, no dangling input)."""
    known = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {""}
    for node in graph.node:
        for name in node.input:
            if name not in known:
                return f"input {name!r} of node {node.name or node.op_type!r} is not defined before it (a cycle?)"
        known.update(node.output)
    missing = [o.name for o in graph.output if o.name not in known]
    return f"graph output(s) {missing} are not produced" if missing else None


def _check_version(trt_version: str) -> None:
    try:
        major = parse_version(str(trt_version))[0]
    except ValueError:
        major = -1
    if major not in SUPPORTED_MAJORS:
        raise InputError(
            f"trt_version={trt_version!r}: the parser's operator matrix covers TensorRT 10.x and 11.x",
            fix="pass a version such as '10.16' or '11.1', or None for the installed TensorRT",
        )


SUPPORTED_MAJORS = (10, 11)


def judge_library(parser: str, trt_version: str | None = None) -> TrtLibrary | None:
    """The library whose parser judges (None: the static table). ``auto``: TensorRT, else TensorRT-RTX, else None;
    a named library must import (a BuildError with the pip command otherwise)."""
    if parser not in CHECK_PARSERS:
        raise InputError(f"unknown parser {parser!r}", fix=f"use one of {', '.join(map(repr, CHECK_PARSERS))}")
    if parser == "static":
        return None
    if parser != "auto":
        library = TENSORRT if parser == "tensorrt" else TENSORRT_RTX
        library.import_module()
        return library
    if TENSORRT.importable() and (trt_version is None or _same_release(TENSORRT.version(), trt_version)):
        return TENSORRT
    if trt_version is None and TENSORRT_RTX.importable():
        return TENSORRT_RTX
    return None


def _same_release(installed: str, asked: str) -> bool:
    want = parse_version(asked)
    return parse_version(installed)[: len(want)] == want
