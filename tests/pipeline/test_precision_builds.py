"""The precision stage holds its graph to the real TensorRT-RTX builder (when it imports and builds the float32
graph): a float16 graph the builder rejects gets the nodes that break it kept in float32 (the build fallback), or is a
ConversionError naming the builder's reason and what was tried, never a result."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper
from rtx_build import SKIP_REASON, rtx_build_error
from torch import nn

import pipeline
from pipeline.precision import build_fallback
from pipeline.precision.buildable import BuilderGate, rtx_available


class MaskedAttention(nn.Module):
    """Self-attention with a boolean causal mask: torch exports Softmax, then the NaN guard Where(IsNaN(p), 0, p)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(32, 96), nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 2, 16).permute(2, 0, 3, 1, 4)
        mask = torch.ones(s, s, dtype=torch.bool).tril()
        y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, s, 32))


def test_fp16_attention_builds_and_a_graph_the_builder_rejects_keeps_a_matmul_in_float32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    model, sample = MaskedAttention().eval(), torch.randn(2, 8, 32)
    module = pipeline.convert(model, sample, backend="onnxruntime", precision="fp16")
    assert "Where" in {n.op_type for n in module.onnx.graph.node}  # the guard is there
    assert rtx_build_error(module.onnx) is None
    # keeping the guard in float32 puts a Cast between it and the float16 MatMul: what TensorRT-RTX 1.7 rejects; the
    # build fallback keeps an attention MatMul in float32 too, and the graph builds
    kept = pipeline.convert(model, sample, backend="onnxruntime", precision="fp16", keep_fp32=("op:Where",))
    assert kept.report.precision is not None
    islands = [i for i in kept.report.precision.islands if i.source == "build"]
    assert [i.op for i in islands] == ["MatMul"] and "mha_fusion" in islands[0].reason
    assert rtx_build_error(kept.onnx) is None
    # a search that cannot finish within its builds is the error, naming the builder's reason and what was tried
    monkeypatch.setattr(build_fallback, "MAX_BUILDS", 2)
    with pytest.raises(
        pipeline.ConversionError,
        match=r"builds the float32 graph but not the float16 graph.*mha_.*no set of nodes found within 2 builds",
    ):
        pipeline.convert(model, sample, backend="onnxruntime", precision="fp16", keep_fp32=("op:Where",))


def _det_model() -> onnx.ModelProto:
    node = helper.make_node("Det", ["x"], ["y"], name="det")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 3, 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def test_the_gate_is_off_when_the_builder_rejects_the_float32_graph_too() -> None:
    error = rtx_build_error(_det_model())
    assert error is not None and "'det' (Det)" in error  # the parser's per-node error, with the node
    gate = BuilderGate(_det_model())
    assert not gate.enabled and gate.rejects(_det_model()) is None  # not the precision's fault: nothing to hold


def test_symbolic_dims_build_with_their_declared_profile() -> None:
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    error = rtx_build_error(model)
    assert error is not None and "'x' axis 0 is dynamic but has no declared range" in error
    dims = pipeline.Settings(dynamic={"x": {0: ("batch", 1, 4, 8)}}).dynamic
    assert rtx_build_error(model, dims) is None


def test_the_gate_builds_the_float32_graph_only_when_a_candidate_is_rejected() -> None:
    if not rtx_available():
        pytest.skip(SKIP_REASON)
    relu = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])],
    )
    model = helper.make_model(relu, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    gate = BuilderGate(model)
    assert gate.rejects(model) is None and gate.builds == 1  # the candidate built: no float32 build
    assert gate.rejects(_det_model()) is not None and gate.builds == 3  # rejected: the float32 graph built once
    assert gate.enabled and gate.builds == 3
