"""Converter test cases declared beside the converter, as torch2trt's ``add_module_test`` did.

>>> @converter_case(lambda: Bucketize(), inputs=[((4, 8), "float32")])   # doctest: +SKIP
... def convert_bucketize(ctx): ...

``pipeline.testing.check_converter_case`` runs a case: PyTorch against the lowered graph on ONNX Runtime (and on
TensorRT where present); ``tests/converters`` collects the cases of every built-in converter, and users can run
the cases of their own registries the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from converters.registry import ConverterEntry, ConverterRegistry

CASES_ATTRIBUTE = "converter_cases"


@dataclass(frozen=True)
class ConverterCase:
    """A module that exercises a converter, its input shapes and dtypes, and optional dynamic dimensions."""

    name: str
    module: Callable[[], torch.nn.Module]
    inputs: tuple[tuple[tuple[int, ...], str], ...]
    dynamic: Mapping[str, Mapping[int, tuple[str, int, int, int]]] = field(default_factory=dict)
    tolerances: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    int_range: tuple[int, int] = (0, 10)


def converter_case(
    module: Callable[[], torch.nn.Module],
    *,
    inputs: list[tuple[tuple[int, ...], str]],
    dynamic: Mapping[str, Mapping[int, tuple[str, int, int, int]]] | None = None,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
    name: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Attach a test case to a converter function (stackable: one decorator per case)."""

    def attach(function: Callable[..., Any]) -> Callable[..., Any]:
        cases = list(getattr(function, CASES_ATTRIBUTE, ()))
        label = name or f"{function.__name__}[{len(cases)}]"
        cases.append(ConverterCase(label, module, tuple(inputs), dict(dynamic or {}), dict(tolerances or {})))
        setattr(function, CASES_ATTRIBUTE, tuple(cases))
        return function

    return attach


def collect_cases(registry: ConverterRegistry) -> list[tuple[ConverterEntry, ConverterCase]]:
    """Every case declared on a converter registered in ``registry``."""
    return [
        (entry, case)
        for key in sorted(registry.op_keys())
        for entry in registry.candidates(key)
        for case in getattr(entry.function, CASES_ATTRIBUTE, ())
    ]
