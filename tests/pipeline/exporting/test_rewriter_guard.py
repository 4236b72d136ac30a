"""The exporter's optimizer matches its two-output pattern (two Slices of one tensor -> Split) only at Slice nodes
under the guard: the same graph, and the expensive matching no longer run at every node (the unguarded matcher
indexes the whole graph at each node it is asked about: quadratic in the graph)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import onnx
import torch
from onnxscript.rewriter._matcher import SimplePatternMatcher
from torch import nn

from pipeline.exporting.rewriter_guard import linear_multi_output_matching

LAYERS = 40


class HalvesOfDeepChain(nn.Module):
    """A chain of ``LAYERS`` Tanh(x * w + b) steps, then the two halves of the last dimension (two Slices of one
    tensor: what the pattern looks for), added."""

    def __init__(self) -> None:
        super().__init__()
        self.scales = nn.Parameter(torch.linspace(0.5, 1.5, LAYERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(LAYERS):
            x = torch.tanh(x * self.scales[i] + 0.1)
        return x[..., :4] * 2 + x[..., 4:]


@contextmanager
def counted_multi_output_matches() -> Iterator[list[str]]:
    """The op type of every node the multi-output (SlicesSplit) pattern's full matcher runs at."""
    original = SimplePatternMatcher.__dict__["match"]
    seen: list[str] = []

    def counting(self: Any, model: Any, graph_or_function: Any, node: Any, **options: Any) -> Any:
        if not self.pattern.has_single_output_node:
            seen.append(node.op_type)
        return original(self, model, graph_or_function, node, **options)

    SimplePatternMatcher.match = counting  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        SimplePatternMatcher.match = original  # type: ignore[method-assign]


def _export() -> onnx.ModelProto:
    program = torch.onnx.export(HalvesOfDeepChain().eval(), (torch.randn(2, 8),), dynamo=True, report=False)
    assert program is not None
    return program.model_proto


def test_guard_gives_the_same_graph_and_matches_the_split_pattern_only_at_slices() -> None:
    torch.manual_seed(0)
    with counted_multi_output_matches() as unguarded:
        plain = _export()
    with counted_multi_output_matches() as guarded, linear_multi_output_matching():
        fast = _export()
    assert onnx.printer.to_text(fast.graph) == onnx.printer.to_text(plain.graph)
    assert len(unguarded) > 3 * LAYERS  # every node of every optimizer round: the quadratic cost
    assert "Slice" in unguarded and guarded == []  # the exporter's Slices carry steps: the pattern cannot match them


def _halves(steps: bool) -> onnx.ModelProto:
    """``x[..., 4:]`` and ``x[..., :4]`` as two Slices (with or without a ``steps`` input), added. In that order:
    onnxscript 0.7 tries the first Slice against each Slice in graph order and checks only the first pair it finds
    (the first half with itself, were it first)."""
    extra = ", one" if steps else ""
    return onnx.parser.parse_model(f"""
        <ir_version: 8, opset_import: ["" : 18]>
        halves (float[2, 8] x) => (float[2, 4] y)
            <int64[1] zero = {{0}}, int64[1] four = {{4}}, int64[1] eight = {{8}}, int64[1] last = {{-1}},
             int64[1] one = {{1}}> {{
            b = Slice (x, four, eight, last{extra})
            a = Slice (x, zero, four, last{extra})
            y = Add (a, b)
        }}
    """)


def test_the_pattern_still_fires_under_the_guard_where_it_can() -> None:
    """Two step-less Slices of one tensor still become a Split with the guard on; with steps they stay Slices (as
    without the guard)."""
    from onnxscript.rewriter import rewrite
    from onnxscript.rewriter.rules.common._basic_rules import slice_split_rule

    for steps, want in ((False, "Split"), (True, "Slice")):
        plain = rewrite(_halves(steps), [slice_split_rule])
        with counted_multi_output_matches() as guarded, linear_multi_output_matching():
            fast = rewrite(_halves(steps), [slice_split_rule])
        assert onnx.printer.to_text(fast.graph) == onnx.printer.to_text(plain.graph)
        assert want in {n.op_type for n in fast.graph.node}, onnx.printer.to_text(fast.graph)
        assert set(guarded) == (set() if steps else {"Slice"}), guarded  # the full matcher ran where it could fire


def test_guard_is_removed_after_the_block_even_when_nested() -> None:
    original = SimplePatternMatcher.__dict__["match"]
    with linear_multi_output_matching():
        with linear_multi_output_matching():
            assert SimplePatternMatcher.__dict__["match"] is not original
        assert SimplePatternMatcher.__dict__["match"] is not original  # the outer block still holds it
    assert SimplePatternMatcher.__dict__["match"] is original
