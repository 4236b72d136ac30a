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
    assert guarded and set(guarded) == {"Slice"}


def test_guard_is_removed_after_the_block_even_when_nested() -> None:
    original = SimplePatternMatcher.__dict__["match"]
    with linear_multi_output_matching():
        with linear_multi_output_matching():
            assert SimplePatternMatcher.__dict__["match"] is not original
        assert SimplePatternMatcher.__dict__["match"] is not original  # the outer block still holds it
    assert SimplePatternMatcher.__dict__["match"] is original
