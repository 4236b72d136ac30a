"""Observing intermediate tensors on ONNX Runtime: one run per feed when the tensors are small, bounded chunks when
they are large (sizes from the graph's shapes, symbolic dimensions bound from the feeds), every tensor seen once
per feed, and peaks that skip infinities."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from pipeline.precision import measure
from pipeline.precision.measure import OBSERVE_CHUNK, observe, observed_chunks, peak_magnitudes

STEPS = 600


def _chain(width: int) -> onnx.ModelProto:
    """``x (batch, width)`` through STEPS nodes alternating ``Mul(., 1.01)`` and ``Relu``, shapes inferred."""
    nodes, previous = [], "x"
    for i in range(STEPS):
        out = f"t{i}"
        inputs = [previous, "k"] if i % 2 else [previous]
        nodes.append(helper.make_node("Mul" if i % 2 else "Relu", inputs, [out]))
        previous = out
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor("k", TensorProto.FLOAT, [], [1.01])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def _names(model: onnx.ModelProto) -> list[str]:
    return ["x", *(n.output[0] for n in model.graph.node)]


def test_small_tensors_are_observed_in_one_run_per_feed() -> None:
    model = _chain(8)
    feeds = [{"x": np.full((2, 8), float(i + 1), np.float32)} for i in range(3)]
    chunks = observed_chunks(model, _names(model), feeds)
    assert len(chunks) == 1 and chunks[0] == _names(model)
    seen: list[tuple[str, int]] = []
    observe(model, feeds, _names(model), lambda name, index, value: seen.append((name, index)))
    assert sorted(seen) == sorted((n, i) for n in _names(model) for i in range(3))


def test_large_tensors_are_observed_in_bounded_chunks_sized_from_the_bound_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    width = 2048
    model = _chain(width)
    per_tensor = 64 * width * 4  # batch 64 from the feed: 512 KiB a tensor
    monkeypatch.setattr(measure, "OBSERVE_BYTES", 400 * per_tensor)
    feeds = [{"x": np.ones((64, width), np.float32)}]
    chunks = observed_chunks(model, _names(model), feeds)
    assert [n for chunk in chunks for n in chunk] == _names(model)
    assert [len(c) for c in chunks] == [400, STEPS + 1 - 400]  # more than OBSERVE_CHUNK while within the bytes
    monkeypatch.setattr(measure, "OBSERVE_BYTES", 10 * per_tensor)
    assert [len(c) for c in observed_chunks(model, _names(model), feeds)] == [OBSERVE_CHUNK, OBSERVE_CHUNK, 89]
    small = [{"x": np.ones((1, width), np.float32)}]  # the same graph at batch 1 fits the budget: one chunk
    monkeypatch.setattr(measure, "OBSERVE_BYTES", 400 * per_tensor)
    assert len(observed_chunks(model, _names(model), small)) == 1


def test_peaks_are_the_largest_finite_magnitudes() -> None:
    model = _chain(4)
    x = np.array([[1.0, -3.0, np.inf, 2.0]], np.float32)
    peaks = peak_magnitudes(model, [{"x": x}])
    assert peaks["x"] == 3.0  # the inf is skipped
    assert peaks["t0"] == 2.0  # Relu(-3) = 0, Relu(inf) = inf skipped
    assert peaks[f"t{STEPS - 1}"] == pytest.approx(2.0 * 1.01 ** (STEPS // 2), rel=1e-4)


def test_peaks_come_from_in_graph_reductions_and_only_non_finite_tensors_are_observed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _chain(4)
    x = np.array([[1.0, -3.0, np.inf, 2.0]], np.float32)
    finite = np.array([[1.0, -3.0, 0.5, 2.0]], np.float32)
    asked: list[str] = []
    observe_values = measure.observe

    def recording(model: onnx.ModelProto, feeds: list, names: list[str], *args: object) -> None:
        asked.extend(names)
        observe_values(model, feeds, names, *args)

    monkeypatch.setattr(measure, "observe", recording)
    inner = _names(model)[1:]
    finite_peaks = peak_magnitudes(model, [{"x": finite}])
    assert asked == []  # every peak from the reductions: one run, no tensor observed
    peaks = peak_magnitudes(model, [{"x": finite}, {"x": x}])
    assert asked == inner  # the inf reaches every tensor after x: each is observed for its largest finite value
    assert peaks["t0"] == 2.0 and peaks["x"] == 3.0
    for feeds, got in (([{"x": finite}], finite_peaks), ([{"x": finite}, {"x": x}], peaks)):
        reference = dict.fromkeys(got, 0.0)

        def keep(name: str, _: int, value: np.ndarray, reference: dict[str, float] = reference) -> None:
            reference[name] = max(reference[name], measure._finite_peak(value))

        observe_values(model, feeds, list(got), keep)
        assert got == pytest.approx(reference, rel=1e-6)


def test_float16_tensors_are_reduced_in_float32() -> None:
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16), helper.make_node("Neg", ["h"], ["y"])],
        "half",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    peaks = peak_magnitudes(model, [{"x": np.array([0.5, -70000.0, 60000.0], np.float32)}])
    assert peaks == {"x": 70000.0, "h": 60000.0, "y": 60000.0}  # -70000 is -inf in float16: the largest finite is kept
