"""Every case declared beside a built-in converter, run through the real pipeline (ONNX Runtime; TensorRT too
where it is present)."""

from __future__ import annotations

import pytest

from converters.cases import collect_cases
from converters.defaults import default_registry
from converters.registry import ConverterEntry
from pipeline.testing import check_converter_case

REGISTRY = default_registry()
CASES = collect_cases(REGISTRY)


def test_every_builtin_converter_declares_a_case() -> None:
    without = [str(k) for k in REGISTRY.op_keys() if not any(e.key == k for e, _ in CASES)]
    assert without == []


@pytest.mark.parametrize(("entry", "case"), CASES, ids=[f"{e.key}-{c.name}" for e, c in CASES])
def test_builtin_converter_case(entry: ConverterEntry, case: object) -> None:
    check_converter_case(case, REGISTRY, entry)  # type: ignore[arg-type]
