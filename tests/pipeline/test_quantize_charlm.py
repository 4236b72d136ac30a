"""The accuracy task of the 4-bit precisions: a character-level transformer (3 layers, width 256) trained inside the
test on CPython's ``pydoc_data/topics.py`` keeps its validation perplexity within the issue's goals when its
weights are stored in 4 bits: INT4 with AWQ scales within 3% of fp32, NVFP4 (emulated on ONNX Runtime) within 6%;
every MatMul weight but the kept head is 4-bit, and TensorRT-RTX builds both graphs for their targets.

Nothing is cached between runs: the model trains for :data:`TRAIN_STEPS` steps of 16 windows of 64 characters
(deterministic), enough to predict the text far better than its character frequencies do (the unigram perplexity).
``benchmarks/quantize_charlm.py`` trains longer and prints the full table of the README (fp16, INT8, FP8, INT4 and
NVFP4 with max and AWQ scales).
"""

from __future__ import annotations

import math

import onnx
import torch
from charlm_support import calibration_batches, encoded, perplexity, train, validation_batches
from quantize_support import build_with_tensorrt_rtx

import pipeline

TRAIN_STEPS = 60


def unigram_perplexity() -> float:
    """The perplexity of predicting each validation character by its training frequency."""
    train_data, valid, vocab = encoded()
    counts = torch.bincount(train_data, minlength=len(vocab)).double() + 1
    return math.exp(-float((counts / counts.sum()).log()[valid].mean()))


def test_trained_language_model_keeps_its_perplexity_in_4_bits() -> None:
    model, steps = train(TRAIN_STEPS, width=256, layers=3, batch=16)
    valid = validation_batches(count=2)
    calibration = calibration_batches(count=2)
    base = perplexity(model, valid)
    assert base < 0.75 * unigram_perplexity(), f"the model did not learn in {steps} steps: perplexity {base:.2f}"
    results = {}
    for precision, targets in (("int4", ("8.0", "8.9", "12.0")), ("nvfp4", ("12.0",))):
        module = pipeline.convert(
            model,
            calibration[0],
            precision=precision,
            calibration_method="awq",
            calibration=calibration,
            quantize_fallback="fp32",  # ONNX Runtime's own fp32 and MatMulNBits kernels: no fp16 emulation
            validate=False,
        )
        report = module.report.quantization
        assert report is not None and len(report.quantized) == 12  # qkv, proj, fc1, fc2 of 3 blocks
        assert {s.reason.split(":")[0] for s in report.skipped} == {
            "both inputs are activations (no constant weight)",
            "keep_head",
        }
        four_bit = onnx.TensorProto.INT4 if precision == "int4" else onnx.TensorProto.FLOAT4E2M1
        assert sum(t.data_type == four_bit for t in module.onnx.graph.initializer) == 12
        assert build_with_tensorrt_rtx(module.onnx, capabilities=targets) > 0
        results[precision] = perplexity(module, valid)
    assert results["int4"] <= 1.03 * base, (base, results)
    assert results["nvfp4"] <= 1.06 * base, (base, results)
