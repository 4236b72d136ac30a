"""LayerNormalization with its Mean/InvStdDev outputs used: Y unchanged, the statistics equal to ONNX Runtime's
within float32 rounding (its kernel takes E[x^2] - mean^2, the rewrite the definition's two-pass variance), the real
TensorRT-RTX parser rejects the original and builds the rewrite, and PyTorch's native_layer_norm converts, matches
PyTorch and builds."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
import torch
from rtx_build import assert_builds, rtx_build_error
from test_parser_fixes_support import apply, assert_same_outputs, assert_unchanged, ops, parse, run

import pipeline
from converters.settings import DynamicDim
from passes.parser_fixes.normalization import LayerNormStatistics
from passes.rules import Facts

HEADER = '<ir_version: 10, opset_import: ["" : 20]>\n'

CASES = [
    # (case, input type, axis, statistics shape, outputs used)
    ("last axis", "float[3,4,6]", -1, "float[3,4,1]", "y, m, s"),
    ("two axes", "float[3,4,6]", 1, "float[3,1,1]", "y, m, s"),
    ("all axes", "float[2,3]", 0, "float[1,1]", "y, m, s"),
    ("mean only", "float[3,5]", -1, "float[3,1]", "y, m"),
]


@pytest.mark.parametrize(("case", "inp", "axis", "stats", "used"), CASES, ids=[c[0] for c in CASES])
def test_statistics_match_and_build(case: str, inp: str, axis: int, stats: str, used: str) -> None:
    shape = inp[inp.index("[") + 1 : -1]
    norm = shape.split(",")[axis:]
    scale = f"float[{','.join(norm)}]"
    names = used.split(", ")
    outputs = ", ".join([f"{inp} y"] + [f"{stats} {n}" for n in names[1:]])
    model = parse(
        f"{HEADER}g ({inp} x, {scale} w, {scale} b) => ({outputs}) "
        f"{{ {used} = LayerNormalization<axis={axis}, epsilon=0.001>(x, w, b) }}"
    )
    model.graph.node[0].name = "ln"
    assert "ln" in (rtx_build_error(model) or "")  # more than one output
    after, result = apply(LayerNormStatistics(), model)
    assert result.modified and ops(after).count("LayerNormalization") == 1
    rng = np.random.default_rng(0)
    feeds = {
        "x": (rng.standard_normal([int(d) for d in shape.split(",")]) * 3 + 1).astype(np.float32),
        "w": rng.standard_normal([int(d) for d in norm]).astype(np.float32),
        "b": rng.standard_normal([int(d) for d in norm]).astype(np.float32),
    }
    y_before, y_after = run(model, feeds)[0], run(after, feeds)[0]
    np.testing.assert_array_equal(y_after, y_before)  # Y is the same node's
    assert_same_outputs(model, after, feeds, rtol=1e-5, atol=1e-6)
    assert rtx_build_error(after) is None


def test_float16_input_with_float32_statistics() -> None:
    model = parse(
        f"{HEADER}g (float16[4,8] x, float16[8] w) => (float16[4,8] y, float[4,1] m, float[4,1] s) "
        "{ y, m, s = LayerNormalization<axis=-1, stash_type=1>(x, w) }"
    )
    after, _ = apply(LayerNormStatistics(), model)
    assert "Cast" in ops(after)  # the statistics computed in the stash type, float32
    x = np.random.default_rng(1).standard_normal([4, 8]).astype(np.float16)
    assert_same_outputs(model, after, {"x": x, "w": np.ones(8, np.float16)}, rtol=1e-3, atol=1e-3)
    assert rtx_build_error(after) is None


def test_dynamic_batch() -> None:
    model = parse(
        f"{HEADER}g (float[N,6] x, float[6] w) => (float[N,6] y, float[N,1] m, float[N,1] s) "
        "{ y, m, s = LayerNormalization(x, w) }"
    )
    after, _ = apply(LayerNormStatistics(), model)
    for n in (1, 5):
        x = np.random.default_rng(n).standard_normal([n, 6]).astype(np.float32)
        assert_same_outputs(model, after, {"x": x, "w": np.ones(6, np.float32)}, rtol=1e-5, atol=1e-6)
    assert rtx_build_error(after, [DynamicDim("x", 0, "N", 1, 4, 8)]) is None


def test_y_only_is_left_with_the_reason() -> None:
    model = parse(f"{HEADER}g (float[2,3] x, float[3] w) => (float[2,3] y) {{ y = LayerNormalization(x, w) }}")
    assert_unchanged(LayerNormStatistics(), model)
    graph = gs.import_onnx(model)
    assert "only the Y output" in (LayerNormStatistics().reason(graph.nodes[0], Facts(graph)) or "")


class NativeLayerNorm(torch.nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.native_layer_norm(x, [4, 5], w, b, 1e-5)


def test_pytorch_native_layer_norm_converts_matches_and_builds() -> None:
    torch.manual_seed(0)
    model = NativeLayerNorm().eval()
    sample = (torch.randn(3, 4, 5) * 2 + 1, torch.randn(4, 5), torch.randn(4, 5))
    module = pipeline.convert(model, sample)  # validates the three outputs against PyTorch
    for got, want in zip(module(*sample), model(*sample), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert_builds(module)
