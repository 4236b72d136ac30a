"""Error statistics of one tensor against its PyTorch reference, accumulated over inputs in bounded memory, and
the policy that picks each tensor's rule and tolerance (one policy for ``convert``, ``compare`` and per-layer).

The rule is the validation rule (and Polygraphy's ``elemwise`` check): an element passes when
``|x - ref| <= atol`` or ``|x - ref| <= rtol * |ref|``. Matching infinities and NaNs at the same places compare
equal; a NaN on one side only fails (and is counted); a tensor NaN at every element on both sides, on every input,
compared nothing and fails (NaN weights give such outputs on both sides). A relative error against a zero reference
divides by 2.22e-16, as Polygraphy does. The tolerance is that of the type the graph computes the tensor in
(:func:`judgement`); a tensor that depends on a random node is judged by distribution
(:mod:`pipeline.accuracy.distribution`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.accuracy.anchor import RULE as ANCHOR_RULE
from pipeline.accuracy.anchor import anchor_type
from pipeline.accuracy.distribution import RULE as RANDOM_RULE
from pipeline.accuracy.distribution import DistributionAccumulator
from pipeline.settings import (
    COMPUTE_TYPES,
    DEFAULT_TOLERANCES,
    FLOAT64_COMPUTED_IN,
    Settings,
    Tolerance,
)

if TYPE_CHECKING:
    import onnx

    from pipeline.accuracy.uninitialised import ShapeAccumulator

ELEMENTWISE_RULE = (
    "an element passes when |x - ref| <= atol or |x - ref| <= rtol * |ref| (ref: the PyTorch reference); "
    "infinities and NaNs at the same places compare equal, a NaN on one side only fails; a tensor NaN at every "
    "element on both sides (on every input) compared nothing and fails, each element counted outside"
)
#: The note of a tensor NaN at every element on both sides (see ``ELEMENTWISE_RULE``).
ALL_NAN_NOTE = "NaN at every element in PyTorch and in the graph on every input: nothing was compared"
LOW_PRECISION_RULE = (
    "a tensor computed in float16 or bfloat16 is judged relative to its magnitude, on each input: atol is "
    "max(atol, rms_atol * RMS(ref)), and RMS(x - ref) <= max(atol, rms * RMS(ref)) must hold too (float16: "
    "rms_atol 1e-2, rms 2e-3; bfloat16: 8e-2, 1.6e-2): an error of 1% of a tensor's values fails, float16 "
    "rounding (about 0.03% in BERT and Llama) passes, and values near zero beside large ones do not fail alone"
)
SMALL_TENSOR_RULE = (
    "no RMS verdict on a tensor of fewer than {n} elements on an input (judged element by element): a mean of so "
    "few squares is a few elements' rounding, not a statistic (one element within the elementwise bound, 1% of "
    "the RMS, fails a 0.2% RMS bound alone below 25 elements, two below 50)"
)
TOLERANCE_RULE = (
    "the tolerance is that of the type the graph computes the tensor in (float16 or bfloat16 for float tensors of "
    "an fp16 or bf16 conversion; float32 for float64 tensors, which TensorRT computes in float32), unless "
    "tolerances= names the tensor or that type"
)
#: The fewest elements (per input) a tensor needs for the RMS rule of low precision to give a verdict.
RMS_MIN_ELEMENTS = 64
RULE = (
    f"{ELEMENTWISE_RULE}; {LOW_PRECISION_RULE}; {SMALL_TENSOR_RULE.format(n=RMS_MIN_ELEMENTS)}; {TOLERANCE_RULE}; "
    f"{ANCHOR_RULE}; {RANDOM_RULE}; median and p99 are per input, the worst over inputs"
)

_FLOATS = frozenset({"float64", "float32", "float16", "bfloat16"})


@dataclass(frozen=True)
class Judgement:
    """How one tensor is judged: its tolerance, the type the graph computes it in, and why (for the report)."""

    tolerance: Tolerance
    computed_in: str
    note: str = ""
    #: the type whose PyTorch run anchors the tolerance when it fails (:mod:`pipeline.accuracy.anchor`), or ""
    anchor: str = ""


def judgement(name: str, dtype: str, settings: Settings) -> Judgement:
    """The tolerance of the tensor ``name`` (an output, or a module path in per-layer comparisons) of ``dtype``.

    By name if ``settings.tolerances`` has it; else by the type the graph computes it in (the user's, then the
    default); else by its own dtype's user tolerance.

    >>> judgement("out", "float64", Settings()).computed_in
    'float32'
    """
    computed = computed_type(dtype, settings)
    note = _computed_note(dtype, computed, settings)
    if name in settings.tolerances:
        given = settings.tolerances[name]
        return Judgement(given, computed, given.source or f"tolerance given for {name!r}")
    tolerance = next(
        (settings.tolerances[key] for key in (computed, dtype) if key in settings.tolerances),
        DEFAULT_TOLERANCES.get(computed, DEFAULT_TOLERANCES["float32"]),
    )
    if tolerance.rms_atol or tolerance.rms:
        relative = f"magnitude-relative: atol max({tolerance.atol:g}, {tolerance.rms_atol:g} x RMS), RMS error <= "
        note = "; ".join(filter(None, [note, relative + f"max({tolerance.atol:g}, {tolerance.rms:g} x RMS)"]))
    return Judgement(tolerance, computed, note, anchor_type(computed, tolerance, not settings.accuracy_anchor))


def computed_type(dtype: str, settings: Settings) -> str:
    """The type a graph converted with ``settings`` computes a ``dtype`` tensor in."""
    if dtype in _FLOATS and settings.precision in COMPUTE_TYPES:
        return COMPUTE_TYPES[settings.precision]
    return FLOAT64_COMPUTED_IN if dtype == "float64" else dtype


def _computed_note(dtype: str, computed: str, settings: Settings) -> str:
    if computed == dtype:
        return ""
    if dtype == "float64" and computed == FLOAT64_COMPUTED_IN:
        return "a float64 tensor: TensorRT computes it in float32 (no float64 arithmetic), judged as float32"
    return f"a {dtype} tensor computed in {computed} (precision={settings.precision!r}), judged as {computed}"


def accumulator(
    tolerance: Tolerance, random_sources: tuple[str, ...] | None = None, free_dims: Iterable[int] = ()
) -> Accumulator:
    """The accumulator for one tensor: by distribution when it depends on random nodes (``free_dims``: its dimensions
    sized by computed data, which may differ), else element by element."""
    return DistributionAccumulator(random_sources, free_dims) if random_sources else ErrorAccumulator(tolerance)


def output_accumulators(
    graph: onnx.ModelProto | None, tolerances: dict[str, Tolerance]
) -> dict[str, Accumulator | ShapeAccumulator]:
    """One accumulator per output of ``tolerances``, as ``graph`` (the graph the backend runs, if known) computes it:
    by shape when it is uninitialised memory, by distribution when it depends on a random node, else by element."""
    from pipeline.accuracy.distribution import drawn_dims, random_outputs
    from pipeline.accuracy.uninitialised import ShapeAccumulator, uninitialised_outputs

    random = random_outputs(graph) if graph is not None else {}
    drawn = drawn_dims(graph) if graph is not None else {}
    uninitialised = uninitialised_outputs(graph) if graph is not None else {}
    return {
        name: ShapeAccumulator(uninitialised[name])
        if name in uninitialised
        else accumulator(tolerance, random.get(name), drawn.get(name, ()))
        for name, tolerance in tolerances.items()
    }


#: Histogram of absolute errors: log10 bins from 1e-10 to 1e2, plus "below" (including exact 0) and "above".
HIST_LOW, HIST_HIGH, HIST_BINS = -10.0, 2.0, 48
HIST_EDGES: tuple[float, ...] = tuple(float(e) for e in np.linspace(HIST_LOW, HIST_HIGH, HIST_BINS + 1))

_EPSILON = 2.220446049250313e-16  # Polygraphy's guard against dividing by a zero reference
_TINY = 1e-30


@dataclass(frozen=True)
class ErrorStats:
    """Errors of one tensor over all inputs; ``outside`` counts elements beyond tolerance."""

    elements: int
    outside: int
    max_abs: float
    mean_abs: float
    median_abs: float
    p99_abs: float
    max_rel: float
    mean_rel: float
    median_rel: float
    p99_rel: float
    cosine: float
    shape_mismatch: str | None = None
    #: elements NaN on one side only (they fail, and are among ``outside``)
    one_sided_nan: int = 0
    #: NaN at every element on both sides, on every input: nothing was compared, so it fails (every element outside)
    all_nan: bool = False
    #: the largest atol used (``max(atol, rms_atol * RMS(ref))``, over inputs)
    atol_used: float = 0.0
    #: the worst ``RMS(x - ref) / max(atol, RMS(ref))`` over inputs, and on how many inputs the tolerance's RMS
    #: rule failed (0 when it has none: ``rms`` = 0)
    relative_rms: float = 0.0
    rms_failed: int = 0
    #: counts of |x - ref| per bin: [below 1e-10, HIST_BINS log bins, at or above 1e2 (and NaN)]
    histogram: tuple[int, ...] = field(default=(), repr=False)

    @property
    def passed(self) -> bool:
        """No element outside tolerance, no input beyond the RMS rule (if the tolerance has one), same shapes, and
        not NaN everywhere on both sides."""
        return self.outside == 0 and self.rms_failed == 0 and self.shape_mismatch is None and not self.all_nan

    def to_dict(self) -> dict[str, Any]:
        """The statistics as JSON-ready data (non-finite floats as strings)."""
        data = asdict(self)
        data["histogram"] = list(self.histogram)
        return {k: _json_float(v) for k, v in data.items()}


class ErrorAccumulator:
    """Add one (actual, reference) pair per input; ``result()`` gives the combined :class:`ErrorStats`.

    Only scalars and the fixed-size histogram are kept, so memory does not grow with the number of inputs.

    >>> acc = ErrorAccumulator(Tolerance(1e-5, 1e-4))
    >>> acc.add(np.array([1.0, 2.0]), np.array([1.0, 2.5]))
    >>> acc.result().outside
    1
    """

    def __init__(self, tolerance: Tolerance) -> None:
        self.tolerance = tolerance
        self.elements = self.outside = 0
        self.sum_abs = self.sum_rel = 0.0
        self.worst: dict[str, float] = dict.fromkeys(("max_abs", "median_abs", "p99_abs"), 0.0)
        self.worst.update(dict.fromkeys(("max_rel", "median_rel", "p99_rel"), 0.0))
        self.cosine = 1.0
        self.mismatch: str | None = None
        self.one_sided_nan = self.rms_failed = self.both_nan = 0
        self.atol_used = tolerance.atol
        self.relative_rms = 0.0
        self.histogram = np.zeros(HIST_BINS + 2, dtype=np.int64)

    def add(self, actual: np.ndarray, reference: np.ndarray, tolerance: Tolerance | None = None) -> None:
        """Accumulate one pair of arrays (the backend's and the reference's), judged by ``tolerance`` on this input
        when given (an anchored tolerance, :mod:`pipeline.accuracy.anchor`), else by the accumulator's."""
        tolerance = tolerance or self.tolerance
        actual, reference = np.asarray(actual), np.asarray(reference)
        if actual.shape != reference.shape:
            self.mismatch = f"shape {list(actual.shape)} against the reference's {list(reference.shape)}"
            self.elements += int(reference.size)
            self.outside += int(reference.size)
            return
        # flat: element statistics need no shape, and numpy turns 0-d results into scalars
        actual, reference = actual.astype(np.float64).ravel(), reference.astype(np.float64).ravel()
        absdiff, reldiff = _differences(actual, reference)
        scale = _rms(reference)
        atol = max(tolerance.atol, tolerance.rms_atol * scale)
        self.atol_used = max(self.atol_used, atol)
        passing = (absdiff <= atol) | (reldiff <= tolerance.rtol)
        self._check_rms(absdiff, scale, tolerance)
        self.elements += int(absdiff.size)
        self.one_sided_nan += int(np.count_nonzero(np.isnan(actual) != np.isnan(reference)))
        self.both_nan += int(np.count_nonzero(np.isnan(actual) & np.isnan(reference)))
        self.outside += int(absdiff.size - np.count_nonzero(passing))
        if absdiff.size == 0:
            return
        for kind, values in (("abs", absdiff), ("rel", reldiff)):
            worst = np.where(np.isnan(values), np.inf, values)  # a NaN error is the worst error
            with np.errstate(invalid="ignore"):  # quantiles interpolate between infinities
                median, p99 = (float(np.nan_to_num(q, nan=np.inf)) for q in np.quantile(worst, [0.5, 0.99]))
            self.worst[f"max_{kind}"] = max(self.worst[f"max_{kind}"], float(worst.max()))
            self.worst[f"median_{kind}"] = max(self.worst[f"median_{kind}"], median)
            self.worst[f"p99_{kind}"] = max(self.worst[f"p99_{kind}"], p99)
        self.sum_abs += float(np.where(np.isnan(absdiff), np.inf, absdiff).sum())
        self.sum_rel += float(np.where(np.isnan(reldiff), np.inf, reldiff).sum())
        self.cosine = min(self.cosine, cosine_similarity(actual, reference))
        self.histogram += error_histogram(absdiff)

    def _check_rms(self, absdiff: np.ndarray, scale: float, tolerance: Tolerance) -> None:
        """The tensor-level rule: RMS(x - ref) <= max(atol, rms * RMS(ref)) (NaN errors count as failing), on
        tensors of at least :data:`RMS_MIN_ELEMENTS` elements."""
        if not absdiff.size:
            return
        error = float(np.sqrt(np.mean(np.square(absdiff)))) if not np.isnan(absdiff).any() else np.inf
        self.relative_rms = max(self.relative_rms, error / max(scale, tolerance.atol, _TINY))
        if rms_judged(absdiff.size, tolerance) and error > max(tolerance.atol, tolerance.rms * scale):
            self.rms_failed += 1

    def result(self) -> ErrorStats:
        """The statistics over everything added so far."""
        count = max(self.elements, 1)
        all_nan = 0 < self.elements == self.both_nan  # NaN == NaN everywhere is no agreement: nothing was compared
        return ErrorStats(
            elements=self.elements,
            outside=self.elements if all_nan else self.outside,
            max_abs=self.worst["max_abs"],
            mean_abs=self.sum_abs / count,
            median_abs=self.worst["median_abs"],
            p99_abs=self.worst["p99_abs"],
            max_rel=self.worst["max_rel"],
            mean_rel=self.sum_rel / count,
            median_rel=self.worst["median_rel"],
            p99_rel=self.worst["p99_rel"],
            cosine=self.cosine,
            shape_mismatch=self.mismatch,
            one_sided_nan=self.one_sided_nan,
            all_nan=all_nan,
            atol_used=self.atol_used,
            relative_rms=self.relative_rms,
            rms_failed=self.rms_failed,
            histogram=tuple(int(c) for c in self.histogram),
        )


