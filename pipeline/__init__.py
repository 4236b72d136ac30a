"""PyTorch -> ONNX -> TensorRT (or ONNX Runtime), with graph passes, converters and validation.

>>> import pipeline                                                     # doctest: +SKIP
>>> module = pipeline.convert(model, sample, backend="onnxruntime")     # doctest: +SKIP
>>> module.save("model.ptrt"); again = pipeline.load("model.ptrt")      # doctest: +SKIP

The package is in two layers: the runtime (:mod:`pipeline.runtime`: artifacts, executors, the converted modules, the
generation loop), which a deployment imports alone, and the conversion stages above it. Names are imported on first
use, so ``pipeline.load(path)`` and a call import the runtime only; ``pipeline.convert`` brings in the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from converters.errors import (
    AccuracyError,
    ArtifactError,
    BuildError,
    ConversionError,
    ExportError,
    InputError,
    PipelineError,
    ServingError,
)
from converters.lazy import lazy_names

if TYPE_CHECKING:  # the names below, for type checkers and documentation; at run time they load on first use
    from pipeline.comparison.report import ComparisonReport
    from pipeline.compatibility.real import ParserVerdict, parse_with
    from pipeline.compatibility.static import CompatibilityReport, NodeCheck
    from pipeline.conversion import check, compare, convert
    from pipeline.exporting.stage import ExportedGraph, export
    from pipeline.final_graph import run_passes
    from pipeline.first_call import FirstCallMethod, FirstCallModule, on_first_call
    from pipeline.refitting import refit
    from pipeline.runtime.executors import Executor
    from pipeline.runtime.generation.module import GenerativeModule
    from pipeline.runtime.generation.slots import RequestSlotsBusy
    from pipeline.runtime.io_spec import IOSpec, TensorSpec
    from pipeline.runtime.module import ConvertedModule
    from pipeline.runtime.reports.conversion import ConversionReport
    from pipeline.serving.serve import serve
    from pipeline.serving.server import TritonServer
    from pipeline.settings import DEFAULT_TOLERANCES, DynamicDim, Settings, Tolerance

#: public name -> the module that defines it (imported on first use: see the module docstring)
_LAZY = {
    "ParserVerdict": "pipeline.compatibility.real",
    "parse_with": "pipeline.compatibility.real",
    "CompatibilityReport": "pipeline.compatibility.static",
    "NodeCheck": "pipeline.compatibility.static",
    "ComparisonReport": "pipeline.comparison.report",
    "check": "pipeline.conversion",
    "compare": "pipeline.conversion",
    "convert": "pipeline.conversion",
    "ExportedGraph": "pipeline.exporting.stage",
    "export": "pipeline.exporting.stage",
    "run_passes": "pipeline.final_graph",
    "FirstCallMethod": "pipeline.first_call",
    "FirstCallModule": "pipeline.first_call",
    "on_first_call": "pipeline.first_call",
    "refit": "pipeline.refitting",
    "RequestSlotsBusy": "pipeline.runtime.generation.slots",
    "serve": "pipeline.serving.serve",
    "TritonServer": "pipeline.serving.server",
    "GenerativeModule": "pipeline.runtime.generation.module",
    "IOSpec": "pipeline.runtime.io_spec",
    "TensorSpec": "pipeline.runtime.io_spec",
    "ConvertedModule": "pipeline.runtime.module",
    "ConversionReport": "pipeline.runtime.reports.conversion",
    "DEFAULT_TOLERANCES": "pipeline.settings",
    "DynamicDim": "pipeline.settings",
    "Settings": "pipeline.settings",
    "Tolerance": "pipeline.settings",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY)


def load(
    path: str | Path,
    *,
    backend: str | None = None,
    rebuild: bool = False,
    threads: int | None = None,
    spinning: bool | None = None,
) -> ConvertedModule:
    """Load an artifact written by ``ConvertedModule.save`` (or ``GenerativeModule.save``): the runtime alone.

    ``backend=None`` uses the artifact's backend; ``backend="onnxruntime"`` runs its ONNX graph on the CPU even when
    it holds a TensorRT engine. ``rebuild=True`` builds a new engine when the saved one was made for another TensorRT
    version or GPU (and an engine is built when TensorRT is asked of an artifact that holds none): only then is the
    conversion layer's builder imported. ``threads`` (ONNX Runtime's intra-op threads) and ``spinning`` (whether they
    spin-wait between calls) are this process's choice, whatever the artifact was converted with (None keeps the
    artifact's; a generation module does not spin unless asked).

    >>> module = pipeline.load("model.ptrt", backend="onnxruntime", threads=2, spinning=False)  # doctest: +SKIP
    """
    from pipeline.runtime.loading import load as load_artifact

    return load_artifact(
        path, backend=backend, rebuild=rebuild, build=_build_executor, threads=threads, spinning=spinning
    )


def _build_executor(*args: Any, **kwargs: Any) -> Executor:
    """:func:`pipeline.backends.build_executor`, imported when an engine must be built."""
    from pipeline.backends import build_executor

    return build_executor(*args, **kwargs)


__all__ = [
    "AccuracyError",
    "ArtifactError",
    "BuildError",
    "check",
    "compare",
    "ComparisonReport",
    "CompatibilityReport",
    "ConversionError",
    "ConversionReport",
    "convert",
    "ConvertedModule",
    "DEFAULT_TOLERANCES",
    "DynamicDim",
    "export",
    "ExportedGraph",
    "ExportError",
    "FirstCallMethod",
    "FirstCallModule",
    "GenerativeModule",
    "InputError",
    "IOSpec",
    "load",
    "NodeCheck",
    "on_first_call",
    "parse_with",
    "ParserVerdict",
    "PipelineError",
    "refit",
    "RequestSlotsBusy",
    "run_passes",
    "serve",
    "ServingError",
    "Settings",
    "TensorSpec",
    "Tolerance",
    "TritonServer",
]
