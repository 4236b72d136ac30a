"""The models folding hands to ONNX Runtime are, byte for byte, what graph-surgeon's exporter made of them before the
export was written straight into the proto (the reference below is that earlier export)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto as TP
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter, constant_to_onnx_tensor, dtype_to_onnx
from onnx_graphsurgeon.ir.tensor import LazyValues, SparseValues
from test_folding_matches_graph_surgeon import CASES, chain, init, make, node, vi

from passes import to_graph
from passes.folding import evaluation as fold_evaluation
from passes.folding.fold import fold_constants


def reference_export(
    graph: gs.Graph,
    nodes: list[gs.Node],
    outputs: list[gs.Tensor],
    folded: Mapping[str, np.ndarray],
    domains: list[onnx.OperatorSetIdProto],
) -> onnx.ModelProto:
    produced = {t.name for t in outputs}
    used: dict[str, gs.Tensor] = {}
    for evaluated in nodes:
        for tensor in (*evaluated.inputs, *evaluated.outputs):
            if tensor.name:
                used.setdefault(tensor.name, tensor)
    inputs = [t for t in graph.inputs if t.name in used]
    skip = produced | {t.name for t in inputs}
    initializers, sparse, value_info = [], [], []
    for name, tensor in used.items():
        if name in folded:
            initializers.append(constant_to_onnx_tensor(gs.Constant(name, folded[name])))
        elif isinstance(tensor, gs.Constant):
            if isinstance(tensor._values, SparseValues):
                sparse.append(OnnxExporter.export_sparse_tensor_proto(tensor))
            elif isinstance(tensor._values, LazyValues):
                initializers.append(OnnxExporter.export_tensor_proto(tensor))
            else:
                initializers.append(constant_to_onnx_tensor(tensor))
        elif name not in skip and (tensor.dtype is not None or tensor.shape is not None):
            value_info.append(reference_value_info(tensor))
    proto = onnx.helper.make_graph(
        nodes=[OnnxExporter.export_node(evaluated) for evaluated in nodes],
        name=graph.name,
        inputs=[reference_value_info(t) for t in inputs],
        outputs=[reference_value_info(t) for t in outputs],
        initializer=initializers,
        sparse_initializer=sparse,
        doc_string=graph.doc_string,
        value_info=value_info,
    )
    model = onnx.helper.make_model(proto, opset_imports=domains, functions=[])
    model.producer_name = ""
    model.producer_version = ""
    if graph.ir_version is not None:
        model.ir_version = graph.ir_version
    return model


def reference_value_info(tensor: gs.Tensor) -> onnx.ValueInfoProto:
    if tensor.dtype is None:
        return onnx.helper.make_empty_tensor_value_info(tensor.name)
    return onnx.helper.make_tensor_value_info(tensor.name, dtype_to_onnx(tensor.dtype), tensor.shape)


SHAPE_INTO_SESSION = make(  # the Gathers fold from the static shape; their values go into the session of the Concat
    [
        node("Shape", ["x"], ["shape"], "shape"),
        node("Gather", ["shape", "i0"], ["d0"], "gather0", axis=0),
        node("Gather", ["shape", "i1"], ["d1"], "gather1", axis=0),
        node("Concat", ["d1", "d0"], ["new_shape"], "concat", axis=0),
        node("Reshape", ["x", "new_shape"], ["y"], "reshape"),
    ],
    [vi("x", [4, 16])],
    [vi("y", [16, 4])],
    [init("i0", np.array([0], np.int64)), init("i1", np.array([1], np.int64))],
    value_info=[vi("shape", [2], TP.INT64), vi("d0", [1], TP.INT64), vi("d1", [1], TP.INT64)],
)


@pytest.mark.parametrize("threshold", [4 << 20, 64])
@pytest.mark.parametrize("case", [*sorted(CASES), "shape_into_session"])
def test_fold_sessions_get_the_models_graph_surgeon_exported(
    case: str, threshold: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    export = fold_evaluation._export
    compared: list[int] = []

    def checked(*args: Any) -> onnx.ModelProto:
        model = export(*args)
        assert model.SerializeToString() == reference_export(*args[:-1]).SerializeToString()
        compared.append(len(model.graph.node))
        return model

    monkeypatch.setattr(fold_evaluation, "_export", checked)
    monkeypatch.setattr(fold_evaluation, "SESSION_NODES", 4)
    graph, _ = to_graph(CASES.get(case, SHAPE_INTO_SESSION))
    graph.ir_version = 10
    assert fold_constants(graph, threshold)
    if case == "several_sessions":
        assert len(compared) > 1
    if case == "shape_into_session":
        assert compared == [1]  # the Concat, with the folded Gathers as initializers


def test_value_info_of_every_kind() -> None:
    """Shapes with parameters and unknown dims, scalars, no shape, no dtype: each as make_tensor_value_info has it."""
    graph, _ = to_graph(chain(2))
    graph.ir_version = None  # the model then says which IR version its onnx writes
    x = graph.inputs[0]
    tensors = [
        gs.Variable("a", np.float32, ["n", None, 3]),
        gs.Variable("b", np.int64, []),
        gs.Variable("c", np.float16, None),
        gs.Variable("d", None, [2]),
        gs.Variable("e", np.float32, ["n", None, 3]),  # the type of "a" again
        gs.Variable("f", onnx.TensorProto.BFLOAT16, [1]),
    ]
    nodes = [gs.Node("Neg", f"n{i}", inputs=[x], outputs=[t]) for i, t in enumerate(tensors)]
    sink = gs.Variable("sink", np.float32, [2])
    nodes.append(gs.Node("Sum", "sum", inputs=tensors, outputs=[sink]))
    domains = [onnx.helper.make_opsetid("", 18)]
    ours = fold_evaluation._export(graph, nodes, [sink], {}, domains, {})
    assert ours.SerializeToString() == reference_export(graph, nodes, [sink], {}, domains).SerializeToString()
