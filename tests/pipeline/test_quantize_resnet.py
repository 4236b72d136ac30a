"""A ResNet-style CNN (the bundled ``examples/cnn.py``: identity and downsampling residual blocks) in INT8 and FP8:
each residual Add's skip input is quantized and its convolution side is not, the real TensorRT-RTX builder builds
the graph (``tests/rtx_build.py``), and ONNX Runtime runs the INT8 convolutions it can fuse as QLinearConv."""

from __future__ import annotations

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
from pipeline.precision.stage import runnable_model
from pipeline.quantize.ort_int8 import disabled_optimizers

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


def test_onnx_runtime_runs_every_convolution_but_the_stem_and_block_0s_in_an_integer_kernel(
    converted: pipeline.ConvertedModule, tmp_path: Path
) -> None:
    if converted.settings.precision != "int8":
        pytest.skip("ONNX Runtime has integer kernels for INT8 only (FP8 runs as its exact emulation)")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    model = runnable_model(converted.onnx, "onnxruntime", converted.settings)
    ort.InferenceSession(
        model.SerializeToString(), options, ["CPUExecutionProvider"], disabled_optimizers=disabled_optimizers(model)
    )
    optimized = onnx.load(options.optimized_model_filepath)
    ops = [n.op_type for n in optimized.graph.node]
    # 9 convolutions: the blocks' first convolutions and the 1x1 skips have quantized outputs (5 QLinearConv); of the
    # three before a residual Add, the 32- and 64-channel ones run as MatMulIntegerToFloat over their patches, block
    # 0's 16-channel one in float, and so does the 3-channel stem (faster in float)
    assert ops.count("QLinearConv") == 5
    assert ops.count("MatMulIntegerToFloat") == 2
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


def test_the_onnx_runtime_module_matches_the_quantized_graph_on_reference_kernels(
    converted: pipeline.ConvertedModule,
) -> None:
    """The session's rewrites change no value beyond ONNX Runtime's own integer kernels (its int32 biases, exact
    integer sums): within two quantization steps of the graph as ONNX defines it."""
    if converted.settings.precision != "int8":
        pytest.skip("INT8 only")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(11))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    reference = ort.InferenceSession(converted.onnx.SerializeToString(), options, ["CPUExecutionProvider"])
    want = reference.run(None, {reference.get_inputs()[0].name: x.numpy()})[0]
    with torch.inference_mode():
        got = converted(x).numpy()
    assert np.abs(got - want).max() <= 2 * np.abs(want).max() / 127
