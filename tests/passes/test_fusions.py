"""RMSNorm and rotate-half RoPE as the opset-23 ops: what the pass rewrites, what it leaves, the same numbers on ONNX
Runtime (float32 and float16), and the real TensorRT-RTX builder taking the result."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from converters.settings import Settings
from passes.fusions import FuseRotaryEmbedding, fuse_decoder_ops

B, H, S, D = 2, 4, 5, 16
TYPES = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


def decoder_block(
    dtype: type = np.float32, opset: int = 24, rotate_half: bool = True, angle_rows: int = B
) -> onnx.ModelProto:
    """A decomposed RMSNorm (with a weight) feeding queries, and transformers' rotate-half RoPE on them (its angles
    ``[angle_rows, S, D / 2]``: one row broadcast over the batch when the positions are the same for every row)."""
    t = TYPES[dtype]
    rng = np.random.default_rng(0)
    constants = {
        "two": np.array(2.0, dtype), "eps": np.array(1e-6, dtype), "axes": np.array([-1]),
        "weight": rng.normal(1.0, 0.1, D * H).astype(dtype), "shape": np.array([B, S, H, D]), "one": np.array([1]),
        "zero": np.array([0]), "half": np.array([D // 2]), "end": np.array([np.iinfo(np.int64).max]),
        "last": np.array([3]), "step": np.array([1]),
    }  # fmt: skip
    halves = ["neg", "lower"] if rotate_half else ["lower", "neg"]
    nodes = [
        helper.make_node("Pow", ["h", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["mean"], keepdims=1),
        helper.make_node("Add", ["mean", "eps"], ["var"]),
        helper.make_node("Sqrt", ["var"], ["std"]),
        helper.make_node("Reciprocal", ["std"], ["inv"]),
        helper.make_node("Mul", ["h", "inv"], ["normed"]),
        helper.make_node("Mul", ["weight", "normed"], ["scaled"]),
        helper.make_node("Reshape", ["scaled", "shape"], ["heads"]),
        helper.make_node("Transpose", ["heads"], ["x"], perm=[0, 2, 1, 3]),
        helper.make_node("Concat", ["f", "f"], ["emb"], axis=-1),
        helper.make_node("Cos", ["emb"], ["cos3"]),
        helper.make_node("Sin", ["emb"], ["sin3"]),
        helper.make_node("Unsqueeze", ["cos3", "one"], ["cos"]),
        helper.make_node("Unsqueeze", ["sin3", "one"], ["sin"]),
        helper.make_node("Mul", ["x", "cos"], ["straight"]),
        helper.make_node("Slice", ["x", "zero", "half", "last", "step"], ["lower"]),
        helper.make_node("Slice", ["x", "half", "end", "last", "step"], ["upper"]),
        helper.make_node("Neg", ["upper"], ["neg"]),
        helper.make_node("Concat", halves, ["rotated"], axis=-1),
        helper.make_node("Mul", ["rotated", "sin"], ["turned"]),
        helper.make_node("Add", ["straight", "turned"], ["y"], name="rope"),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [
            helper.make_tensor_value_info("h", t, [B, S, H * D]),
            helper.make_tensor_value_info("f", t, [angle_rows, S, D // 2]),
        ],
        [helper.make_tensor_value_info("y", t, [B, H, S, D])],
        [numpy_helper.from_array(v, k) for k, v in constants.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def fused(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    graph = gs.import_onnx(model)
    result = fuse_decoder_ops()(graph, Settings())
    out = gs.export_onnx(result.graph)
    out.ir_version = model.ir_version
    return out, result.modified


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feed)[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rms_norm_and_rope_become_the_opset_23_ops_with_the_same_numbers(dtype: type) -> None:
    model = decoder_block(dtype)
    after, modified = fused(model)
    ops = collections.Counter(n.op_type for n in after.graph.node)
    assert modified and ops["RMSNormalization"] == 1 and ops["RotaryEmbedding"] == 1
    assert not {"Pow", "ReduceMean", "Sqrt", "Reciprocal", "Neg", "Slice", "Unsqueeze"} & set(ops)
    onnx.checker.check_model(after, full_check=True)
    rng = np.random.default_rng(1)
    angles = np.arange(S)[None, :, None] * (1.0 / 10000 ** (np.arange(0, D, 2) / D))[None, None, :]
    feed = {"h": rng.normal(size=(B, S, H * D)).astype(dtype), "f": np.repeat(angles, B, 0).astype(dtype)}
    expected, got = run(model, feed), run(after, feed)
    tolerance = 1e-5 if dtype is np.float32 else 4e-3
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), atol=tolerance, rtol=tolerance)


def test_what_only_looks_like_rope_or_is_below_opset_23_is_left() -> None:
    swapped = decoder_block(rotate_half=False)  # Concat(x[..., :h], -x[..., h:]): not rotate_half
    after, _ = fused(swapped)
    ops = collections.Counter(n.op_type for n in after.graph.node)
    assert ops["RotaryEmbedding"] == 0 and ops["Neg"] == 1 and ops["RMSNormalization"] == 1
    reason = FuseRotaryEmbedding().explain(gs.import_onnx(swapped), "rope")
    assert "does not match 'rope'" in reason and "halves" in reason
    old = decoder_block(opset=22)
    after, modified = fused(old)
    assert not modified and [n.op_type for n in after.graph.node] == [n.op_type for n in old.graph.node]


def test_angles_of_one_row_for_a_batch_are_left_and_run_as_before() -> None:
    """ONNX RotaryEmbedding's caches must have x's batch; angles of one row broadcast over a batch of 2 (a decoder
    computing its positions from the cache's length, as T5Gemma's does) keep the decomposed RoPE."""
    model = decoder_block(angle_rows=1)
    after, _ = fused(model)
    ops = collections.Counter(n.op_type for n in after.graph.node)
    assert ops["RotaryEmbedding"] == 0 and ops["Neg"] == 1 and ops["RMSNormalization"] == 1
    rng = np.random.default_rng(2)
    feed = {
        "h": rng.normal(size=(B, S, H * D)).astype(np.float32),
        "f": rng.normal(size=(1, S, D // 2)).astype(np.float32),
    }
    np.testing.assert_allclose(run(after, feed), run(model, feed), atol=1e-5, rtol=1e-5)


def test_tensorrt_rtx_builds_the_fused_ops() -> None:
    from pipeline.precision.buildable import build_error, rtx_available

    if not rtx_available():
        pytest.skip("TensorRT-RTX is not installed")
    for dtype in (np.float32, np.float16):
        after, _ = fused(decoder_block(dtype))
        assert build_error(after, ()) is None
