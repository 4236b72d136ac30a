"""The converter test harness: run a declared case through the real pipeline and compare with PyTorch.

>>> for entry, case in collect_cases(my_registry):          # doctest: +SKIP
...     check_converter_case(case, my_registry, entry)
"""

from __future__ import annotations

import torch

from converters.cases import ConverterCase
from converters.registry import ConverterEntry, ConverterRegistry
from converters.targets import node_key
from pipeline.conversion import convert
from pipeline.runtime.module import ConvertedModule


def check_converter_case(
    case: ConverterCase, registry: ConverterRegistry, entry: ConverterEntry | None = None, *, backend: str = "auto"
) -> ConvertedModule:
    """Convert the case's module with ``registry``, assert it matches PyTorch on fresh inputs, and return the
    converted module (for further checks: a TensorRT build of ``module.onnx``, say).

    Conversion validates against PyTorch itself (and raises AccuracyError beyond tolerance); this also checks the
    converted op is gone from the final graph, and runs the module once more at the dynamic dimensions' max.
    """
    generator = torch.Generator().manual_seed(0)
    model = case.module().eval()
    sample = tuple(_random(shape, dtype, case, generator) for shape, dtype in case.inputs)
    module = convert(
        model, sample, converters=registry, backend=backend, dynamic=case.dynamic, tolerances=case.tolerances
    )
    if entry is not None:
        left = [n.name for n in module.onnx.graph.node if node_key(n.domain, n.op_type) == entry.key]
        assert not left, f"{entry.name} did not replace {entry.key}: nodes {left} remain"
    shapes = [list(shape) for shape, _ in case.inputs]
    names = [spec.name for spec in module.io.inputs]
    for input_name, axes in case.dynamic.items():
        for axis, (_, _, _, high) in axes.items():
            shapes[names.index(input_name)][axis] = high
    fresh = tuple(_random(tuple(s), dtype, case, generator) for s, (_, dtype) in zip(shapes, case.inputs, strict=True))
    with torch.no_grad():
        torch.testing.assert_close(module(*fresh), model(*fresh), rtol=1e-4, atol=1e-5)
    return module


def _random(shape: tuple[int, ...], dtype: str, case: ConverterCase, generator: torch.Generator) -> torch.Tensor:
    torch_dtype = getattr(torch, dtype)
    if torch_dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(torch_dtype)
    if torch_dtype == torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    return torch.randint(*case.int_range, shape, generator=generator, dtype=torch_dtype)
