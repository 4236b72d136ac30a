"""Every 4-bit method run to the verdicts a user checks, on a model where the method matters: a character LM
(``tests/charlm_support.py``: width 128, one block, trained :data:`TRAIN_STEPS` steps on CPython's
``pydoc_data/topics.py`` inside the test) given outlier input channels as real LLMs have them. A few LayerNorm
channels are made 25-50x larger and the weight columns reading them as many times smaller
(:func:`with_outlier_channels`): the float model computes the same function, but the activations of the query/key/
value and first MLP layers now have outlier channels whose weights are small. Max scales round those weights to
zero (each block's scale is set by the ordinary weights); AWQ scales them up by the activation's magnitude.

Verdicts against fp32 on held-out text: the relative RMS error of the logits and the perplexity ratio. INT4 and
NVFP4 (emulated exactly on ONNX Runtime) with max scales and with AWQ, fp32 fallback (ONNX Runtime's own kernels).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache

import numpy as np
import pytest
import torch
from charlm_support import CharLM, calibration_batches, perplexity, train, validation_batches
from torch import nn

import pipeline
from passes.quantize.blockwise import BLOCK_FORMATS, fake_quantize
from pipeline.quantize.awq import clip_weights

TRAIN_STEPS = 150
WIDTH = 128
BLOCK_SIZE = 64  # INT4 input channels per scale: an outlier channel shares its block with 63 ordinary ones
#: Outlier channel -> how much larger its activation is made (real LLMs: a few channels 20-100x the rest).
OUTLIERS = {3: 40.0, 17: 25.0, 42: 50.0, 90: 30.0}

Batches = list[tuple[torch.Tensor, torch.Tensor]]
#: The outlier model, validation batches, calibration inputs, fp32 logits on validation, fp32 perplexity.
Task = tuple[CharLM, Batches, list[torch.Tensor], list[torch.Tensor], float]
#: (precision, method) -> (relative RMS error of the logits, perplexity / fp32 perplexity).
Verdict = Callable[[str, str], tuple[float, float]]


def with_outlier_channels(model: CharLM, outliers: dict[int, float]) -> CharLM:
    """``model`` (changed in place) with each LayerNorm before a linear layer scaling channel ``c`` by
    ``outliers[c]`` and the layer's weight column ``c`` divided by it: the same function in float arithmetic,
    outlier activations read by small weights."""
    with torch.no_grad():
        for block in model.blocks:
            for norm, layer in ((block.norm1, block.qkv), (block.norm2, block.fc1)):
                for channel, factor in outliers.items():
                    norm.weight[channel] *= factor
                    norm.bias[channel] *= factor
                    layer.weight[:, channel] /= factor
    return model


def relative_rms(
    run: Callable[[torch.Tensor], torch.Tensor], references: list[torch.Tensor], inputs: list[torch.Tensor]
) -> float:
    """RMS(outputs - fp32 outputs) / RMS(fp32 outputs), over every element of every input."""
    with torch.no_grad():
        error = sum(float((run(x).float() - ref).square().sum()) for x, ref in zip(inputs, references, strict=True))
    return math.sqrt(error / sum(float(ref.square().sum()) for ref in references))


@pytest.fixture(scope="module")
def task() -> Task:
    """The outlier model and what it is judged on (see :data:`Task`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small model: one thread trains fastest (and the same way) on a shared machine
    try:
        model, _ = train(TRAIN_STEPS, width=WIDTH, layers=1, batch=16)
    finally:
        torch.set_num_threads(threads)
    valid, calibration = validation_batches(count=2), calibration_batches(count=2)
    trained = perplexity(model, valid)
    model = with_outlier_channels(model, OUTLIERS)
    base = perplexity(model, valid)
    assert base == pytest.approx(trained, rel=1e-5)  # the same function
    assert base < 9.5, f"the model did not learn: perplexity {base:.2f} (unigram: 25.5)"
    with torch.no_grad():
        references = [model(x) for x, _ in valid]
    return model, valid, calibration, references, base


@pytest.fixture(scope="module")
def verdict(task: Task) -> Verdict:
    """The verdicts of a (precision, method), each converted once (see :data:`Verdict`)."""
    model, valid, calibration, references, base = task

    @cache
    def measure(precision: str, method: str) -> tuple[float, float]:
        module = pipeline.convert(
            model,
            calibration[0],
            precision=precision,
            calibration_method=method,
            calibration=calibration,
            quantize_fallback="fp32",  # ONNX Runtime's fp32 and MatMulNBits kernels: the 4-bit error alone
            validate=False,
            **({"block_size": BLOCK_SIZE} if precision == "int4" else {}),
        )
        report = module.report.quantization
        assert report is not None and len(report.quantized) == 4  # qkv, proj, fc1, fc2 (the head is kept)
        return relative_rms(module, references, [x for x, _ in valid]), perplexity(module, valid) / base

    return measure


def test_the_model_has_outlier_input_channels(task: Task) -> None:
    model, valid, *_ = task
    block = model.blocks[0]
    with torch.no_grad():
        x = model.embed(valid[0][0]) + model.position(torch.arange(valid[0][0].shape[1]))
        magnitude = block.norm1(x).abs().mean(dim=(0, 1))
    ordinary = torch.ones(WIDTH, dtype=torch.bool)
    ordinary[list(OUTLIERS)] = False
    ratios = magnitude[list(OUTLIERS)] / magnitude[ordinary].mean()
    assert bool((ratios > 10).all()) and bool((ratios < 100).all()), ratios


# Measured here (torch CPU, 2 shared cores; fp32 perplexity 8.18): INT4 max scales: logits relative RMS 0.0355,
# perplexity x1.0161; AWQ: 0.0116, x1.0003. Training seeds 1 and 2 (fp32 8.33, 8.24): max 0.034-0.040, x1.009-1.017;
# AWQ 0.010-0.012, x1.000-1.003. Planted bugs: AWQ leaving s in the weights 0.48, x1.96; the scale search measuring
# x * s instead of x / s 0.033, x1.016; the rewrite not given AWQ's s 0.035, x1.017.
def test_int4_awq_beats_max_scales_on_outlier_channels(verdict: Verdict) -> None:
    max_error, max_ratio = verdict("int4", "max")
    awq_error, awq_ratio = verdict("int4", "awq")
    assert max_error < 0.06 and max_ratio < 1.04, (max_error, max_ratio)
    assert awq_error < 0.02 and awq_ratio < 1.005, (awq_error, awq_ratio)
    assert awq_error < 0.5 * max_error, (awq_error, max_error)  # measured 0.33x
    assert awq_ratio - 1 < 0.25 * (max_ratio - 1), (awq_ratio, max_ratio)  # measured 0.02x (seeds 1, 2: 0, 0.16)


# Measured: NVFP4 (emulated) max scales 0.0333, x1.0154; AWQ 0.0133, x1.0044 (seeds 1, 2: max 0.028-0.038,
# x1.005-1.018; AWQ 0.012-0.016, x1.002-1.003). Planted: AWQ leaving s in the weights 0.40, x1.64; the graph's
# per-tensor scale written as 1: 0.55, x3.0 (max scales).
def test_nvfp4_within_its_bound_and_awq_beats_max_scales(verdict: Verdict) -> None:
    max_error, max_ratio = verdict("nvfp4", "max")
    awq_error, awq_ratio = verdict("nvfp4", "awq")
    assert max_error < 0.06 and max_ratio < 1.04, (max_error, max_ratio)
    assert awq_error < 0.025 and awq_ratio < 1.01, (awq_error, awq_ratio)
    assert awq_error < 0.6 * max_error, (awq_error, max_error)  # measured 0.40x (seeds 1, 2: 0.43, 0.44)


# Measured: 0.0966 at every magnitude (E2M1's own rounding of Gaussian weights in blocks of 16); with the per-tensor
# scale dropped (FP8 block scales holding amax / 6 themselves, subnormal below 2**-6) 0.104, 0.127 and 0.248.
def test_nvfp4_error_does_not_depend_on_the_weights_magnitude() -> None:
    """LLM weights are ~0.01-0.02: NVFP4's per-tensor float32 scale keeps their FP8 block scales out of subnormals."""
    errors = []
    for std in (0.02, 0.01, 0.004):
        generator = torch.Generator().manual_seed(0)
        layer = nn.Linear(256, 256, bias=False).eval()
        with torch.no_grad():
            layer.weight.copy_(torch.randn(256, 256, generator=generator) * std)
        x = torch.randn(64, 256, generator=generator)
        module = pipeline.convert(
            layer, x, precision="nvfp4", keep_head=False, quantize_fallback="fp32", validate=False
        )
        with torch.no_grad():
            errors.append(relative_rms(module, [layer(x)], [x]))
    assert min(errors) > 0.085 and max(errors) < 1.01 * min(errors) < 0.105, errors


# Measured: the clipped weight's output error 0.86x the unclipped one, no block worse (INT4, blocks of 64). NVFP4 is
# left out: its blocks are not independent (clipping the tensor's largest weight moves the per-tensor scale, hence
# every block's FP8 scale rounding); on these weights a few blocks came out up to 2.1x worse, the sum 0.97x.
def test_awq_int4_clipping_is_never_worse_than_none_and_gains_on_heavy_tailed_weights() -> None:
    """AWQ's clipping search by its own measure, each block's output error on the calibration activations: no block
    worse than with its full range, the whole weight better where a few weights stretch the blocks' ranges."""
    rng = np.random.default_rng(0)
    fmt, block = BLOCK_FORMATS["int4"], 64
    x = rng.standard_normal((256, 128)).astype(np.float32)
    matrix = rng.standard_t(3, size=(32, 128)).astype(np.float32)  # heavy tails: a few large weights per row

    def block_errors(approx: np.ndarray) -> np.ndarray:
        delta = (approx - matrix).reshape(32, -1, block)
        products = np.einsum("tbk,nbk->tnb", x.reshape(256, -1, block), delta)
        return np.square(products).sum(axis=0)  # [rows, blocks]

    plain = block_errors(fake_quantize(fmt, matrix, block))
    clipped = block_errors(fake_quantize(fmt, clip_weights(fmt, x, matrix, block), block))
    assert bool((clipped <= plain * (1 + 1e-5)).all()), float((clipped / plain).max())
    assert clipped.sum() < 0.92 * plain.sum(), float(clipped.sum() / plain.sum())
