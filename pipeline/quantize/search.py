"""Accuracy-driven un-quantization: when the quantized graph's output error on the calibration inputs exceeds the
bound of :mod:`pipeline.quantize.tolerance`, the most sensitive quantized ops return to the higher type until it
holds. The fp16 path's search is reused (:mod:`pipeline.precision.search`): one observed run of the float32 graph
and one of the quantized graph rank the quantized ops by the error each adds, then a bisection finds the shortest
head of that ranking which, left unquantized, meets the bound (about log2(n) quantizations instead of n).

>>> result = QuantizedGraphs(...).search(enabled=True)   # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort

from passes import to_graph, to_model
from passes.model_io.external_data import ort_session_bytes
from passes.quantize.formats import QuantFormat
from passes.quantize.insert import quantize_graph
from passes.quantize.placement import Target
from passes.quantize.residual import plan_residuals
from passes.records import QuantizedOp
from pipeline.precision.measure import Feed, session_feed
from pipeline.precision.search import rank_by_sensitivity, shortest_passing_prefix
from pipeline.quantize.tolerance import error_bound
from pipeline.runtime.ort.int4 import configure_int4
from pipeline.runtime.ort.int8 import disabled_optimizers
from pipeline.runtime.ort.session_graph import runnable_model
from pipeline.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Quantized:
    """One quantization of the graph: the model, what was quantized, its error and the bound it is judged by."""

    model: onnx.ModelProto
    done: tuple[QuantizedOp, ...]
    error: float  # worst relative RMS error of a float output vs PyTorch fp32 on the calibration inputs
    bound: float

    @property
    def passed(self) -> bool:
        """Is the error within the bound?"""
        return self.error <= self.bound


@dataclass(frozen=True)
class SearchResult:
    """The chosen quantization and the ops the search returned to the higher type, most sensitive first, with the
    relative error each added."""

    chosen: Quantized
    unquantized: tuple[tuple[str, float], ...]
    first_error: float  # the error with every planned op quantized


class QuantizedGraphs:
    """Quantizes ``base`` (the graph after the precision stage) with any subset of the planned targets left out.

    ``fp32_graph_targets`` are planned on the float32 graph (``fp32_model``), whose node names ``base`` keeps;
    ``amax`` maps a node name to its activation's calibrated range."""

    def __init__(
        self,
        fp32_model: onnx.ModelProto,
        base: onnx.ModelProto,
        node_metadata: dict[str, dict[str, str]],
        targets: Sequence[Target],
        amax: dict[str, float],
        fmt: QuantFormat,
        settings: Settings,
        judge: Callable[[onnx.ModelProto], float],
    ) -> None:
        self.fp32_model, self.base, self.node_metadata = fp32_model, base, node_metadata
        self.targets, self.amax, self.fmt, self.settings, self.judge = list(targets), amax, fmt, settings, judge
        self.fp32_graph = to_graph(fp32_model)[0]

    def quantize(self, left_out: frozenset[str] = frozenset(), relu_inputs: bool = True) -> Quantized:
        """The graph with every planned target except ``left_out`` quantized (residual Adds re-planned for the
        convolutions still quantized), and its error; ``relu_inputs=False`` leaves out the exact output pairs before
        Relus (:func:`passes.quantize.insert.quantize_relu_inputs`) so that an op's own rounding is at its input."""
        kept = [t for t in self.targets if t.node not in left_out]
        residuals = [r for r in plan_residuals(self.fp32_graph, kept) if r.node in self.amax]
        graph, metadata = to_graph(self.base)
        present = {n.name for n in graph.nodes}
        chosen = [t for t in (*kept, *residuals) if t.node in present]
        done = quantize_graph(graph, self.fmt, chosen, self.amax, relu_inputs)
        model = to_model(graph, self.base, {**self.node_metadata, **metadata})
        return Quantized(model, tuple(done), self.judge(model), error_bound(self.fmt, len(done)))

    def search(self, enabled: bool, feeds: Sequence[Feed]) -> SearchResult:
        """Quantize everything; when that misses the bound and ``enabled``, leave out the shortest head of the
        sensitivity ranking that meets it (or every weighted op, when nothing does: then the bound is missed with
        everything in the higher type, and the caller says so)."""
        first = self.quantize()
        if first.passed or not enabled:
            return SearchResult(first, (), first.error)
        weighted = [op.node for op in first.done if op.weight is not None]
        # ranked on the same quantization without the exact pairs before Relus: with them, a Relu's output would carry
        # the rounding of the op after it, and that op would seem to add no error
        runnable = runnable_model(self.quantize(relu_inputs=False).model, "onnxruntime", self.settings)
        ranked = rank_by_sensitivity(self.fp32_model, runnable, feeds, weighted, self.settings.ort_providers)
        tried: dict[int, Quantized] = {}

        def passes(count: int) -> bool:
            tried[count] = self.quantize(frozenset(name for name, _ in ranked[:count]))
            logger.info(
                "quantize search: %d most sensitive ops unquantized -> error %.4g (bound %.4g)",
                count,
                tried[count].error,
                tried[count].bound,
            )
            return tried[count].passed

        head = shortest_passing_prefix(len(ranked), passes)
        count = len(ranked) if head is None else head
        chosen = tried.get(count) or self.quantize(frozenset(name for name, _ in ranked[:count]))
        return SearchResult(chosen, tuple(ranked[:count]), first.error)