def tolerance_ratio(actual: np.ndarray, reference: np.ndarray, tolerance: Tolerance) -> float:
    """How far one tensor is from failing ``tolerance`` on one input: at most 1 passes, as :class:`ErrorAccumulator`
    judges (the worst element's ``|x - ref| / max(atol, rms_atol * RMS(ref), rtol * |ref|)`` and, with an RMS
    rule, ``RMS(x - ref) / max(atol, rms * RMS(ref))``); inf or NaN where the reference is finite is inf.

    >>> round(tolerance_ratio(np.array([1.0, 2.2]), np.array([1.0, 2.0]), Tolerance(1e-5, 0.2)), 6)
    0.5
    """
    a, b = np.asarray(actual, np.float64).ravel(), np.asarray(reference, np.float64).ravel()
    if not a.size:
        return 0.0
    absdiff, _ = _differences(a, b)
    scale = _rms(b)
    allowed = np.maximum(max(tolerance.atol, tolerance.rms_atol * scale), tolerance.rtol * np.abs(b))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(absdiff == 0, 0.0, absdiff / allowed)
    worst = float(np.where(np.isnan(ratio), np.inf, ratio).max())
    if rms_judged(a.size, tolerance):
        error = float(np.sqrt(np.mean(np.square(absdiff)))) if not np.isnan(absdiff).any() else np.inf
        limit = max(tolerance.atol, tolerance.rms * scale)
        worst = max(worst, error / limit if limit > 0 else (0.0 if error == 0 else np.inf))
    return worst


