"""Error statistics of one tensor against its PyTorch reference, accumulated over inputs in bounded memory.

The rule is the validation rule (and Polygraphy's ``elemwise`` check): an element passes when
``|x - ref| <= atol`` or ``|x - ref| <= rtol * |ref|``. Matching infinities and matching NaNs compare equal;
any other NaN fails. A relative error against a zero reference divides by 2.22e-16, as Polygraphy does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from converters.settings import Tolerance

RULE = (
    "an element passes when |x - ref| <= atol or |x - ref| <= rtol * |ref| (ref: the PyTorch reference); "
    "matching infinities and NaNs compare equal; median and p99 are per input, the worst over inputs"
)

#: Histogram of absolute errors: log10 bins from 1e-10 to 1e2, plus "below" (including exact 0) and "above".
HIST_LOW, HIST_HIGH, HIST_BINS = -10.0, 2.0, 48
HIST_EDGES: tuple[float, ...] = tuple(float(e) for e in np.linspace(HIST_LOW, HIST_HIGH, HIST_BINS + 1))

_EPSILON = 2.220446049250313e-16  # Polygraphy's guard against dividing by a zero reference


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
    #: counts of |x - ref| per bin: [below 1e-10, HIST_BINS log bins, at or above 1e2 (and NaN)]
    histogram: tuple[int, ...] = field(default=(), repr=False)

    @property
    def passed(self) -> bool:
        """No element outside tolerance, and the shapes matched."""
        return self.outside == 0 and self.shape_mismatch is None

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
        self.histogram = np.zeros(HIST_BINS + 2, dtype=np.int64)

    def add(self, actual: np.ndarray, reference: np.ndarray) -> None:
        """Accumulate one pair of arrays (the backend's and the reference's)."""
        actual, reference = np.asarray(actual), np.asarray(reference)
        if actual.shape != reference.shape:
            self.mismatch = f"shape {list(actual.shape)} against the reference's {list(reference.shape)}"
            self.elements += int(reference.size)
            self.outside += int(reference.size)
            return
        absdiff, reldiff = _differences(actual.astype(np.float64), reference.astype(np.float64))
        passing = (absdiff <= self.tolerance.atol) | (reldiff <= self.tolerance.rtol)
        self.elements += int(absdiff.size)
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

    def result(self) -> ErrorStats:
        """The statistics over everything added so far."""
        count = max(self.elements, 1)
        return ErrorStats(
            elements=self.elements,
            outside=self.outside,
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
            histogram=tuple(int(c) for c in self.histogram),
        )


def cosine_similarity(actual: np.ndarray, reference: np.ndarray) -> float:
    """Cosine of the angle between the two tensors (flattened, float64), over elements finite in both.

    Two all-zero tensors are identical (1.0); one all-zero tensor against a non-zero one is 0.0.
    """
    a = np.asarray(actual, dtype=np.float64).ravel()
    b = np.asarray(reference, dtype=np.float64).ravel()
    finite = np.isfinite(a) & np.isfinite(b)
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
