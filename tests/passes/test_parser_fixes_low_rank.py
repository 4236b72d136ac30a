"""Ops on too low a rank for TensorRT's parser (Softmax/ArgMax on a vector, Reduce on a 0-d input) lifted with
leading size-1 axes: the same numbers as before on ONNX Runtime, the real TensorRT-RTX parser and builder reject
the original and build the rewrite, and PyTorch models (a vector's softmax, argmax, a scalar's mean) convert,
match PyTorch and build."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
import torch
from rtx_build import assert_builds, rtx_build_error
from test_parser_fixes_support import apply, assert_same_outputs, assert_unchanged, created_names, ops, parse

import pipeline
from converters.settings import DynamicDim
from passes.parser_fixes.low_rank import LiftLowRank


def header(opset: int = 20) -> str:
    return f'<ir_version: 10, opset_import: ["" : {opset}]>\n'


CASES = [
    # (case, input, output, body, opset)
    ("softmax of a vector", "float[5] x", "float[5] y", "y = Softmax<axis=0>(x)", 20),
    ("softmax axis -1", "float[5] x", "float[5] y", "y = Softmax<axis=-1>(x)", 20),
    ("log-softmax of a vector", "float[4] x", "float[4] y", "y = LogSoftmax<axis=0>(x)", 20),
    ("hardmax of a vector", "float[6] x", "float[6] y", "y = Hardmax<axis=0>(x)", 20),
    ("softmax float16", "float16[5] x", "float16[5] y", "y = Softmax(x)", 20),
    ("argmax of a vector", "float[6] x", "int64 y", "y = ArgMax<axis=0, keepdims=0>(x)", 20),
    ("argmax keepdims", "float[6] x", "int64[1] y", "y = ArgMax<axis=0, keepdims=1>(x)", 20),
    ("argmin last index", "float[6] x", "int64 y", "y = ArgMin<axis=-1, keepdims=0, select_last_index=1>(x)", 20),
    ("mean of a scalar", "float x", "float y", "y = ReduceMean<keepdims=0>(x)", 20),
    ("sum of a scalar, empty axes", "float x", "float y", "a = Constant<value=int64[0] {}>() y = ReduceSum(x, a)", 20),
    ("L2 of a scalar", "float x", "float y", "y = ReduceL2<keepdims=1>(x)", 20),
    ("log-sum-exp of a scalar", "float x", "float y", "y = ReduceLogSumExp(x)", 20),
    ("sum-square of a scalar", "float x", "float y", "y = ReduceSumSquare(x)", 20),
    ("max of an int scalar", "int64 x", "int64 y", "y = ReduceMax(x)", 20),
    ("sum opset 13", "float x", "float y", "y = ReduceSum<keepdims=0>(x)", 13),
    ("mean opset 17, axes attribute", "float x", "float y", "y = ReduceMean<keepdims=0>(x)", 17),
]


def feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """A value per input: ties and a negative value in vectors, a negative scalar (ReduceL2 and LogSumExp see it)."""
    out = {}
    for value in model.graph.input:
        elem = value.type.tensor_type.elem_type
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        if not dims:
            out[value.name] = np.array(-1.75, dtype)
        else:
            base = np.array([0.5, -2.0, 3.0, 3.0, -7.25, 1.0][: dims[0]] + [0.25] * max(0, dims[0] - 6))
            out[value.name] = base.astype(dtype)
    return out


@pytest.mark.parametrize(("case", "inp", "out", "body", "opset"), CASES, ids=[c[0] for c in CASES])
def test_lifted_op_matches_and_builds(case: str, inp: str, out: str, body: str, opset: int) -> None:
    model = parse(f"{header(opset)}g ({inp}) => ({out}) {{ {body} }}")
    node = next(n for n in model.graph.node if n.op_type != "Constant")
    node.name = "low"
    before_error = rtx_build_error(model)
    assert before_error is not None and "low" in before_error  # the parser rejects the original node
    after, result = apply(LiftLowRank(), model)
    assert result.modified and created_names(after, "low")
    assert_same_outputs(model, after, feeds(model))
    assert rtx_build_error(after) is None


def test_dynamic_vector_keeps_its_dynamic_length() -> None:
    model = parse(f"{header()}g (float[N] x) => (float[N] y, int64 i) {{ y = Softmax(x) i = ArgMax<keepdims=0>(x) }}")
    after, _ = apply(LiftLowRank(), model)
    assert sorted(ops(after)) == ["ArgMax", "Softmax", "Squeeze", "Squeeze", "Unsqueeze", "Unsqueeze"]
    assert after.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    for n in (1, 7):
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        assert_same_outputs(model, after, {"x": x})
    assert rtx_build_error(after, [DynamicDim("x", 0, "N", 1, 4, 16)]) is None


@pytest.mark.parametrize(
    ("case", "text"),
    [
        ("softmax of a matrix", "g (float[2,3] x) => (float[2,3] y) { y = Softmax(x) }"),
        ("sum of a vector", "g (float[3] x) => (float y) { y = ReduceSum<keepdims=0>(x) }"),
        ("no-op reduction of a scalar", "g (float x) => (float y) { y = ReduceL1<noop_with_empty_axes=1>(x) }"),
        ("argmax of a matrix", "g (float[2,3] x) => (int64[2] y) { y = ArgMax<axis=1, keepdims=0>(x) }"),
    ],
)  # fmt: skip
def test_left_unchanged_where_the_parser_takes_it(case: str, text: str) -> None:
    assert_unchanged(LiftLowRank(), parse(header() + text))


def test_declines_with_the_reason() -> None:
    model = parse(f"{header()}g (float[2,3] x) => (float[2,3] y) {{ y = Softmax(x) }}")
    graph = gs.import_onnx(model)
    graph.nodes[0].name = "sm"
    assert "rank 2" in LiftLowRank().explain(graph, "sm")


class VectorOps(torch.nn.Module):
    """A vector's softmax and log-softmax, its argmax, a scalar's mean and the sum of a loss."""

    def forward(self, v: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        loss = torch.nn.functional.mse_loss(v, torch.zeros_like(v))
        return torch.softmax(v, 0), torch.log_softmax(v, -1), torch.argmax(v).float(), s.mean() * s.sum() + loss


def test_pytorch_vector_ops_convert_match_and_build() -> None:
    model = VectorOps().eval()
    sample = (torch.randn(7), torch.tensor(-1.5))
    module = pipeline.convert(model, sample, backend="onnxruntime", validate=False)
    for got, want in zip(module(*sample), model(*sample), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert_builds(module)


class VectorSoftmax(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 2.0, dim=0)


def test_pytorch_vector_softmax_with_a_dynamic_length() -> None:
    model = VectorSoftmax().eval()
    module = pipeline.convert(model, torch.randn(6), dynamic={"x": {0: ("n", 2, 6, 32)}})  # validates
    x = torch.randn(11)
    torch.testing.assert_close(module(x), model(x), rtol=1e-5, atol=1e-6)
    assert_builds(module)


@pytest.mark.parametrize("op", ["RandomNormalLike", "RandomUniformLike"])
def test_random_like_of_a_scalar_builds(op: str) -> None:
    """The builder fails on a 0-d Random*Like; lifted, it draws one value of the same type (random: not compared)."""
    model = parse(f"{header()}g (float x) => (float y) {{ y = {op}<seed=1.0>(x) }}")
    assert "build" in (rtx_build_error(model) or "")
    after, _ = apply(LiftLowRank(), model)
    assert sorted(ops(after)) == [op, "Squeeze", "Unsqueeze"]
    assert_same_outputs(model, after, {"x": np.array(0.5, np.float32)})  # same seed: the same draw on ORT
    assert rtx_build_error(after) is None