def rms_judged(elements: int, tolerance: Tolerance) -> bool:
    """Whether the RMS rule gives a verdict: the tolerance has one and the tensor has at least
    :data:`RMS_MIN_ELEMENTS` elements on the input (see ``SMALL_TENSOR_RULE``)."""
    return tolerance.rms > 0 and elements >= RMS_MIN_ELEMENTS


#: What :func:`accumulator` gives: both have ``add(actual, reference)`` and ``result()``.
Accumulator = ErrorAccumulator | DistributionAccumulator


def cosine_similarity(actual: np.ndarray, reference: np.ndarray) -> float:
    """Cosine of the angle between the two tensors (flattened, float64), over elements finite in both.

    Two all-zero tensors are identical (1.0); one all-zero tensor against a non-zero one is 0.0.
    """
    a = np.asarray(actual, dtype=np.float64).ravel()
    b = np.asarray(reference, dtype=np.float64).ravel()
    finite = np.isfinite(a) & np.isfinite(b)
    if not finite.all():  # (the copies only when some element is not finite: a logits tensor is 8 million)
        a, b = a[finite], b[finite]
    norm_a, norm_b = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if norm_a == 0.0 or norm_b == 0.0:
        return 1.0 if norm_a == norm_b else 0.0
    return float(np.dot(a, b) / (norm_a * norm_b))


