"""A ResNet-style CNN (the bundled ``examples/cnn.py``: identity and downsampling residual blocks) in INT8 and FP8:
each residual Add's skip input is quantized and its convolution side is not, the real TensorRT-RTX builder builds
the graph (``tests/rtx_build.py``), and ONNX Runtime runs the INT8 convolutions it can fuse as QLinearConv."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from quantize_support import build_with_tensorrt_rtx
from rtx_build import assert_builds

import pipeline
from converters.settings import Settings
from pipeline.runtime.executors import EngineNotRunnableWarning
from pipeline.runtime.ort.int8 import disabled_optimizers
from pipeline.runtime.ort.session_graph import runnable_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import cnn  # noqa: E402


@pytest.fixture(scope="module", params=["int8", "fp8"])
def converted(request: pytest.FixtureRequest) -> pipeline.ConvertedModule:
    model, sample = cnn.build()
    calibration = [torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(s)) for s in range(4)]
    return pipeline.convert(model, sample, precision=request.param, quantize_fallback="fp32", calibration=calibration)


def test_residual_adds_read_a_quantized_skip_input_and_the_raw_convolution_output(
    converted: pipeline.ConvertedModule,
) -> None:
    report = converted.report.quantization
    assert report is not None and report.share == 1.0 and not report.unquantized
    adds = [n for n in converted.onnx.graph.node if n.op_type == "Add"]
    assert sorted(r.node for r in report.residuals) == sorted(n.name for n in adds) and len(adds) == 3
    producers = {o: n.op_type for n in converted.onnx.graph.node for o in n.output}
    for add in adds:
        assert sorted(producers[i] for i in add.input) == ["Conv", "DequantizeLinear"]
    assert converted.report.accuracy is not None and converted.report.accuracy.passed


def test_tensorrt_rtx_builds_the_residual_network(converted: pipeline.ConvertedModule) -> None:
    if converted.settings.precision == "fp8":  # FP8 engines exist for compute capability 8.9 and later only
        assert build_with_tensorrt_rtx(converted.onnx, sm89=True) > 0
    else:
        assert_builds(converted)


def test_onnx_runtime_runs_every_convolution_but_the_stem_in_an_integer_kernel(
    converted: pipeline.ConvertedModule, tmp_path: Path
) -> None:
    """The default session graph (``ort_int8_conv_outputs="requantize"``): the three convolutions before residual Adds
    get their own calibrated INT8 output, so all 8 convolutions after the stem are QLinearConv and the two residual
    Adds whose output is quantized are QLinearAdd; only the 3-channel stem stays float (faster there)."""
    if converted.settings.precision != "int8":
        pytest.skip("ONNX Runtime has integer kernels for INT8 only (FP8 runs as its exact emulation)")
    ops = [n.op_type for n in _optimized(converted.onnx, converted.settings, tmp_path).graph.node]
    assert ops.count("QLinearConv") == 8 and ops.count("QLinearAdd") == 2, ops
    assert ops.count("Conv") + ops.count("FusedConv") == 1 and "MatMulIntegerToFloat" not in ops, ops
    report = converted.report.quantization
    assert report is not None and sorted(report.ort_conv_output_ranges) == ["getitem_12", "getitem_21", "getitem_6"]
    assert all(amax > 0 for amax in report.ort_conv_output_ranges.values())
    assert any("requantizes the float outputs of 3 convolutions" in note for note in report.notes)


def test_exact_session_runs_float_output_convolutions_as_integer_products_or_floats(
    converted: pipeline.ConvertedModule, tmp_path: Path
) -> None:
    """``ort_int8_conv_outputs="exact"``: no convolution output is quantized beyond TensorRT's graph."""
    if converted.settings.precision != "int8":
        pytest.skip("ONNX Runtime has integer kernels for INT8 only (FP8 runs as its exact emulation)")
    exact = dataclasses.replace(converted.settings, ort_int8_conv_outputs="exact")
    optimized = _optimized(converted.onnx, exact, tmp_path)
    ops = [n.op_type for n in optimized.graph.node]
    # 9 convolutions: the blocks' first convolutions and the 1x1 skips have quantized outputs (5 QLinearConv); of the
    # three before a residual Add, the 32- and 64-channel ones run as MatMulIntegerToFloat over their patches, block
    # 0's 16-channel one in float, and so does the 3-channel stem (faster in float)
    assert ops.count("QLinearConv") == 5
    assert ops.count("MatMulIntegerToFloat") == 2
    assert "QLinearAdd" not in ops
    floats = [n for n in optimized.graph.node if n.op_type in ("Conv", "FusedConv")]
    assert len(floats) == 2
    # their weights are the INT8 weights dequantized per channel, bit for bit: ONNX Runtime did not requantize them
    initializers = {t.name: numpy_helper.to_array(t) for t in optimized.graph.initializer}
    stored = {t.name: numpy_helper.to_array(t) for t in converted.onnx.graph.initializer}
    folded = [
        np.sort(
            (
                stored[n].astype(np.float32) * stored[n.replace("quantized_int8", "weight_scale")].reshape(-1, 1, 1, 1)
            ).ravel()
        )
        for n in stored
        if n.endswith("quantized_int8") and stored[n].ndim == 4 and stored[n].shape[1] in (3, 16)
    ]
    for conv in floats:
        weight = initializers[conv.input[1]].ravel()
        values = np.sort(weight[weight != 0])  # the NCHWc layout pads with zeros
        assert any(np.array_equal(values, np.sort(f[f != 0])) for f in folded), conv.name


