"""Op converters: how custom PyTorch ops become TensorRT-friendly ONNX. Also home of the settings object and
the exception hierarchy, because this is the lowest package and every other package reads them."""

from converters.cases import ConverterCase, collect_cases, converter_case
from converters.context import ConverterContext
from converters.defaults import default_registry
from converters.errors import (
    AccuracyError,
    ArtifactError,
    BuildError,
    ConversionError,
    ExportError,
    InputError,
    PipelineError,
)
from converters.plugins.spec import PluginSpec
from converters.registry import ConverterEntry, ConverterRegistry, Priority
from converters.settings import DEFAULT_TOLERANCES, DynamicDim, Settings, Tolerance
from converters.targets import OpKey
from converters.user import register, register_plugin, user_registry

__all__ = [
    "DEFAULT_TOLERANCES",
    "AccuracyError",
    "ArtifactError",
    "BuildError",
    "ConversionError",
    "ConverterCase",
    "ConverterContext",
    "ConverterEntry",
    "ConverterRegistry",
    "DynamicDim",
    "ExportError",
    "InputError",
    "OpKey",
    "PipelineError",
    "PluginSpec",
    "Priority",
    "Settings",
    "Tolerance",
    "collect_cases",
    "converter_case",
    "default_registry",
    "register",
    "register_plugin",
    "user_registry",
]
