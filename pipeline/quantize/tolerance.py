"""How far a quantized graph's outputs may be from PyTorch fp32: a bound derived from the format's rounding and the
number of quantized layers, not a fixed fraction.

One quantize-dequantize of a tensor adds a rounding error whose RMS, relative to the tensor's RMS, is the format's
*unit noise* ``u``:

* INT8 (uniform grid, step ``amax / 127``): the error is uniform over one step, RMS ``step / sqrt(12)``; a
  calibrated activation's range is about :data:`CREST` times its RMS, so ``u = CREST / (127 * sqrt(12))`` (0.0091).
* FP8 E4M3 (3 mantissa bits): the rounding error is uniform over the spacing of the value's binade, ``2**-3`` of
  the binade's base, so ``u = 2**-3 / sqrt(12)`` relative (0.036), the range aside.

A graph with ``L`` quantized inputs (weighted ops and residual Adds) stacks ``L`` such roundings; independent errors
add in quadrature, so an output's expected relative RMS error is ``u * sqrt(L)``. Two judgements follow:

* **Accuracy** (:func:`error_bound`, the un-quantization search's target): the worst output's relative RMS error on
  the calibration inputs must stay within ``Z * u * sqrt(L)``, :data:`Z` standard deviations of that estimate.
* **Validation** (:func:`output_tolerances`, what Polygraphy checks element by element on the validation inputs):
  ``rtol = 0`` and ``atol`` the larger of :data:`ENVELOPE_MARGIN` x the largest absolute error the quantized graph,
  run by ONNX Runtime, shows on the calibration and the validation inputs (its measured envelope: validation inputs
  are drawn like the sample and may leave the calibrated ranges and clip, which is no fault of the engine) and
  :data:`ELEMENT_SIGMAS` x ``u * sqrt(L)`` x the output's RMS there (the largest of ``n`` Gaussian errors is about
  ``sqrt(2 ln n)`` standard deviations, under 5.5 up to 10**6 elements). An element beyond that is a broken engine
  (a wrong scale, a mis-fused pair), not the rounding and clipping the graph was measured to have. Validation so
  judges whether the backend computes the quantized graph; whether the quantized graph is accurate enough is the
  accuracy bound's question, asked on the calibration inputs, which stand for the data.

Both are stated in the report (``report.quantization.notes`` and ``tolerances``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from passes.quantize.formats import QuantFormat

#: Range over RMS of a calibrated activation (a clipped Gaussian's range at ~4 sigma; ReLU outputs are close to it).
CREST = 4.0
#: Standard deviations of the expected error allowed by the accuracy bound.
Z = 3.0
#: Standard deviations of the expected error allowed for the largest single element (validation's floor).
ELEMENT_SIGMAS = 6.0
#: Validation allows this multiple of the largest error measured on the calibration inputs.
ENVELOPE_MARGIN = 2.0


def unit_noise(fmt: QuantFormat) -> float:
    """The relative RMS error of one quantize-dequantize in ``fmt`` (see the module doc)."""
    if fmt.name == "int8":
        return CREST / (fmt.max_value * math.sqrt(12.0))
    return 2.0**-3 / math.sqrt(12.0)


def expected_error(fmt: QuantFormat, layers: int) -> float:
    """The expected relative RMS error of an output after ``layers`` quantized inputs."""
    return unit_noise(fmt) * math.sqrt(max(layers, 1))


def error_bound(fmt: QuantFormat, layers: int) -> float:
    """The largest relative RMS output error (vs PyTorch fp32) accepted as quantization error, not a fault."""
    return Z * expected_error(fmt, layers)


def output_tolerances(
    references: Sequence[Mapping[str, np.ndarray]],
    fmt: QuantFormat,
    layers: int,
    measured: Mapping[str, float] | None = None,
) -> dict[str, tuple[float, float]]:
    """Per float output: (atol, 0), atol = max(:data:`ENVELOPE_MARGIN` x ``measured[output]`` (its largest
    absolute error on the calibration inputs), :data:`ELEMENT_SIGMAS` x expected error x its RMS over
    ``references``)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for outputs in references:
        for name, value in outputs.items():
            array = np.asarray(value)
            if np.issubdtype(array.dtype, np.floating) and array.size:
                finite = array[np.isfinite(array)].astype(np.float64)
                sums[name] = sums.get(name, 0.0) + float(np.sum(finite**2))
                counts[name] = counts.get(name, 0) + int(finite.size)
    scale = ELEMENT_SIGMAS * expected_error(fmt, layers)
    measured = measured or {}
    tolerances = {}
    for name in sums:
        floor = scale * math.sqrt(sums[name] / max(counts[name], 1))
        tolerances[name] = (max(ENVELOPE_MARGIN * measured.get(name, 0.0), floor, 1e-6), 0.0)
    return tolerances


def describe(fmt: QuantFormat, layers: int) -> str:
    """The tolerance in one sentence, for the report."""
    return (
        f"tolerance: {layers} quantized inputs x {fmt.name} unit noise {unit_noise(fmt):.3g} -> expected relative "
        f"RMS error {expected_error(fmt, layers):.3g}; accepted up to {error_bound(fmt, layers):.3g} ({Z:g} sigma, "
        f"the un-quantization search's target); validation: rtol 0, atol = max({ENVELOPE_MARGIN:g} x the largest "
        "error of the graph on ONNX Runtime on the calibration and validation inputs, "
        f"{ELEMENT_SIGMAS:g} x the expected error x the output's RMS) (report.quantization.tolerances), unless "
        "tolerances= names the output or 'float32'"
    )