def error_histogram(absdiff: np.ndarray) -> np.ndarray:
    """Counts of absolute errors per bin of :data:`HIST_EDGES` (first: below, last: above or NaN)."""
    counts = np.zeros(HIST_BINS + 2, dtype=np.int64)
    values = absdiff.ravel()
    small = values < 10.0**HIST_LOW
    large = ~(values < 10.0**HIST_HIGH)  # NaN lands here too
    counts[0] = int(np.count_nonzero(small))
    counts[-1] = int(np.count_nonzero(large))
    middle = np.log10(values[~small & ~large])
    counts[1:-1] = np.histogram(middle, bins=HIST_BINS, range=(HIST_LOW, HIST_HIGH))[0]
    return counts


def _rms(values: np.ndarray) -> float:
    """Root mean square of the finite values (0 if there are none)."""
    finite = np.isfinite(values)
    kept = values if finite.all() else values[finite]
    return float(np.sqrt(np.dot(kept, kept) / kept.size)) if kept.size else 0.0


def _differences(actual: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(invalid="ignore", over="ignore"):
        absdiff = np.abs(actual - reference)
    same = (actual == reference) | (np.isnan(actual) & np.isnan(reference))
    absdiff[same] = 0.0
    denominator = np.abs(reference)
    denominator[denominator == 0] = _EPSILON
    with np.errstate(invalid="ignore", divide="ignore"):
        reldiff = absdiff / denominator
    reldiff[same] = 0.0
    return absdiff, reldiff


def _json_float(value: Any) -> Any:
    """JSON has no inf/NaN: write them as strings (``"inf"``), everything else unchanged."""
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    return value
