"""A ResNet-style CNN (the bundled ``examples/cnn.py``: identity and downsampling residual blocks) in INT8 and FP8:
each residual Add's skip input is quantized and its convolution side is not, the real TensorRT-RTX builder builds
the graph (``tests/rtx_build.py``), and ONNX Runtime runs the INT8 convolutions it can fuse as QLinearConv."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
import torch
from quantize_support import build_with_tensorrt_rtx
from rtx_build import assert_builds

import pipeline
from pipeline.precision.stage import runnable_model

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


def test_onnx_runtime_runs_the_convolutions_not_before_an_add_as_qlinearconv(
    converted: pipeline.ConvertedModule, tmp_path: Path
) -> None:
    if converted.settings.precision != "int8":
        pytest.skip("ONNX Runtime has integer kernels for INT8 only (FP8 runs as its exact emulation)")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    model = runnable_model(converted.onnx, "onnxruntime", converted.settings)
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
    # 9 convolutions: block 0's and the two downsampling blocks' first convolutions and 1x1 skips fuse (5); the three
    # that feed a residual Add stay float (TensorRT fuses the Add into them); the stem's Relu -> MaxPool keeps its
    # output unquantized
    assert ops.count("QLinearConv") == 5
