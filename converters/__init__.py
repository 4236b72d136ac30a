"""Op converters: how custom PyTorch ops become TensorRT-friendly ONNX. Also home of the settings object and
the exception hierarchy, because this is the lowest package and every other package reads them.

Names load on first use (PEP 562), so that importing one module of the package (``converters.errors``, say) does
not import the rest: the runtime reads a few of its modules without the conversion machinery."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from converters.errors import (
    AccuracyError,
    ArtifactError,
    BuildError,
    ConversionError,
    ExportError,
    InputError,
    PipelineError,
)

if TYPE_CHECKING:
    from converters.cases import ConverterCase, collect_cases, converter_case
    from converters.context import ConverterContext
    from converters.defaults import default_registry
    from converters.plugins.spec import PluginSpec
    from converters.registry import ConverterEntry, ConverterRegistry, Priority
    from converters.settings import DEFAULT_TOLERANCES, DynamicDim, Settings, Tolerance
    from converters.targets import OpKey
    from converters.user import register, register_plugin, user_registry

#: public name -> (the module that defines it, its name there)
_LAZY = {
    "ConverterCase": ("converters.cases", "ConverterCase"),
    "collect_cases": ("converters.cases", "collect_cases"),
    "converter_case": ("converters.cases", "converter_case"),
    "ConverterContext": ("converters.context", "ConverterContext"),
    "default_registry": ("converters.defaults", "default_registry"),
    "PluginSpec": ("converters.plugins.spec", "PluginSpec"),
    "ConverterEntry": ("converters.registry", "ConverterEntry"),
    "ConverterRegistry": ("converters.registry", "ConverterRegistry"),
    "Priority": ("converters.registry", "Priority"),
    "DEFAULT_TOLERANCES": ("converters.settings", "DEFAULT_TOLERANCES"),
    "DynamicDim": ("converters.settings", "DynamicDim"),
    "Settings": ("converters.settings", "Settings"),
    "Tolerance": ("converters.settings", "Tolerance"),
    "OpKey": ("converters.targets", "OpKey"),
    "register": ("converters.user", "register"),
    "register_plugin": ("converters.user", "register_plugin"),
    "user_registry": ("converters.user", "user_registry"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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
