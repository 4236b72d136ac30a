"""Op converters: how custom PyTorch ops become TensorRT-friendly ONNX. Also home of the settings object and
the exception hierarchy, because this is the lowest package and every other package reads them."""

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

__all__ = [
    "DEFAULT_TOLERANCES",
    "AccuracyError",
    "ArtifactError",
    "BuildError",
    "ConversionError",
    "DynamicDim",
    "ExportError",
    "InputError",
    "PipelineError",
    "Settings",
    "Tolerance",
]
