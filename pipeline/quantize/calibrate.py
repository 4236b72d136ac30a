"""Calibration: the range (``amax``) of every activation a Q/DQ pair quantizes, from the float32 graph run on ONNX
Runtime over the calibration inputs.

Methods (``settings.calibration_method``; ``"auto"`` is ``"mse"`` for INT8 and ``"max"`` for FP8):

* ``max``: the largest ``|x|`` seen. Nothing clips; for FP8, whose grid is relative, this loses little.
* ``percentile``: the ``calibration_percentile`` percentile of ``|x|`` (default 99.99): rare outliers clip.
* ``entropy`` (INT8 only): the threshold whose 128-level quantized histogram is closest to the observed one in
  KL divergence (the entropy calibration of TensorRT's INT8 calibrators, described in Migacz, "8-bit Inference
  with TensorRT", GTC 2017).
* ``mse``: the threshold that minimises the mean squared error of quantize-dequantize over the observed histogram,
  with the format's own rounding (INT8 or E4M3).

Why ``mse`` for INT8, where NVIDIA ModelOpt's ONNX quantization (``modelopt.onnx.quantization.quantize``:
"int8/fp8: {'entropy' (default), 'max'}") and TensorRT's legacy INT8 calibrators default to entropy:
measured (``precision_search=False``, ``quantize_fallback="fp32"``, relative L2 error of the outputs against PyTorch
fp32 on the calibration inputs), entropy / mse / percentile / max: the trained digits CNN 0.0059 / 0.0056 / 0.0056 /
0.0059; the bundled SmallResNet with random weights 0.0123 / 0.0123 / 0.0124 / 0.0125; a 4-layer BERT 0.0176 /
0.0118 / 0.0118 / 0.0122; a SmallResNet trained on the digits (``benchmarks/quantize_digits.py``) **0.189** / 0.0205 /
0.0199 / 0.0211. Entropy clipped the stem's output, which the first residual block's skip carries to the sum
unchanged, at 38% of its range; the KL divergence of two histograms does not weigh what clipping costs, the squared
error does. ``entropy`` stays available.

Histograms have :data:`BINS` bins of ``|x|`` over ``[0, max]``: a first run finds each tensor's max, a second fills
the histograms (not needed for ``max``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from converters.errors import InputError
from passes.quantize.blockwise import BlockFormat
from passes.quantize.formats import QuantFormat
from pipeline.precision.measure import Feed, observe, peak_magnitudes

BINS = 2048
METHODS = ("max", "percentile", "entropy", "mse")
DEFAULT_METHOD = {"int8": "mse", "fp8": "max"}
#: INT8 has 127 positive levels; the entropy search compares histograms reduced to this many bins.
ENTROPY_LEVELS = 128


def method_for(method: str, fmt: QuantFormat | BlockFormat) -> str:
    """The calibration method ``"auto"`` stands for, or ``method`` itself once checked against ``fmt`` (the 4-bit
    weights' ``"max"`` or ``"awq"`` are checked with the settings)."""
    if isinstance(fmt, BlockFormat):
        return "max" if method == "auto" else method
    chosen = DEFAULT_METHOD[fmt.name] if method == "auto" else method
    if chosen not in METHODS:
        raise InputError(
            f"stage quantize: unknown calibration_method {method!r}",
            fix=f"use 'auto' or one of {', '.join(map(repr, METHODS))}",
        )
    if chosen == "entropy" and fmt.name != "int8":
        raise InputError(
            f"stage quantize: calibration_method='entropy' is defined for INT8's uniform grid, not {fmt.name}",
            fix="use calibration_method='max' (the FP8 default), 'percentile' or 'mse'",
        )
    return chosen


def calibrate(
    model: onnx.ModelProto,
    feeds: Sequence[Feed],
    tensors: Sequence[str],
    fmt: QuantFormat,
    method: str,
    percentile: float = 99.99,
    providers: Sequence[str] = ("CPUExecutionProvider",),
) -> dict[str, float]:
    """The calibrated ``amax`` of each of ``tensors`` (names in ``model``) by ``method`` (see the module doc)."""
    names = list(dict.fromkeys(tensors))
    peaks = peak_magnitudes(model, feeds, providers, names)
    if method == "max":
        return peaks
    histograms = {name: np.zeros(BINS, np.float64) for name in names}

    def fill(name: str, _: int, value: np.ndarray) -> None:
        if peaks[name] > 0:
            # exact zeros (after a ReLU, padding, blank pixels) are exact under every scale: they say nothing about
            # the threshold, and counted they would dominate the first bin of every histogram
            magnitudes = np.abs(value[np.isfinite(value) & (value != 0)]).astype(np.float64)
            histograms[name] += np.histogram(magnitudes, bins=BINS, range=(0.0, peaks[name]))[0]

    observe(model, feeds, names, fill, providers)
    return {name: amax_from_histogram(histograms[name], peaks[name], fmt, method, percentile) for name in names}


def amax_from_histogram(
    histogram: np.ndarray, peak: float, fmt: QuantFormat, method: str, percentile: float = 99.99
) -> float:
    """The threshold ``method`` picks from a histogram of ``|x|`` with equal bins over ``[0, peak]``."""
    total = float(histogram.sum())
    if peak <= 0 or total == 0:
        return peak
    width = peak / len(histogram)
    if method == "percentile":
        cdf = np.cumsum(histogram) / total
        index = int(np.searchsorted(cdf, percentile / 100.0))
        return min(peak, (index + 1) * width)
    if method == "entropy":
        return (_entropy_bin(histogram) + 0.5) * width
    if method == "mse":
        return _mse_amax(histogram, peak, fmt)
    raise InputError(f"stage quantize: unknown calibration method {method!r}", fix=f"use one of {METHODS}")


def _entropy_bin(histogram: np.ndarray) -> int:
    """The bin whose upper edge is the KL-optimal threshold (every 8th candidate from 128 bins up: the
    divergence is smooth in the threshold, and this keeps a 2048-bin search to ~240 evaluations)."""
    best, best_kl = len(histogram) - 1, np.inf
    for stop in range(ENTROPY_LEVELS, len(histogram) + 1, 8):
        reference = histogram[:stop].copy()
        reference[-1] += histogram[stop:].sum()  # outliers clip to the threshold
        kl = _divergence(reference, histogram[:stop])
        if kl < best_kl:
            best, best_kl = stop - 1, kl
    return best


def _divergence(reference: np.ndarray, kept: np.ndarray) -> float:
    """KL(reference || kept reduced to ENTROPY_LEVELS bins and expanded back over the reference's non-empty bins).

    Both are smoothed (a small mass moved to empty bins) so that a clipped bin the reduced histogram misses costs a
    large but finite divergence, as in the published entropy calibration."""
    present = reference > 0
    expanded = np.zeros_like(kept)
    for group in np.array_split(np.arange(len(kept)), ENTROPY_LEVELS):
        nonzero = present[group]
        if nonzero.any():
            expanded[group[nonzero]] = kept[group].sum() / nonzero.sum()
    if expanded.sum() == 0:
        return np.inf
    p, q = _smoothed(reference / reference.sum()), _smoothed(expanded / expanded.sum())
    mask = p > 0
    return float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], 1e-12))))


def _smoothed(distribution: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    zeros = distribution == 0
    nonzeros = int((~zeros).sum())
    if nonzeros == 0:
        return distribution
    return distribution + eps * zeros - eps * zeros.sum() / nonzeros * ~zeros


def _mse_amax(histogram: np.ndarray, peak: float, fmt: QuantFormat) -> float:
    """The threshold among 64 candidates in ``[peak/8, peak]`` with the least quantize-dequantize squared error."""
    centers = (np.arange(len(histogram)) + 0.5) * (peak / len(histogram))
    candidates = np.linspace(peak / 8, peak, 64)
    errors = [
        float(np.sum(histogram * (fmt.fake_quantize(centers, fmt.scale_for(c)) - centers) ** 2)) for c in candidates
    ]
    return float(candidates[int(np.argmin(errors))])
