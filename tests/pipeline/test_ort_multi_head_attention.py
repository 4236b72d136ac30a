"""The ONNX Runtime session graph of an encoder: its decomposed attention as ``com.microsoft::MultiHeadAttention``.

A model exported below opset 23 computes ``scaled_dot_product_attention`` as ``MatMul``, ``Softmax`` and ``MatMul``
over heads split by reshapes and transposes; ``module.onnx`` keeps them (TensorRT's graph), the CPU session runs one
kernel per attention (``pipeline.runtime.ort.multi_head_attention``) where that is exactly the same computation.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper

import pipeline
from pipeline.runtime.ort.multi_head_attention import has_plain_attention, multi_head_attention_graph
from pipeline.runtime.ort.session_graph import runnable_model

HEADS, DIM = 4, 8


class SelfAttention(torch.nn.Module):
    """A pre-norm encoder block's attention, as transformers writes it (queries scaled before the split)."""

    def __init__(self, width: int = HEADS * DIM) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, steps, width = x.shape
        h = self.norm(x)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, -1, HEADS, DIM).transpose(1, 2)

        q, k, v = heads(self.q(h) * DIM**-0.5), heads(self.k(h)), heads(self.v(h))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)
        return x + self.o(out.transpose(1, 2).reshape(batch, steps, width))


def ops(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in model.graph.node)


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def test_the_session_runs_multi_head_attention_and_module_onnx_stays_standard() -> None:
    torch.manual_seed(0)
    model = SelfAttention().eval()
    x = torch.randn(2, 24, HEADS * DIM)
    module = pipeline.convert(model, x, opset=20, dynamic={"x": {0: ("batch", 1, 2, 4)}})
    session_graph = runnable_model(module.onnx, "onnxruntime", module.settings)
    assert ops(session_graph)["MultiHeadAttention"] == 1
    assert ops(session_graph)["Softmax"] == 0 and ops(session_graph)["Transpose"] == 0
    assert ops(module.onnx)["Softmax"] == 1  # TensorRT's graph: standard ONNX
    assert all(o.domain != "com.microsoft" for o in module.onnx.opset_import)
    on_gpu = dataclasses.replace(module.settings, ort_providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    assert ops(runnable_model(module.onnx, "onnxruntime", on_gpu))["MultiHeadAttention"] == 0
    for rows in (1, 3):  # the dynamic batch
        sample = torch.randn(rows, 24, HEADS * DIM)
        with torch.no_grad():
            expected = model(sample)
        torch.testing.assert_close(module(sample), expected, atol=1e-5, rtol=1e-5)


def decomposed_graph(mask: bool = False, computed_shape: bool = False) -> onnx.ModelProto:
    """``MatMul -> Softmax -> MatMul`` over [1, 16, 32] queries, keys and values split into 4 heads of 8, as the
    exporter writes it (the keys transposed by a second ``Transpose``); ``mask``: an additive mask before the
    softmax; ``computed_shape``: the queries' head split reads a shape computed at run time."""
    steps, width = 16, HEADS * DIM
    split = numpy_helper.from_array(np.array([1, steps, HEADS, DIM], np.int64), "split")
    merge = numpy_helper.from_array(np.array([1, steps, width], np.int64), "merge")
    scale = numpy_helper.from_array(np.array(DIM**-0.5, np.float32), "scale")
    nodes = [
        helper.make_node("Mul", ["q", "scale"], ["q_scaled"]),
        helper.make_node("Reshape", ["q_scaled", "q_shape" if computed_shape else "split"], ["q4"]),
        helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["k", "split"], ["k4"]),
        helper.make_node("Transpose", ["k4"], ["kh"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("Reshape", ["v", "split"], ["v4"]),
        helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qt", "kt"], ["scores"]),
        *([helper.make_node("Add", ["scores", "mask"], ["masked"])] if mask else []),
        helper.make_node("Softmax", ["masked" if mask else "scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "vt"], ["heads"]),
        helper.make_node("Transpose", ["heads"], ["merged4"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["merged4", "merge"], ["out"]),
    ]
    initializers = [split, merge, scale]
    if mask:
        initializers.append(numpy_helper.from_array(np.triu(np.full((steps, steps), -1e4, np.float32), 1), "mask"))
    if computed_shape:
        nodes.insert(0, helper.make_node("Shape", ["q4_like"], ["q_shape"]))
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, steps, width]) for n in "qkv"]
    if computed_shape:
        inputs.append(helper.make_tensor_value_info("q4_like", TensorProto.FLOAT, [1, steps, HEADS, DIM]))
    graph = helper.make_graph(
        nodes, "attention", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], initializers
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    return onnx.shape_inference.infer_shapes(model)


def feed(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def test_the_kernel_takes_the_split_merge_and_scale_and_gives_the_same_numbers() -> None:
    model = decomposed_graph()
    onnx.checker.check_model(model, full_check=True)
    rewritten = multi_head_attention_graph(model)
    assert [(n.domain, n.op_type) for n in rewritten.graph.node] == [("com.microsoft", "MultiHeadAttention")]
    kernel = rewritten.graph.node[0]
    assert list(kernel.input) == ["q", "k", "v"] and list(kernel.output) == ["out"]
    attributes = {a.name: helper.get_attribute_value(a) for a in kernel.attribute}
    assert attributes["num_heads"] == HEADS and attributes["scale"] == np.float32(DIM**-0.5)
    assert len(model.graph.node) == 13  # the original is not modified
    inputs = feed(model)
    np.testing.assert_allclose(run(rewritten, inputs)[0], run(model, inputs)[0], atol=1e-6, rtol=1e-5)


def test_a_masked_attention_or_a_shape_computed_at_run_time_stays_as_it_is() -> None:
    for model in (decomposed_graph(mask=True), decomposed_graph(computed_shape=True)):
        assert not has_plain_attention(model)
        assert multi_head_attention_graph(model) is model


def test_an_operand_without_a_recorded_type_or_an_external_scale_is_left_as_it_is(tmp_path: Path) -> None:
    """Graphs the rewrite cannot prove: a session is made of them as they are, never a raw error at load."""
    untyped = decomposed_graph()  # an Identity before the scale, its output without a recorded type
    untyped.graph.node[0].input[0] = "q_id"
    untyped.graph.node.insert(0, helper.make_node("Identity", ["q"], ["q_id"]))
    del untyped.graph.value_info[:]
    assert multi_head_attention_graph(untyped) is untyped
    external = decomposed_graph()  # the scale a weight in a file, as a loaded artifact keeps its weights
    onnx.save_model(external, tmp_path / "m.onnx", save_as_external_data=True, size_threshold=0, location="w.bin")
    loaded = onnx.load_model(tmp_path / "m.onnx", load_external_data=False)
    rewritten = multi_head_attention_graph(loaded)  # the scale is not read: no kernel, no error
    assert ops(rewritten)["MultiHeadAttention"] == 0
