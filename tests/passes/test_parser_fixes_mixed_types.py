"""Float-and-integer arithmetic (the exporter's Div of a float sum by an int64 count in torch.masked.var/std) cast
as PyTorch promotes it: ONNX Runtime refuses the original and runs the rewrite, the real TensorRT-RTX builder builds
it, and torch.masked.var converts, matches PyTorch and builds."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from rtx_build import assert_builds, rtx_build_error
from test_parser_fixes_support import apply, assert_unchanged, ops, parse

import pipeline
from passes.parser_fixes.mixed_types import MixedTypeArithmetic
from passes.rules import RulePass

FIX = RulePass("mixed_type_arithmetic", (MixedTypeArithmetic(),))
HEADER = '<ir_version: 10, opset_import: ["" : 20]>\n'


def parse_invalid(text: str) -> onnx.ModelProto:
    """A model as the exporter writes it: mixed input types, so no ONNX check or shape inference (both refuse it)."""
    return onnx.parser.parse_model(text)


@pytest.mark.parametrize(
    ("op", "reference"),
    [("Div", np.divide), ("Mul", np.multiply), ("Add", np.add), ("Sub", np.subtract)],
)
def test_integer_operand_cast_to_the_float_type(op: str, reference: object) -> None:
    model = parse_invalid(HEADER + f"g (float[2, 3] x, int64[2, 1] n) => (float[2, 3] y) {{ y = {op}(x, n) }}")
    x = np.array([[1.5, -2.0, 7.0], [0.25, 3.0, -9.5]], np.float32)
    n = np.array([[3], [4]], np.int64)
    with pytest.raises(Exception, match="bound to different types|Type Error"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    after, _ = apply(FIX, model)
    assert ops(after) == ["Cast", op]
    session = ort.InferenceSession(after.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": x, "n": n})
    np.testing.assert_array_equal(y, reference(x, n.astype(np.float32)))  # type: ignore[operator]
    assert rtx_build_error(model) is not None, "TensorRT-RTX took mixed input types: the fix may be unneeded"
    assert rtx_build_error(after) is None


def test_integer_first_operand_and_same_kinds_left_alone() -> None:
    model = parse_invalid(HEADER + "g (int64[3] n, float16[3] x) => (float16[3] y) { y = Div(n, x) }")
    after, _ = apply(FIX, model)
    cast = next(node for node in after.graph.node if node.op_type == "Cast")
    assert cast.input[0] == "n" and cast.attribute[0].i == onnx.TensorProto.FLOAT16
    assert_unchanged(FIX, parse(HEADER + "g (float[3] a, float[3] b) => (float[3] y) { y = Div(a, b) }"))
    assert_unchanged(FIX, parse(HEADER + "g (int64[3] a, int64[3] b) => (int64[3] y) { y = Div(a, b) }"))


class _MaskedVar(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.masked.var(x, dim=1, mask=mask)


def test_masked_var_converts_matches_and_builds() -> None:
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[True, False, True, True, False, True]] * 4)
    module = pipeline.convert(_MaskedVar().eval(), (x, mask))
    torch.testing.assert_close(module(x, mask), torch.masked.var(x, dim=1, mask=mask), atol=1e-5, rtol=1e-4)
    assert_builds(module)
