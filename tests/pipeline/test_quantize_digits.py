"""``convert(..., precision="int8" | "fp8")`` on a real task: a CNN trained in the test on scikit-learn's digits keeps
its top-1 accuracy within one point of fp32 on the held-out split, on ONNX Runtime (INT8 with its own Q/DQ kernels,
FP8 through the exact emulation), and TensorRT-RTX's real builder builds both graphs (FP8 for compute capability 8.9).
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
import pytest
import torch
from quantize_support import accuracy, build_with_tensorrt_rtx, digits_task

import pipeline
from converters.errors import ConversionError

DYNAMIC = {"x": {0: ("batch", 1, 64, 512)}}


@pytest.fixture(scope="module")
def task() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, list[torch.Tensor], float]:
    return digits_task(resnet=False)


@pytest.fixture(scope="module", params=["int8", "fp8"])
def quantized(request: pytest.FixtureRequest, task: tuple) -> tuple[str, pipeline.ConvertedModule]:
    model, x_test, _, calibration, _ = task
    module = pipeline.convert(model, x_test[:64], precision=request.param, dynamic=DYNAMIC, calibration=calibration)
    return request.param, module


def test_top1_accuracy_stays_within_one_point_of_fp32(task: tuple, quantized: tuple) -> None:
    _, x_test, y_test, _, fp32 = task
    precision, module = quantized
    got = accuracy(module(x_test), y_test)
    assert got >= fp32 - 0.01, f"{precision}: top-1 {got:.4f} vs fp32 {fp32:.4f}"


def test_every_weighted_op_is_quantized_and_the_rest_runs_in_float16(quantized: tuple) -> None:
    precision, module = quantized
    report = module.report.quantization
    assert report is not None and report.precision == precision
    assert [op.op for op in report.quantized] == ["Conv", "Conv", "Gemm"] and not report.skipped
    assert report.share == 1.0 and report.weight_share == 1.0
    assert report.method == {"int8": "mse", "fp8": "max"}[precision]
    assert report.opset == 21 and module.onnx.opset_import[0].version == 21
    assert [op.weight_channels for op in report.quantized] == [16, 32, 10]
    scales = report.scales()
    assert set(scales) == {op.activation for op in report.quantized} and all(s > 0 for s in scales.values())
    ops = [n.op_type for n in module.onnx.graph.node]
    # three activation pairs and three weights; INT8 adds the exact pair before conv2's Relu (ONNX Runtime's form)
    pairs = {"int8": 4, "fp8": 3}[precision]
    assert ops.count("QuantizeLinear") == pairs and ops.count("DequantizeLinear") == pairs + 3
    stored = {t.data_type for t in module.onnx.graph.initializer}
    wanted = {"int8": onnx.TensorProto.INT8, "fp8": onnx.TensorProto.FLOAT8E4M3FN}[precision]
    assert wanted in stored and onnx.TensorProto.FLOAT16 in stored  # 8-bit weights, float16 scales and biases
    assert module.report.accuracy is not None and module.report.accuracy.passed


def test_tensorrt_rtx_builds_the_quantized_graph(quantized: tuple) -> None:
    precision, module = quantized
    assert build_with_tensorrt_rtx(module.onnx, sm89=precision == "fp8") > 0


def test_scales_are_saved_with_the_artifact(quantized: tuple, task: tuple, tmp_path: Path) -> None:
    precision, module = quantized
    _, x_test, _, _, _ = task
    path = module.save(tmp_path / f"digits_{precision}")
    loaded = pipeline.load(path)
    assert loaded.report.quantization == module.report.quantization
    torch.testing.assert_close(loaded(x_test[:32]), module(x_test[:32]))


def test_fp32_fallback_keeps_unquantized_ops_in_float32(task: tuple) -> None:
    model, x_test, y_test, calibration, fp32 = task
    module = pipeline.convert(
        model, x_test[:64], precision="int8", quantize_fallback="fp32", dynamic=DYNAMIC, calibration=calibration
    )
    assert onnx.TensorProto.FLOAT16 not in {t.data_type for t in module.onnx.graph.initializer}
    assert module.report.precision is None
    assert accuracy(module(x_test), y_test) >= fp32 - 0.01


def test_keep_fp32_leaves_ops_unquantized_and_a_low_share_is_loud(
    task: tuple, caplog: pytest.LogCaptureFixture
) -> None:
    model, x_test, _, calibration, _ = task
    with caplog.at_level(logging.WARNING):
        module = pipeline.convert(
            model, x_test[:64], precision="int8", keep_fp32=("op:Conv",), calibration=calibration, validate=False
        )
    report = module.report.quantization
    assert report is not None
    assert [op.op for op in report.quantized] == ["Gemm"]
    assert {s.reason for s in report.skipped} == {"keep_fp32 entry 'op:Conv'"}
    assert report.share < 0.5 and "only" in report.warnings[0]
    assert any("of MatMul/Gemm/Conv FLOPs are quantized" in r.message for r in caplog.records)
    with pytest.raises(ConversionError, match="fix:"):
        pipeline.convert(
            model,
            x_test[:64],
            precision="int8",
            keep_fp32=("op:Conv",),
            precision_strict=True,
            validate=False,
            calibration=calibration,
        )
