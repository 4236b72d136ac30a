"""PyTorch -> ONNX -> TensorRT (or ONNX Runtime), with graph passes, converters and validation.

>>> import pipeline                                                     # doctest: +SKIP
>>> module = pipeline.convert(model, sample, backend="onnxruntime")     # doctest: +SKIP
>>> module.save("model.ptrt"); again = pipeline.load("model.ptrt")      # doctest: +SKIP
"""

from converters.errors import (
    AccuracyError,
    ArtifactError,
    BuildError,
    ConversionError,
    ExportError,
    InputError,
    PipelineError,
)
from converters.settings import DEFAULT_TOLERANCES, DynamicDim, Settings, Tolerance
from pipeline.compare import compare
from pipeline.compare_report import ComparisonReport
from pipeline.conversion import convert, load, run_passes
from pipeline.export import ExportedGraph, export
from pipeline.io_spec import IOSpec, TensorSpec
from pipeline.parser_check import CompatibilityReport, NodeCheck, check
from pipeline.report import ConversionReport
from pipeline.runtime import ConvertedModule

__all__ = [
    "DEFAULT_TOLERANCES",
    "AccuracyError",
    "CompatibilityReport",
    "ArtifactError",
    "BuildError",
    "ComparisonReport",
    "ConversionError",
    "ConversionReport",
    "ConvertedModule",
    "DynamicDim",
    "ExportError",
    "ExportedGraph",
    "IOSpec",
    "InputError",
    "NodeCheck",
    "PipelineError",
    "Settings",
    "TensorSpec",
    "check",
    "Tolerance",
    "compare",
    "convert",
    "export",
    "load",
    "run_passes",
]
