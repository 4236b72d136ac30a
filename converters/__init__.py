"""Op converters: how custom PyTorch ops become TensorRT-friendly ONNX. Also home of the settings object and
the exception hierarchy, because this is the lowest package and every other package reads them.

Names load on first use (PEP 562), so that importing one module of the package (``converters.errors``, say) does
not import the rest: the runtime reads a few of its modules without the conversion machinery."""

from __future__ import annotations

from typing import TYPE_CHECKING

from converters.errors import (
    AccuracyError,
    ArtifactError,
    BuildError,
    ConversionError,
    ExportError,
    InputError,
    PipelineError,
)
from converters.lazy import lazy_names

if TYPE_CHECKING:
    from converters.cases import ConverterCase, collect_cases, converter_case
    from converters.context import ConverterContext
    from converters.defaults import default_registry
    from converters.plugins.spec import PluginSpec
    from converters.registry import ConverterEntry, ConverterRegistry, Priority
    from converters.settings import DEFAULT_TOLERANCES, DynamicDim, Settings, Tolerance
    from converters.targets import OpKey
    from converters.user import register, register_plugin, user_registry

#: public name -> the module that defines it
_LAZY = {
    "ConverterCase": "converters.cases",
    "collect_cases": "converters.cases",
    "converter_case": "converters.cases",
    "ConverterContext": "converters.context",
    "default_registry": "converters.defaults",
    "PluginSpec": "converters.plugins.spec",
    "ConverterEntry": "converters.registry",
    "ConverterRegistry": "converters.registry",
    "Priority": "converters.registry",
    "DEFAULT_TOLERANCES": "converters.settings",
    "DynamicDim": "converters.settings",
    "Settings": "converters.settings",
    "Tolerance": "converters.settings",
    "OpKey": "converters.targets",
    "register": "converters.user",
    "register_plugin": "converters.user",
    "user_registry": "converters.user",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY)

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
