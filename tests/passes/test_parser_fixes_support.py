"""Helpers shared by the parser-fix tests (no tests here): build a graph from ONNX text, run a pass on it, and
compare the graph before and after on ONNX Runtime (or on the ONNX reference evaluator, for opsets ONNX Runtime
does not read)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
from onnx.reference import ReferenceEvaluator

from converters.settings import Settings
from passes.base import GraphPass, PassResult

#: ONNX Runtime 1.31 reads IR <= 13; onnx 1.23 writes 14 by default.
IR_VERSION = 10


def parse(text: str) -> onnx.ModelProto:
    """A model from ONNX text, with value_info for every tensor (as the exporter writes it)."""
    model = onnx.parser.parse_model(text)
    model.ir_version = IR_VERSION
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    return model


def apply(graph_pass: GraphPass, model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassResult]:
    """Run the pass on a graph-surgeon import of ``model``; the result must pass the full ONNX check."""
    graph = gs.import_onnx(model)
    result = graph_pass(graph, Settings())
    after = gs.export_onnx(result.graph)
    after.ir_version = IR_VERSION
    onnx.checker.check_model(after, full_check=True)
    return after, result


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *, reference: bool = False) -> list[np.ndarray]:
    if reference:
        return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, dict(feeds))]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in session.run(None, dict(feeds))]


def assert_same_outputs(
    before: onnx.ModelProto,
    after: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    reference: bool = False,
) -> list[np.ndarray]:
    """Every output equal (exactly unless tolerances are given), same dtype and shape; returns the outputs."""
    expected, got = run(before, feeds, reference=reference), run(after, feeds, reference=reference)
    assert len(expected) == len(got)
    for name, e, g in zip([o.name for o in before.graph.output], expected, got, strict=True):
        assert e.dtype == g.dtype and e.shape == g.shape, (name, e.dtype, g.dtype, e.shape, g.shape)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=name)
    return got


def assert_unchanged(graph_pass: GraphPass, model: onnx.ModelProto) -> None:
    """The pass leaves ``model`` as it is and says so (modified=False)."""
    after, result = apply(graph_pass, model)
    assert not result.modified
    assert ops(after) == ops(model)


def created_names(model: onnx.ModelProto, replaced: str) -> list[str]:
    return [n.name for n in model.graph.node if n.name.startswith(f"{replaced}/")]


def named_graph(header: str, inputs: Sequence[str], outputs: Sequence[str], body: str, opset: int = 20) -> str:
    """ONNX text of one graph: ``inputs``/``outputs`` are typed value declarations (``float[2,3] x``)."""
    return (
        f'<ir_version: {IR_VERSION}, opset_import: ["" : {opset}]>\n'
        f"{header} ({', '.join(inputs)}) => ({', '.join(outputs)}) {body}"
    )


def feeds_for(model: onnx.ModelProto, **arrays: Any) -> dict[str, np.ndarray]:
    names = {i.name for i in model.graph.input}
    assert set(arrays) <= names, set(arrays) - names
    return {k: np.asarray(v) for k, v in arrays.items()}
