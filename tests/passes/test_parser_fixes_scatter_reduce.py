"""ScatterElements and ScatterND with a reduction as a masked reduction: the values of ONNX Runtime's kernels
(repeated and negative indices, every reduction, integers, an index tensor smaller than the data), the real
TensorRT-RTX parser rejects the original and builds the rewrite, and PyTorch's scatter_add, scatter_reduce,
index_put(accumulate=True) and index_add convert, match PyTorch and build."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
import torch
from rtx_build import assert_builds, rtx_build_error
from test_parser_fixes_support import apply, assert_same_outputs, assert_unchanged, ops, parse

import pipeline
from passes.parser_fixes.scatter_reduce import ScatterReductionToMask
from passes.rules import Facts

HEADER = '<ir_version: 10, opset_import: ["" : 18]>\n'

ELEMENTS = [
    # (case, type, data shape, indices shape, axis, reduction)
    ("add axis 0", "float", [6, 4], [5, 4], 0, "add"),
    ("add axis 1, smaller index", "float", [3, 7], [2, 5], 1, "add"),
    ("mul", "float", [6, 4], [6, 4], 0, "mul"),
    ("max axis -1", "float", [3, 4, 5], [3, 4, 8], -1, "max"),
    ("min", "float", [6, 4], [3, 2], 0, "min"),
    ("int64 add", "int64", [6, 4], [5, 4], 0, "add"),
    ("int32 max", "int32", [6, 4], [5, 4], 0, "max"),
    ("float16 add", "float16", [6, 4], [5, 4], 0, "add"),
]


def values(shape: list[int], dtype: str, seed: int) -> np.ndarray:
    """Small integers (halves for floats) in ONNX type ``dtype``."""
    dtype = {"float": "float32"}.get(dtype, dtype)
    rng = np.random.default_rng(seed)
    if dtype in ("int64", "int32"):
        return rng.integers(-50, 50, shape).astype(dtype)
    return (rng.integers(-8, 8, shape) * 0.5).astype(dtype)  # exact sums and products: the order does not round


@pytest.mark.parametrize(
    ("case", "dtype", "data", "index", "axis", "reduction"), ELEMENTS, ids=[c[0] for c in ELEMENTS]
)
def test_scatter_elements_matches_and_builds(
    case: str, dtype: str, data: list[int], index: list[int], axis: int, reduction: str
) -> None:
    d, i = ",".join(map(str, data)), ",".join(map(str, index))
    model = parse(
        f"{HEADER}g ({dtype}[{d}] x, int64[{i}] idx, {dtype}[{i}] u) => ({dtype}[{d}] y) "
        f'{{ y = ScatterElements<axis={axis}, reduction="{reduction}">(x, idx, u) }}'
    )
    model.graph.node[0].name = "scatter"
    assert "Unsupported reduction type" in (rtx_build_error(model) or "")  # (the parser names no node here)
    after, result = apply(ScatterReductionToMask(), model)
    assert result.modified and "ScatterElements" not in ops(after)
    size = data[axis]
    rng = np.random.default_rng(3)
    idx = rng.integers(-size, size, index)  # repeated and negative indices
    feeds = {"x": values(data, dtype, 1), "idx": idx, "u": values(index, dtype, 2)}
    # ONNX Runtime has no float16 ScatterElements with a reduction: the ONNX reference evaluator runs both
    assert_same_outputs(model, after, feeds, reference=dtype == "float16")
    assert rtx_build_error(after) is None


ND = [
    # (case, data shape, indices shape, updates shape, reduction)
    ("rows", [5, 4], [6, 1], [6, 4], "add"),
    ("elements", [5, 4], [3, 2, 2], [3, 2], "add"),
    ("3-D by pairs, max", [3, 4, 2], [5, 2], [5, 2], "max"),
    ("mul", [5, 4], [7, 1], [7, 4], "mul"),
]


@pytest.mark.parametrize(("case", "data", "index", "updates", "reduction"), ND, ids=[c[0] for c in ND])
def test_scatter_nd_matches_and_builds(
    case: str, data: list[int], index: list[int], updates: list[int], reduction: str
) -> None:
    d, i, u = (",".join(map(str, s)) for s in (data, index, updates))
    model = parse(
        f"{HEADER}g (float[{d}] x, int64[{i}] idx, float[{u}] u) => (float[{d}] y) "
        f'{{ y = ScatterND<reduction="{reduction}">(x, idx, u) }}'
    )
    model.graph.node[0].name = "scatter"
    assert "scatter" in (rtx_build_error(model) or "")
    after, _ = apply(ScatterReductionToMask(), model)
    assert "ScatterND" not in ops(after)
    k = index[-1]
    rng = np.random.default_rng(4)
    idx = np.stack([rng.integers(-data[j], data[j], index[:-1]) for j in range(k)], axis=-1)
    feeds = {"x": values(data, "float32", 1), "idx": idx, "u": values(updates, "float32", 2)}
    assert_same_outputs(model, after, feeds)
    assert rtx_build_error(after) is None


@pytest.mark.parametrize(
    ("case", "text", "reason"),
    [
        ("no reduction", "g (float[4] x, int64[2] i, float[2] u) => (float[4] y) "
         "{ y = ScatterElements(x, i, u) }", "no reduction"),
        ("dynamic data", "g (float[N] x, int64[2] i, float[2] u) => (float[N] y) "
         "{ y = ScatterElements<reduction=\"add\">(x, i, u) }", "not static"),
    ],
)  # fmt: skip
def test_left_unchanged_with_the_reason(case: str, text: str, reason: str) -> None:
    model = onnx.parser.parse_model(HEADER + text)
    assert_unchanged(ScatterReductionToMask(), model)
    graph = gs.import_onnx(model)
    assert reason in (ScatterReductionToMask().reason(graph.nodes[0], Facts(graph)) or "")


class Scatters(torch.nn.Module):
    """scatter_add, scatter_reduce (amax, prod), index_put with accumulation and index_add."""

    def forward(self, x: torch.Tensor, idx: torch.Tensor, src: torch.Tensor, rows: torch.Tensor) -> tuple:
        added = x.scatter_add(0, idx, src)
        peak = x.scatter_reduce(1, idx[:, :3], src[:, :3], reduce="amax", include_self=True)
        prod = x.scatter_reduce(0, idx, src, reduce="prod")
        put = x.index_put((rows,), src[: rows.numel()], accumulate=True)
        index_added = x.index_add(0, rows, src[: rows.numel()])
        return added, peak, prod, put, index_added


def test_pytorch_scatter_reductions_convert_match_and_build() -> None:
    torch.manual_seed(0)
    model = Scatters().eval()
    sample = (torch.randint(-4, 4, (5, 4)).float(), torch.randint(0, 4, (5, 4)),
              torch.randint(-4, 4, (5, 4)).float() / 2, torch.tensor([0, 3, 0, 1]))  # fmt: skip
    module = pipeline.convert(model, sample)  # validates against PyTorch
    for got, want in zip(module(*sample), model(*sample), strict=True):
        torch.testing.assert_close(got, want)
    assert_builds(module)
