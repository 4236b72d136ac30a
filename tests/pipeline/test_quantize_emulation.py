"""The FP8 emulation ONNX Runtime's CPU backend runs (pipeline/runtime/ort/emulation.py) computes what ONNX Runtime's
own FP8 QuantizeLinear/DequantizeLinear kernels compute, bit for bit, with every graph optimization on; and the
quantize settings are checked."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from quantize_support import conv_gemm_model

from converters.errors import InputError
from converters.settings import Settings
from passes.quantize.formats import FORMATS
from passes.quantize.insert import quantize_graph
from passes.quantize.placement import plan_targets
from pipeline.runtime.ort.emulation import emulate_fp8, fold_unfused_weights, has_fp8, has_int8_weights


def run(model: onnx.ModelProto, x: np.ndarray, level: ort.GraphOptimizationLevel) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def test_fp8_emulation_matches_onnx_runtime_kernels_bit_for_bit() -> None:
    graph = gs.import_onnx(conv_gemm_model())
    targets, _ = plan_targets(graph)
    quantize_graph(graph, FORMATS["fp8"], targets, {"conv": 1.5, "gemm": 2.0, "matmul": 2.0})
    model = gs.export_onnx(graph)
    assert has_fp8(model)
    emulated = emulate_fp8(model)
    onnx.checker.check_model(emulated, full_check=True)
    assert not has_fp8(emulated)
    assert not {"QuantizeLinear", "DequantizeLinear"} & {n.op_type for n in emulated.graph.node}
    x = np.random.default_rng(3).normal(scale=2.0, size=(2, 2, 4, 4)).astype(np.float32)
    kernels = run(model, x, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    for got, want in zip(run(emulated, x, ort.GraphOptimizationLevel.ORT_DISABLE_ALL), kernels, strict=True):
        np.testing.assert_array_equal(got, want)
    # with every optimization on only the float accumulation order of MatMul/Gemm may change (an ulp or two)
    for got, want in zip(run(emulated, x, ort.GraphOptimizationLevel.ORT_ENABLE_ALL), kernels, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_int8_graphs_are_not_emulated() -> None:
    graph = gs.import_onnx(conv_gemm_model())
    targets, _ = plan_targets(graph)
    quantize_graph(graph, FORMATS["int8"], targets, {"conv": 1.5, "gemm": 2.0, "matmul": 2.0})
    assert not has_fp8(gs.export_onnx(graph))


def test_int8_weights_of_convolutions_onnx_runtime_does_not_fuse_are_folded_exactly() -> None:
    graph = gs.import_onnx(conv_gemm_model())
    targets, _ = plan_targets(graph)
    quantize_graph(graph, FORMATS["int8"], targets, {"conv": 1.5, "gemm": 2.0, "matmul": 2.0})
    model = gs.export_onnx(graph)
    assert has_int8_weights(model)
    folded = fold_unfused_weights(model)
    onnx.checker.check_model(folded, full_check=True)
    producers = {o: n.op_type for n in folded.graph.node for o in n.output}
    conv = next(n for n in folded.graph.node if n.op_type == "Conv")
    # the Conv's output goes to a Relu and a Flatten, no QuantizeLinear: ONNX Runtime runs it in float, so it reads
    # a float32 initializer; the Gemm and MatMul keep their DequantizeLinear weights (integer kernels)
    assert conv.input[1] not in producers and conv.input[1] in {t.name for t in folded.graph.initializer}
    for node in folded.graph.node:
        if node.op_type in ("Gemm", "MatMul"):
            assert producers[node.input[1]] == "DequantizeLinear"
    x = np.random.default_rng(4).normal(scale=2.0, size=(2, 2, 4, 4)).astype(np.float32)
    plain = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for got, want in zip(run(folded, x, plain), run(model, x, plain), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"precision": "int8", "quantize_fallback": "bf16"}, "unknown quantize_fallback"),
        ({"precision": "fp8", "calibration_method": "minmax"}, "unknown calibration_method"),
        ({"precision": "int8", "calibration_percentile": 0.0}, "calibration_percentile"),
        ({"precision": "int8", "precision_io": "low"}, "precision_io='low' is not supported"),
    ],
)
def test_bad_quantize_settings_are_input_errors_with_the_fix(settings: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        Settings.from_kwargs(settings)
    assert "fix:" in str(info.value)
