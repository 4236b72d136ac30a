"""Test support: a built-in converter's declared case, end to end (converts, matches PyTorch, builds)."""

from __future__ import annotations

from collections.abc import Callable

from rtx_build import assert_builds

from converters.cases import ConverterCase, collect_cases
from converters.defaults import default_registry
from converters.registry import ConverterEntry, ConverterRegistry
from converters.targets import node_key
from pipeline.testing import check_converter_case


def own_cases(
    register: Callable[[ConverterRegistry], object],
) -> tuple[ConverterRegistry, ConverterRegistry, list[tuple[ConverterEntry, ConverterCase]]]:
    """A converter module's own registry (``register`` run on an empty one), the default registry with it, and its
    declared cases, one per (converter function, case): a function registered for several ops declares them once."""
    own = ConverterRegistry()
    register(own)
    registry = default_registry()
    registry.include(own)
    cases = list({(e.function, c.name): (e, c) for e, c in collect_cases(own)}.values())
    return own, registry, cases


def assert_case_lowers_matches_and_builds(
    entry: ConverterEntry,
    case: ConverterCase,
    registry: ConverterRegistry,
    own: ConverterRegistry,
    *,
    custom_domains_only: bool = False,
) -> None:
    """``case`` through :func:`pipeline.testing.check_converter_case` with ``registry`` (converts, the op is gone,
    matches PyTorch on fresh inputs and at the dynamic dims' max), then: no node of any op ``own`` converts is left
    (``custom_domains_only``: only in custom domains, for registries that also rewrite standard ONNX ops and emit
    them again in a form TensorRT takes), and the real TensorRT-RTX builder builds the graph."""
    module = check_converter_case(case, registry, entry)
    lowered = set(own.op_keys())
    left = [
        n.name
        for n in module.onnx.graph.node
        if (n.domain or not custom_domains_only) and node_key(n.domain, n.op_type) in lowered
    ]
    assert left == []
    assert_builds(module)
