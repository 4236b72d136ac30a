"""Package namespaces whose names load on first use (PEP 562): a package's ``__init__`` lists each public name with
the module that defines it, and importing one module of the package (``converters.errors``, say) does not import the
rest. ``converters``, ``passes`` and ``pipeline`` use it so that the runtime reads its few modules of theirs without
the conversion machinery."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, defined_in: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, where ``defined_in`` maps each public name to the module
    that defines it (under the same name). A name is imported on first access and kept in the package's namespace.

    >>> __getattr__, __dir__ = lazy_names(__name__, {"convert": "pipeline.conversion"})  # doctest: +SKIP
    """
    namespace = sys.modules[package]

    def getattr_(name: str) -> Any:
        module = defined_in.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(namespace, name, value)  # once: later lookups are plain attribute reads
        return value

    def dir_() -> list[str]:
        return sorted({*vars(namespace), *defined_in})

    return getattr_, dir_
