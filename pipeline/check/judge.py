"""``pipeline.check``: will TensorRT accept this graph, judged by the best parser this machine has.

``parser="auto"`` asks the real ONNX parser of an importable TensorRT, else of TensorRT-RTX, else the static table
(``pipeline.check.static``); ``"tensorrt"``, ``"tensorrt-rtx"`` and ``"static"`` choose. The report names the judge
(``report.parser``) and keeps one line per node: the node, its op, the reason (the real parser's own error) and a fix.

>>> report = check("model.onnx")                  # doctest: +SKIP
>>> report.parser                                 # doctest: +SKIP
'TensorRT-RTX 1.7.1.116 ONNX parser'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx

from converters.errors import InputError
from converters.settings import CHECK_PARSERS, Settings
from pipeline.backends.tensorrt.library import TENSORRT, TENSORRT_RTX, TrtLibrary
from pipeline.check.ops import DEFAULT_TRT_VERSION, parse_version
from pipeline.check.static import CompatibilityReport, load_model
from pipeline.check.static import check as static_check


def check(
    model: onnx.ModelProto | str | Path,
    trt_version: str | None = None,
    *,
    parser: str = "auto",
    build: bool = False,
    **settings: Any,
) -> CompatibilityReport:
    """Check every node of ``model`` (a ModelProto or a path to an ONNX file) with ``parser``.

    ``trt_version`` asks about one TensorRT version: the static table answers unless the installed TensorRT is that
    version. ``build=True`` also runs the real builder through the backend's build code (TensorRT-RTX builds without
    a GPU); ``settings`` are :class:`Settings` fields for that build, e.g. ``dynamic={"x": {0: ("b", 1, 4, 8)}}``.
    """
    library = judge_library(parser, trt_version)
    if library is None:
        if build:
            raise InputError(
                "build=True needs a real builder, but the static table was chosen (or no TensorRT imports)",
                fix="pip install tensorrt-rtx (builds on the CPU) or pass parser='tensorrt-rtx'",
            )
        return static_check(model, trt_version or DEFAULT_TRT_VERSION)
    from pipeline.check.real import real_check

    base_dir = None if isinstance(model, onnx.ModelProto) else Path(model).parent  # external weights beside the file
    return real_check(
        load_model(model), library, build=build, settings=Settings.from_kwargs(settings), base_dir=base_dir
    )


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
