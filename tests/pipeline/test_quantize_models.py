"""INT8/FP8 on transformers models from small configs (random weights): a ResNet and a BERT encoder convert with
every weighted op quantized, run on ONNX Runtime within the quantized tolerance, and TensorRT-RTX builds them."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from model_zoo import tiny_bert_config
from quantize_support import build_with_tensorrt_rtx

import pipeline

transformers = pytest.importorskip("transformers")


def make_resnet() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.ResNetConfig(
        num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=10
    )
    return transformers.ResNetForImageClassification(config).eval()


def make_bert() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.BertModel(tiny_bert_config()).eval()


def bert_sample(seed: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "attention_mask": torch.ones(2, 8, dtype=torch.long)}


def convert(model: torch.nn.Module, sample: Any, **settings: Any) -> pipeline.ConvertedModule:
    module = pipeline.convert(model, sample, **settings)
    assert module.report.accuracy is not None and module.report.accuracy.passed
    return module


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_resnet_quantizes_every_convolution_and_builds(precision: str) -> None:
    module = convert(make_resnet(), torch.randn(2, 3, 32, 32), precision=precision)
    report = module.report.quantization
    assert report is not None and not report.skipped
    assert {op.op for op in report.quantized} == {"Conv", "Gemm"} and len(report.quantized) == 7
    assert report.share == 1.0 and report.weight_share == 1.0
    assert report.relative_error < 0.1
    assert build_with_tensorrt_rtx(module.onnx, sm89=precision == "fp8") > 0


@pytest.mark.parametrize(("precision", "fallback"), [("int8", "fp16"), ("int8", "fp32"), ("fp8", "fp16")])
def test_bert_quantizes_every_weighted_matmul_and_builds(precision: str, fallback: str) -> None:
    module = convert(make_bert(), bert_sample(0), precision=precision, quantize_fallback=fallback)
    report = module.report.quantization
    assert report is not None
    assert report.weight_share == 1.0  # every constant weight of MatMul/Gemm is 8-bit
    assert report.share > 0.9  # attention's activation x activation MatMuls stay float
    assert {s.reason for s in report.skipped} == {"both inputs are activations (no constant weight)"}
    assert report.relative_error < 0.1
    with torch.no_grad():
        out = module(**bert_sample(5))
    assert out["last_hidden_state"].shape == (2, 8, 32)
    assert build_with_tensorrt_rtx(module.onnx, sm89=precision == "fp8") > 0


@pytest.mark.parametrize(("precision", "capabilities"), [("int8", ()), ("fp8", ("8.9",))])
def test_the_tensorrt_rtx_backend_builds_quantized_engines(precision: str, capabilities: tuple[str, ...]) -> None:
    pytest.importorskip("tensorrt_rtx")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 16 * 16, 10)
    ).eval()
    module = convert(
        model,
        torch.randn(4, 3, 16, 16),
        precision=precision,
        backend="tensorrt-rtx",
        trt_compute_capabilities=capabilities,
    )
    assert module.engine_bytes is not None and len(module.engine_bytes) > 0