def relative_error(
    model: onnx.ModelProto,
    settings: Settings,
    feeds: Sequence[Feed],
    references: Sequence[dict[str, np.ndarray]],
) -> float:
    """The worst ``||got - want|| / ||want||`` over float outputs and calibration inputs, on ONNX Runtime."""
    return measure_errors(model, settings, feeds, references)[0]


def measure_errors(
    model: onnx.ModelProto,
    settings: Settings,
    feeds: Sequence[Feed],
    references: Sequence[dict[str, np.ndarray]],
) -> tuple[float, dict[str, float]]:
    """The worst relative error (as :func:`relative_error`) and each float output's largest absolute error."""
    return measure_errors_on(model, settings, [(feeds, references)])[0]


def measure_errors_on(
    model: onnx.ModelProto,
    settings: Settings,
    sets: Sequence[tuple[Sequence[Feed], Sequence[dict[str, np.ndarray]]]],
) -> list[tuple[float, dict[str, float]]]:
    """:func:`measure_errors` of each (inputs, PyTorch's outputs on them) set, on one ONNX Runtime session."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    runnable = runnable_model(model, "onnxruntime", settings)
    configure_int4(runnable, options, settings)
    session = ort.InferenceSession(
        ort_session_bytes(runnable, options),
        sess_options=options,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=disabled_optimizers(runnable),  # as the backend runs it
    )
    names = [o.name for o in session.get_outputs()]
    measured = []
    for feeds, references in sets:
        worst, largest = 0.0, dict.fromkeys(names, 0.0)
        for feed, want in zip(feeds, references, strict=True):
            got = dict(zip(names, session.run(names, session_feed(session, feed)), strict=True))
            for name in names:
                error = _errors(np.asarray(got[name]), np.asarray(want[name]))
                if error is not None:
                    worst, largest[name] = max(worst, error[0]), max(largest[name], error[1])
        measured.append((worst, largest))
    return measured


def _errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float] | None:
    """``||got - want|| / ||want||`` and the largest absolute difference over the places both are finite; None for
    outputs that are not floating point. Two float32 outputs are compared in float32 (their difference is exact or
    within one rounding of its own size: far below any quantization error), again in float64 when a float32 sum of
    squares overflows."""
    if not (np.issubdtype(got.dtype, np.floating) and np.issubdtype(want.dtype, np.floating)):
        return None
    narrow = got.dtype == want.dtype == np.float32
    a, b = (got, want) if narrow else (got.astype(np.float64), want.astype(np.float64))
    difference = (a - b).reshape(-1)
    norm, apart = float(np.linalg.norm(b.reshape(-1))), float(np.linalg.norm(difference))
    if narrow and not (np.isfinite(norm) and np.isfinite(apart)):
        return _errors(got.astype(np.float64), want.astype(np.float64))
    magnitude = np.abs(difference, out=difference)
    largest = float(np.max(magnitude, where=np.isfinite(magnitude), initial=0.0))
    return apart / (norm if norm > 0 else 1.0), largest
