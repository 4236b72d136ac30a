"""INT8 on a trained residual network: the bundled SmallResNet trained in the test on scikit-learn's digits (resized
to 32x32). Every convolution stays quantized (the calibration does not clip the residual path so far that the
accuracy search must undo it), top-1 stays within one point of fp32 on ONNX Runtime with its requantized residual
blocks and with the exact ones, and the default session runs every convolution after the stem in an integer kernel
(what makes it faster than fp32: measured by ``benchmarks/bench_quantize.py``, not here)."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
import torch
from quantize_support import accuracy, digits_task

import pipeline
from pipeline.runtime.ort.int8 import disabled_optimizers
from pipeline.runtime.ort.session_graph import runnable_model

DYNAMIC = {"x": {0: ("batch", 1, 64, 360)}}


@pytest.fixture(scope="module")
def task() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, list[torch.Tensor], float]:
    return digits_task(resnet=True)


@pytest.fixture(scope="module", params=["requantize", "exact"])
def quantized(request: pytest.FixtureRequest, task: tuple) -> pipeline.ConvertedModule:
    model, x_test, _, calibration, _ = task
    return pipeline.convert(
        model,
        x_test[:64],
        precision="int8",
        quantize_fallback="fp32",
        ort_int8_conv_outputs=request.param,
        dynamic=DYNAMIC,
        calibration=calibration,
    )


def test_every_convolution_stays_quantized(quantized: pipeline.ConvertedModule) -> None:
    report = quantized.report.quantization
    assert report is not None and report.method == "mse"
    assert report.share == 1.0 and not report.unquantized, report.unquantized
    assert report.relative_error <= report.error_bound
    accuracy_report = quantized.report.accuracy
    assert accuracy_report is not None and accuracy_report.passed
    # judged by the tolerance the quantize stage derived, and the report says so (the user gave none)
    assert [o.note for o in accuracy_report.outputs] == [
        "tolerance derived from the quantization (report.quantization.tolerances)"
    ]


def test_top1_accuracy_stays_within_one_point_of_fp32(quantized: pipeline.ConvertedModule, task: tuple) -> None:
    _, x_test, y_test, _, fp32 = task
    with torch.no_grad():
        got = accuracy(quantized(x_test), y_test)
    assert got >= fp32 - 0.01, f"{quantized.settings.ort_int8_conv_outputs}: top-1 {got:.4f} vs fp32 {fp32:.4f}"


def test_the_session_runs_the_residual_blocks_in_integer_kernels(
    quantized: pipeline.ConvertedModule, tmp_path: Path
) -> None:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    runnable = runnable_model(quantized.onnx, "onnxruntime", quantized.settings)
    optimizers = disabled_optimizers(runnable)
    ort.InferenceSession(
        runnable.SerializeToString(), options, ["CPUExecutionProvider"], disabled_optimizers=optimizers
    )
    ops = [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
    floats = ops.count("Conv") + ops.count("FusedConv")
    if quantized.settings.ort_int8_conv_outputs == "requantize":
        assert ops.count("QLinearConv") == 8 and ops.count("QLinearAdd") == 2 and floats == 1, ops  # the stem
    else:
        assert ops.count("QLinearConv") == 5 and "QLinearAdd" not in ops and floats == 2, ops
        assert ops.count("MatMulIntegerToFloat") == 2, ops


def test_the_saved_artifact_runs_the_same_session(
    quantized: pipeline.ConvertedModule, task: tuple, tmp_path: Path
) -> None:
    """The recorded convolution-output ranges travel in the artifact's graph: the loaded module computes the same."""
    _, x_test, _, _, _ = task
    loaded = pipeline.load(quantized.save(tmp_path / "resnet"))
    assert loaded.report.quantization == quantized.report.quantization
    with torch.no_grad():
        torch.testing.assert_close(loaded(x_test[:32]), quantized(x_test[:32]), rtol=0, atol=0)
