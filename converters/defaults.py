"""The default converter registry, filled by an explicit function (never by import side effects)."""

from __future__ import annotations

from converters.registry import ConverterRegistry


def default_registry() -> ConverterRegistry:
    """A new registry holding the built-in converters. ``pipeline.convert`` uses it unless given another.

    Built-in converters register here, one explicit call each; users copy it (``default_registry()``) and add
    their own, or start from an empty ``ConverterRegistry()``.
    """
    registry = ConverterRegistry()
    from converters.builtin import register_builtin_converters

    register_builtin_converters(registry)
    return registry
