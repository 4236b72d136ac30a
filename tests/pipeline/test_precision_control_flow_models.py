"""``convert(..., precision="fp16" | "bf16" | "int8")`` on torch models whose graphs hold control flow: the orthogonal
polynomials' ONNX Loop (``converters/aten/polynomials.py``) and torch.cond's If. The Loop or If stays a float32
island with its bodies whole (``passes/precision/control_flow.py``) while the Linear layers around it compute in
the low type; ONNX Runtime matches PyTorch on fresh inputs within the low type's tolerance, and the real
TensorRT-RTX builder builds the final graph.
"""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto as T
from rtx_build import assert_builds
from torch import nn

import pipeline

LOW = {"fp16": (T.FLOAT16, "float16"), "bf16": (T.BFLOAT16, "bfloat16")}


def fresh(*shape: int, seed: int) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed))


class PolynomialBetweenLinears(nn.Module):
    """``Linear -> tanh -> P_n -> Linear``: the recurrence reads values computed in the low type by name."""

    def __init__(self, family: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.before, self.after = nn.Linear(6, 6), nn.Linear(6, 6)
        self.function = getattr(torch.special, family)

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.before(x))
        return self.after(self.function(y, torch.floor(n * 6.0)))


class Branches(nn.Module):
    """``torch.cond`` on a Linear's output; both branches read that output and run their own Linear."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.pre, self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pre(x)
        return torch.cond(h.sum() > 0, lambda t: torch.relu(self.a(t)), lambda t: torch.tanh(self.b(t)) * 2.0, (h,))


class ConvThenPolynomial(nn.Module):
    """A convolution (quantized by precision="int8") and a Chebyshev polynomial of fixed degree (a Loop) of its
    output, scaled down so that the polynomial does not magnify the int8 rounding beyond the accuracy search's
    target (it would return the convolution to the float type)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(16, 8, 3, padding=1)  # 144 products per output: int8 noise averages out

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.conv(x))
        return h, torch.special.chebyshev_polynomial_t(torch.tanh(h * 0.1), 3)


def assert_within(got: torch.Tensor, want: torch.Tensor, dtype: str) -> None:
    """The validation rule with the documented tolerance of ``dtype``: |got - want| <= atol or <= rtol * |want|."""
    tolerance = pipeline.DEFAULT_TOLERANCES[dtype]
    error = (got - want).abs()
    allowed = torch.clamp(tolerance.rtol * want.abs(), min=tolerance.atol)
    assert bool((error <= allowed).all()), f"worst error / tolerance: {float((error / allowed).max()):.3g}"


def control_flow_island(module: pipeline.ConvertedModule, op: str) -> str:
    """The reason the one ``op`` node of the final graph is a float32 island (fails when it is not one)."""
    precision = module.report.precision
    assert precision is not None
    node = next(n for n in module.onnx.graph.node if n.op_type == op)
    reasons = {i.node: i.reason for i in precision.islands}
    assert node.name in reasons, f"{op} {node.name} is not a float32 island: {sorted(reasons)}"
    return reasons[node.name]


def gemm_input_types(module: pipeline.ConvertedModule) -> set[int]:
    inferred = onnx.shape_inference.infer_shapes(module.onnx).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.value_info, *inferred.input]}
    return {types[n.input[0]] for n in inferred.node if n.op_type in ("Gemm", "MatMul")}


@pytest.mark.parametrize(
    ("family", "precision"),
    [
        ("laguerre_polynomial_l", "fp16"),
        ("laguerre_polynomial_l", "bf16"),
        ("chebyshev_polynomial_t", "fp16"),
        ("chebyshev_polynomial_t", "bf16"),
    ],
)
def test_polynomial_loop_stays_float32_between_low_linears(family: str, precision: str) -> None:
    sample = (fresh(5, 6, seed=0) * 2 - 1, fresh(5, 6, seed=1))
    module = pipeline.convert(PolynomialBetweenLinears(family), sample, precision=precision)
    assert "control flow (Loop): runs in float32" in control_flow_island(module, "Loop")
    assert gemm_input_types(module) == {LOW[precision][0]}, "the Linear layers compute in the low type"
    x, n = fresh(5, 6, seed=7) * 2 - 1, fresh(5, 6, seed=8)
    with torch.no_grad():
        assert_within(module(x, n), PolynomialBetweenLinears(family)(x, n), LOW[precision][1])
    assert_builds(module)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_torch_cond_if_stays_float32_and_reads_the_low_linear_through_a_cast(precision: str) -> None:
    module = pipeline.convert(
        Branches(), (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)),), precision=precision
    )
    assert "control flow (If): runs in float32" in control_flow_island(module, "If")
    assert LOW[precision][0] in gemm_input_types(module), "the Linear before the If computes in the low type"
    for seed in (3, 4, 5, 6):  # both branches: the sign of h.sum() changes with the input
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            assert_within(module(x), Branches()(x), LOW[precision][1])
    assert_builds(module)


def test_int8_quantizes_the_convolution_beside_a_loop() -> None:
    calibration = [torch.randn(2, 16, 16, 16, generator=torch.Generator().manual_seed(s)) for s in range(4)]
    sample = (calibration[0],)
    module = pipeline.convert(ConvThenPolynomial(), sample, precision="int8", calibration=calibration)
    ops = [n.op_type for n in module.onnx.graph.node]
    assert "Loop" in ops and "QuantizeLinear" in ops, ops
    report = module.report.quantization
    assert report is not None and report.share == 1.0 and not report.unquantized
    assert module.report.accuracy is not None and module.report.accuracy.passed
    assert_builds(module)