def test_the_exact_session_matches_the_quantized_graph_on_reference_kernels(
    converted: pipeline.ConvertedModule,
) -> None:
    """With ``ort_int8_conv_outputs="exact"`` the session's rewrites change no value beyond ONNX Runtime's own integer
    kernels (its int32 biases, exact integer sums): within two quantization steps of the graph as ONNX defines it;
    the default session, with three more 8-bit roundings, is as close to PyTorch as the graph itself."""
    if converted.settings.precision != "int8":
        pytest.skip("INT8 only")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(11))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    reference = ort.InferenceSession(converted.onnx.SerializeToString(), options, ["CPUExecutionProvider"])
    want = reference.run(None, {reference.get_inputs()[0].name: x.numpy()})[0]
    got = _session_output(converted.onnx, dataclasses.replace(converted.settings, ort_int8_conv_outputs="exact"), x)
    assert np.abs(got - want).max() <= 2 * np.abs(want).max() / 127
    model, _ = cnn.build()
    with torch.inference_mode():
        default, fp32 = converted(x).numpy(), model(x).numpy()
    graph_error = np.linalg.norm(want - fp32) / np.linalg.norm(fp32)
    assert np.linalg.norm(default - fp32) / np.linalg.norm(fp32) <= 1.5 * graph_error
    assert np.abs(default - want).max() <= 2 * np.abs(want).max() / 127  # measured: 0.9 of a step


def _optimized(model: onnx.ModelProto, settings: Settings, tmp_path: Path) -> onnx.ModelProto:
    """The graph ONNX Runtime's CPU provider runs for ``model`` under ``settings`` (extended optimizations)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    runnable = runnable_model(model, "onnxruntime", settings)
    optimizers = disabled_optimizers(runnable)
    ort.InferenceSession(
        runnable.SerializeToString(), options, ["CPUExecutionProvider"], disabled_optimizers=optimizers
    )
    return onnx.load(options.optimized_model_filepath)


def _session_output(model: onnx.ModelProto, settings: Settings, x: torch.Tensor) -> np.ndarray:
    """What ONNX Runtime's session of ``model`` under ``settings`` (as the backend makes it) returns for ``x``."""
    runnable = runnable_model(model, "onnxruntime", settings)
    optimizers = disabled_optimizers(runnable)
    session = ort.InferenceSession(
        runnable.SerializeToString(), providers=["CPUExecutionProvider"], disabled_optimizers=optimizers
    )
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def test_a_tensorrt_rtx_module_is_measured_and_stood_in_for_by_the_exact_graph() -> None:
    """Built for TensorRT-RTX, whose engine cannot run here, the module runs on ONNX Runtime as a stand-in for the
    engine: the Q/DQ graph as TensorRT computes it, without the requantized convolution outputs; the ranges are still
    recorded for an ONNX Runtime run of the artifact."""
    pytest.importorskip("tensorrt_rtx")
    model, sample = cnn.build()
    calibration = [torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(s)) for s in range(4)]
    with pytest.warns(EngineNotRunnableWarning):
        module = pipeline.convert(
            model, sample, precision="int8", quantize_fallback="fp32", calibration=calibration, backend="tensorrt-rtx"
        )
    report = module.report.quantization
    assert report is not None and len(report.ort_conv_output_ranges) == 3
    assert not any("requantizes" in note for note in report.notes)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        got = module(x).numpy()
    exact = _session_output(module.onnx, dataclasses.replace(module.settings, ort_int8_conv_outputs="exact"), x)
    requantized = _session_output(module.onnx, dataclasses.replace(module.settings, backend="onnxruntime"), x)
    scale = np.abs(exact).max()
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-6 * scale)
    assert np.abs(got - requantized).max() > 1e-3 * scale  # the two session graphs differ: the test can tell them
