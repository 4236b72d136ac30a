"""Calibration methods (pipeline/quantize/calibrate.py): each picks the range its definition says, on histograms
with known answers and on a real ONNX Runtime run."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from converters.errors import InputError
from passes.quantize.formats import FORMATS
from pipeline.quantize.calibrate import BINS, amax_from_histogram, calibrate, method_for


def histogram(values: np.ndarray) -> tuple[np.ndarray, float]:
    peak = float(np.abs(values).max())
    return np.histogram(np.abs(values), bins=BINS, range=(0.0, peak))[0].astype(np.float64), peak


def gaussian_with_outliers() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.concatenate([rng.normal(size=200_000), [60.0, -80.0, 100.0]])


def test_percentile_clips_the_outliers_and_max_keeps_them() -> None:
    counts, peak = histogram(gaussian_with_outliers())
    fmt = FORMATS["int8"]
    assert peak == 100.0
    p = amax_from_histogram(counts, peak, fmt, "percentile", 99.9)
    assert 3.0 < p < 3.6  # the 99.9th percentile of |N(0, 1)| is 3.29 (one bin is 0.05 wide)


def test_entropy_cuts_far_outliers_of_a_gaussian() -> None:
    values = gaussian_with_outliers()
    counts, peak = histogram(values)
    fmt = FORMATS["int8"]
    amax = amax_from_histogram(counts, peak, fmt, "entropy")
    assert 3.0 < amax < 20.0  # far below the 100 of max, beyond the bulk of the distribution
    bulk = values[np.abs(values) < 3]
    error = np.mean((fmt.fake_quantize(bulk, fmt.scale_for(amax)) - bulk) ** 2)
    error_max = np.mean((fmt.fake_quantize(bulk, fmt.scale_for(peak)) - bulk) ** 2)
    assert error < error_max / 4  # the bulk of the tensor is quantized much more finely than with max


@pytest.mark.parametrize("fmt_name", ["int8", "fp8"])
def test_mse_has_the_least_squared_error_of_all_methods(fmt_name: str) -> None:
    values = gaussian_with_outliers()
    counts, peak = histogram(values)
    fmt = FORMATS[fmt_name]

    def error(amax: float) -> float:
        return float(np.mean((fmt.fake_quantize(values, fmt.scale_for(amax)) - values) ** 2))

    best = error(amax_from_histogram(counts, peak, fmt, "mse"))
    others = [peak, amax_from_histogram(counts, peak, fmt, "percentile", 99.99)]
    if fmt_name == "int8":
        others.append(amax_from_histogram(counts, peak, fmt, "entropy"))
    assert all(best <= error(a) * 1.05 for a in others)  # histogram bins approximate the values: 5% slack


def test_auto_is_mse_for_int8_and_max_for_fp8_and_entropy_is_int8_only() -> None:
    assert method_for("auto", FORMATS["int8"]) == "mse"
    assert method_for("auto", FORMATS["fp8"]) == "max"
    with pytest.raises(InputError, match="fix:.*'max'"):
        method_for("entropy", FORMATS["fp8"])
    with pytest.raises(InputError, match="unknown calibration_method"):
        method_for("minmax", FORMATS["int8"])


def test_calibrate_observes_every_feed_on_onnx_runtime() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Neg", ["r"], ["y"], name="neg")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    feeds = [{"x": np.array([1, -9, 2, 3], np.float32)}, {"x": np.array([0, 5, -1, 0], np.float32)}]
    ranges = calibrate(model, feeds, ["x", "r"], FORMATS["fp8"], "max")
    assert ranges == {"x": 9.0, "r": 5.0}
