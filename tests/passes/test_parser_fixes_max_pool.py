"""MaxPool with Indices or dilations computed from gathered windows: the same values and indices as ONNX Runtime's
MaxPool (ties, padding, ceil_mode, 1-D to 3-D, the exporter's 1x1 offset pool), the real TensorRT-RTX parser
rejects the original and builds the rewrite, and PyTorch's max_pool*d(return_indices=True), dilated max pooling,
adaptive max pooling and the max_unpool round trip convert, match PyTorch and build."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
import torch
import torch.nn.functional as F
from rtx_build import assert_builds, rtx_build_error
from test_parser_fixes_support import apply, assert_same_outputs, assert_unchanged, ops, parse

import pipeline
from converters.settings import DynamicDim
from passes.parser_fixes.max_pool import MaxPoolByWindows
from passes.rules import Facts

HEADER = '<ir_version: 10, opset_import: ["" : 20]>\n'

POOLS = [
    # (case, input shape, attributes)
    ("2-D 2x2 stride 2", [2, 3, 4, 6], "kernel_shape=[2, 2], strides=[2, 2]"),
    ("2-D overlapping 3x3 stride 1", [1, 2, 5, 5], "kernel_shape=[3, 3], strides=[1, 1]"),
    ("2-D pads", [1, 2, 5, 6], "kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]"),
    ("2-D ceil_mode", [1, 2, 3, 6], "kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1"),
    ("2-D dilated", [1, 2, 7, 7], "kernel_shape=[2, 3], strides=[1, 2], dilations=[2, 2], pads=[1, 0, 1, 1]"),
    ("1-D", [2, 3, 9], "kernel_shape=[3], strides=[2]"),
    ("1-D dilated", [2, 3, 9], "kernel_shape=[2], strides=[1], dilations=[3]"),
    ("3-D", [1, 2, 4, 5, 4], "kernel_shape=[2, 2, 2], strides=[2, 1, 2], pads=[0, 1, 0, 0, 0, 1]"),
    ("1x1 offset pool", [2, 3, 4, 4], "kernel_shape=[1, 1], strides=[1, 1]"),
]


def pool_model(shape: list[int], attrs: str, indices: bool = True, dtype: str = "float") -> onnx.ModelProto:
    dims = ",".join(map(str, shape))
    symbolic = ",".join(f"d{i}" for i in range(len(shape)))  # shape inference fills them in
    outputs = f"{dtype}[{symbolic}] y, int64[{symbolic}] i" if indices else f"{dtype}[{symbolic}] y"
    lhs = "y, i" if indices else "y"
    model = parse(f"{HEADER}g ({dtype}[{dims}] x) => ({outputs}) {{ {lhs} = MaxPool<{attrs}>(x) }}")
    model.graph.node[0].name = "pool"
    return model


def with_ties(shape: list[int], dtype: type = np.float32) -> np.ndarray:
    """Few distinct values (ties in every window), infinities, -0.0 and a large value."""
    x = np.random.default_rng(0).integers(-3, 3, shape).astype(dtype)
    flat = x.reshape(-1)
    flat[:5] = [np.inf, -np.inf, 1e30, -0.0, 0.0]
    return x


@pytest.mark.parametrize(("case", "shape", "attrs"), POOLS, ids=[p[0] for p in POOLS])
def test_values_and_indices_match_onnx_runtime(case: str, shape: list[int], attrs: str) -> None:
    model = pool_model(shape, attrs)
    assert rtx_build_error(model) is not None  # the parser rejects the Indices output (and dilations)
    after, result = apply(MaxPoolByWindows(), model)
    assert result.modified and {"Gather", "ReduceMin", "Where"} <= set(ops(after))
    assert_same_outputs(model, after, {"x": with_ties(shape)})
    assert_same_outputs(model, after, {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)})
    assert rtx_build_error(after) is None


def test_dilated_pool_without_indices() -> None:
    model = pool_model([1, 2, 7, 7], "kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]", indices=False)
    assert rtx_build_error(model) is not None
    after, _ = apply(MaxPoolByWindows(), model)
    assert "MaxPool" not in ops(after) and "ReduceMax" in ops(after)
    assert_same_outputs(model, after, {"x": with_ties([1, 2, 7, 7])})
    assert rtx_build_error(after) is None


def test_float16() -> None:
    model = pool_model([1, 2, 4, 4], "kernel_shape=[2, 2], strides=[2, 2]", dtype="float16")
    after, _ = apply(MaxPoolByWindows(), model)
    assert_same_outputs(model, after, {"x": with_ties([1, 2, 4, 4], np.float16)})
    assert rtx_build_error(after) is None


def test_dynamic_batch_and_channels() -> None:
    model = parse(
        f"{HEADER}g (float[N,C,6,6] x) => (float[N,C,3,3] y, int64[N,C,3,3] i) "
        "{ y, i = MaxPool<kernel_shape=[2, 2], strides=[2, 2]>(x) }"
    )
    after, _ = apply(MaxPoolByWindows(), model)
    assert {"Range", "Shape"} <= set(ops(after))  # plane offsets from the runtime shape, not a constant
    for shape in ([1, 1, 6, 6], [3, 2, 6, 6]):
        assert_same_outputs(model, after, {"x": with_ties(shape)})
    dims = [DynamicDim("x", 0, "N", 1, 2, 4), DynamicDim("x", 1, "C", 1, 2, 4)]
    assert rtx_build_error(after, dims) is None


@pytest.mark.parametrize(
    ("case", "text", "reason"),
    [
        ("plain MaxPool", "g (float[1,1,4,4] x) => (float[1,1,2,2] y) "
         "{ y = MaxPool<kernel_shape=[2,2], strides=[2,2]>(x) }", "not used"),
        ("dynamic spatial", "g (float[1,1,H,4] x) => (float[1,1,A,2] y, int64[1,1,A,2] i) "
         "{ y, i = MaxPool<kernel_shape=[2,2], strides=[2,2]>(x) }", "not static"),
        ("column-major indices", "g (float[1,1,4,4] x) => (float[1,1,2,2] y, int64[1,1,2,2] i) "
         "{ y, i = MaxPool<kernel_shape=[2,2], strides=[2,2], storage_order=1>(x) }", "storage_order"),
        ("SAME padding", "g (float[1,1,4,4] x) => (float[1,1,4,4] y, int64[1,1,4,4] i) "
         "{ y, i = MaxPool<kernel_shape=[2,2], auto_pad=\"SAME_UPPER\">(x) }", "auto_pad"),
    ],
)  # fmt: skip
def test_left_unchanged_with_the_reason(case: str, text: str, reason: str) -> None:
    model = onnx.parser.parse_model(HEADER + text)
    model.graph.node[0].name = "pool"
    assert_unchanged(MaxPoolByWindows(), model)
    graph = gs.import_onnx(model)
    assert reason in (MaxPoolByWindows().reason(graph.nodes[0], Facts(graph)) or "")


class PoolWithIndices(torch.nn.Module):
    """Max pooling with indices (2-D, dilated 1-D, 3-D), adaptive max pooling, and the unpool round trip."""

    def forward(self, x: torch.Tensor, v: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y, i = F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, return_indices=True)
        y1, i1 = F.max_pool1d(v, 2, stride=1, dilation=2, return_indices=True)
        y3, i3 = F.max_pool3d(w, 2, return_indices=True)
        ya, ia = F.adaptive_max_pool2d(x, (3, 4), return_indices=True)
        p, pi = F.max_pool2d(x, 2, return_indices=True)
        unpooled = F.max_unpool2d(p, pi, 2, output_size=x.shape[-2:])
        return y, i, y1, i1, y3, i3, ya, ia, unpooled


def test_pytorch_max_pooling_with_indices_converts_matches_and_builds() -> None:
    torch.manual_seed(0)
    model = PoolWithIndices().eval()
    x = torch.randint(-4, 4, (2, 3, 6, 8)).float()  # ties: the first maximum's index, as PyTorch
    sample = (x, torch.randn(2, 3, 9), torch.randn(1, 2, 4, 4, 6))
    module = pipeline.convert(model, sample)  # validates every output against PyTorch
    for got, want in zip(module(*sample), model(*sample), strict=True):
        torch.testing.assert_close(got, want)
    assert not [n for n in module.onnx.graph.node if n.op_type == "MaxPool" and len(n.output) > 1]
    assert_builds(module)


class DilatedPool(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, 3, stride=1, padding=1, dilation=2)


def test_pytorch_dilated_max_pool_with_a_dynamic_batch() -> None:
    model = DilatedPool().eval()
    module = pipeline.convert(model, torch.randn(2, 3, 8, 8), dynamic={"x": {0: ("batch", 1, 2, 8)}})
    x = torch.randn(5, 3, 8, 8)
    torch.testing.assert_close(module(x), model(x))
    assert_builds(module)
