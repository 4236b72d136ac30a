"""``x[mask] = values`` (``ScatterND`` of a transposed ``NonZero``) as ``CumSum`` + ``Gather`` + ``Where``: the
values of ONNX Runtime's kernels (broadcast values, one value per masked element, accumulation, nothing masked), the
real TensorRT-RTX parser rejects the original (no ``NonZero``) and builds the rewrite, and PyTorch's boolean-mask
assignments convert, match PyTorch and build."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
import torch
from rtx_build import assert_builds, rtx_build_error
from test_parser_fixes_support import apply, assert_same_outputs, assert_unchanged, ops

import pipeline
from passes.parser_fixes.masked_scatter import MaskedScatterNDAsWhere
from passes.rules import Facts
from pipeline.settings import DynamicDim

COUNT = (DynamicDim("u", 0, "count", 1, 20, 40),)


def masked_scatter_model(shape: list[int], mask_shape: list[int], reduction: str = "none") -> onnx.ModelProto:
    """``y = ScatterND(x, Transpose(NonZero(m)), u)`` as the exporter writes ``x[m] = u``."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("NonZero", ["m"], ["nz"], name="nonzero"),
         onnx.helper.make_node("Transpose", ["nz"], ["idx"], name="transpose", perm=[1, 0]),
         onnx.helper.make_node("ScatterND", ["x", "idx", "u"], ["y"], name="put", reduction=reduction)],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape),
         onnx.helper.make_tensor_value_info("m", onnx.TensorProto.BOOL, mask_shape),
         onnx.helper.make_tensor_value_info("u", onnx.TensorProto.FLOAT, ["count", *shape[len(mask_shape):]])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)],
    )  # fmt: skip
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=10)


@pytest.mark.parametrize("reduction", ["none", "add"])
@pytest.mark.parametrize("masked", [0.0, 0.4, 1.0], ids=["nothing", "some", "all"])
@pytest.mark.parametrize("mask_shape", [[2, 5, 4], [2, 5]], ids=["elements", "rows"])
def test_the_rewrite_matches_onnx_runtime_and_builds(reduction: str, masked: float, mask_shape: list[int]) -> None:
    model = masked_scatter_model([2, 5, 4], mask_shape, reduction)
    assert "NonZero" in (rtx_build_error(model, COUNT) or "")
    after, result = apply(MaskedScatterNDAsWhere(), model)
    assert result.modified and "NonZero" not in ops(after) and "ScatterND" not in ops(after)
    rng = np.random.default_rng(1)
    mask = rng.random(mask_shape) < masked
    feeds = {"x": rng.standard_normal((2, 5, 4)).astype(np.float32), "m": mask}
    feeds["u"] = rng.standard_normal((int(mask.sum()), *[2, 5, 4][len(mask_shape) :])).astype(np.float32)
    assert_same_outputs(model, after, feeds)
    assert rtx_build_error(after, COUNT) is None


def test_a_mask_not_of_the_datas_leading_shape_is_left_with_the_reason() -> None:
    model = masked_scatter_model([2, 5, 4], [2, 4])
    assert_unchanged(MaskedScatterNDAsWhere(), model)
    graph = gs.import_onnx(model)
    assert "not known to be the data's" in (MaskedScatterNDAsWhere().reason(graph.nodes[2], Facts(graph)) or "")


class Assignments(torch.nn.Module):
    """``x[mask] = row`` (broadcast, as T5Gemma 2 places its end-of-image embedding), ``x[mask] = values`` (one row
    per masked row) and ``x.index_put_((mask,), row, accumulate=True)``."""

    def forward(self, x: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mask = ids == 3
        placed, put, added, first = x * 2, x * 3, x * 4, x * 5
        placed[mask] = rows[0]
        put[mask] = rows  # the sample masks 3 rows
        added.index_put_((mask,), rows[0], accumulate=True)  # (x[mask] += v reads x[mask]: a NonZero)
        first[mask] = rows[:1]  # one row of values for every masked row
        return placed, put, added, first


def test_pytorch_boolean_mask_assignments_convert_match_and_build() -> None:
    torch.manual_seed(0)
    model = Assignments().eval()
    ids = torch.tensor([[3, 0, 3, 1, 1], [0, 0, 0, 0, 3]])
    sample = (torch.randn(2, 5, 4), ids, torch.randn(3, 4))
    module = pipeline.convert(model, sample)  # validates against PyTorch
    for got, want in zip(module(*sample), model(*sample), strict=True):
        torch.testing.assert_close(got, want)
    assert "NonZero" not in {n.op_type for n in module.onnx.graph.node}
    assert_builds(module)
