"""The default converter registry, filled by an explicit function (never by import side effects)."""

from __future__ import annotations

from converters.registry import ConverterRegistry
from converters.user import user_registry


def default_registry() -> ConverterRegistry:
    """A new registry holding what the user registered with ``@converters.register`` / ``converters.register_plugin``
    so far (tried first at equal priority), then the built-in converters. ``pipeline.convert`` uses it unless given
    another.

    Built-in converters register here, one explicit call each; users add theirs to the user registry, or to a copy
    of this one (``default_registry()``), or start from an empty ``ConverterRegistry()``.
    """
    from converters.aten.builtin import register_builtin_converters

    registry = ConverterRegistry()
    registry.include(user_registry())
    register_builtin_converters(registry)
    return registry
