"""A model's large weights held apart from a light graph (passes.model_io.weightless): ONNX Runtime, given them as
arrays, computes what it computes from the whole model; shape inference infers the light graph alike."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from passes.model_io.weightless import IN_MEMORY, serialized_size, weightless


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((64, 32)).astype(np.float32)  # 8 KB: held apart
    bias = rng.standard_normal(32).astype(np.float32)  # 128 bytes: kept inline
    table = rng.integers(0, 9, (300,)).astype(np.int64)  # 2.4 KB of integers: held apart
    nodes = [
        helper.make_node("MatMul", ["x", "weight"], ["h"]),
        helper.make_node("Add", ["h", "bias"], ["y"]),
        helper.make_node("ReduceSum", ["table"], ["total"], keepdims=0),
        helper.make_node("Cast", ["total"], ["total_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["y", "total_f"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 32])],
        [numpy_helper.from_array(a, n) for a, n in ((weight, "weight"), (bias, "bias"), (table, "table"))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_large_weights_are_held_apart_and_small_ones_stay() -> None:
    model = _model()
    light, weights = weightless(model)
    assert sorted(weights) == ["table", "weight"]
    kept = {t.name: t for t in light.graph.initializer}
    assert kept["bias"].HasField("raw_data")
    for name in weights:
        assert kept[name].data_location == TensorProto.EXTERNAL and not kept[name].HasField("raw_data")
        assert {e.key: e.value for e in kept[name].external_data}["location"] == IN_MEMORY
        np.testing.assert_array_equal(
            weights[name], numpy_helper.to_array(model.graph.initializer[[*kept].index(name)])
        )
    assert len(light.SerializeToString()) < 1024 < len(model.SerializeToString())
    assert model.graph.initializer[0].HasField("raw_data")  # the model itself is untouched


def test_onnx_runtime_given_the_arrays_computes_what_the_whole_model_computes() -> None:
    model = _model()
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    light, weights = weightless(model)
    for prepack in ("0", "1"):
        options = ort.SessionOptions()
        options.add_session_config_entry("session.disable_prepacking", "1" if prepack == "0" else "0")
        values = [ort.OrtValue.ortvalue_from_numpy(a) for a in weights.values()]
        options.add_external_initializers(list(weights), values)
        got = ort.InferenceSession(light.SerializeToString(), options).run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, want)


def test_shape_inference_and_the_size_agree_with_the_whole_model() -> None:
    model = _model()
    light, weights = weightless(model)
    inferred = onnx.shape_inference.infer_shapes(light)
    whole = onnx.shape_inference.infer_shapes(model)
    assert [str(v) for v in inferred.graph.value_info] == [str(v) for v in whole.graph.value_info]
    # over by the external-data entries of each weight held apart: never under (it guards protobuf's limit)
    assert 0 <= serialized_size(model) - model.ByteSize() <= 64 * len(weights)


def test_a_model_with_nothing_to_hold_apart_is_returned_as_it_is() -> None:
    model = _model()
    for tensor in model.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor)[:2].copy(), tensor.name))
    assert weightless(model) == (model, {})


def test_fields_are_copied_whichever_protobuf_describes_them() -> None:
    """protobuf 7 (what `pip install .` takes; the dev extras hold protobuf below 7) has no FieldDescriptor.label, and
    protobuf before 5.28 no is_repeated: the light copy reads whichever the descriptor has."""
    import types

    from passes.model_io.weightless import repeated

    seven = types.SimpleNamespace(is_repeated=True)
    old = types.SimpleNamespace(label=3, LABEL_REPEATED=3)
    single = types.SimpleNamespace(label=1, LABEL_REPEATED=3)
    assert [repeated(f) for f in (seven, old, single)] == [True, True, False]
