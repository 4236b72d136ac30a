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
from pipeline.check.real import ParserVerdict, parse_with
from pipeline.check.static import CompatibilityReport, NodeCheck
from pipeline.compare.report import ComparisonReport
from pipeline.conversion import check, compare, convert
from pipeline.exporting.stage import ExportedGraph, export
from pipeline.final_graph import run_passes
from pipeline.module.converted import ConvertedModule
from pipeline.module.first_call import FirstCallMethod, FirstCallModule, on_first_call
from pipeline.module.io_spec import IOSpec, TensorSpec
from pipeline.module.loading import load
from pipeline.module.report import ConversionReport
from pipeline.settings import DEFAULT_TOLERANCES, DynamicDim, Settings, Tolerance

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
    "FirstCallMethod",
    "FirstCallModule",
    "IOSpec",
    "InputError",
    "NodeCheck",
    "ParserVerdict",
    "PipelineError",
    "Settings",
    "TensorSpec",
    "check",
    "Tolerance",
    "compare",
    "convert",
    "export",
    "load",
    "on_first_call",
    "parse_with",
    "run_passes",
]
