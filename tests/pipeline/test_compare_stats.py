"""Error statistics of the comparison, on hand-made arrays (the plots: test_compare_plots.py)."""

from __future__ import annotations

import numpy as np
import pytest

from converters.settings import Tolerance
from pipeline.accuracy.stats import HIST_BINS, HIST_EDGES, ErrorAccumulator, cosine_similarity, error_histogram


def test_statistics_and_the_rule() -> None:
    reference = np.array([1.0, 2.0, 0.0, 100.0, -3.0], dtype=np.float32)
    actual = np.array([1.0, 2.5, 1e-6, 100.005, -3.0], dtype=np.float32)
    accumulator = ErrorAccumulator(Tolerance(atol=1e-5, rtol=1e-4))
    accumulator.add(actual, reference)
    stats = accumulator.result()
    # 2.5 vs 2 fails both; 1e-6 vs 0 is within atol; 100.005 vs 100 is within rtol (5e-5 relative)
    assert (stats.elements, stats.outside) == (5, 1) and not stats.passed
    assert stats.max_abs == pytest.approx(0.5) and stats.max_rel == pytest.approx(1e-6 / 2.220446049250313e-16)
    assert stats.mean_abs == pytest.approx((0.5 + 1e-6 + 0.005) / 5, rel=1e-3)
    assert stats.median_abs == pytest.approx(1e-6, rel=1e-3)
    assert sum(stats.histogram) == 5 and stats.histogram[0] == 2  # two exact matches below 1e-10


def test_matching_infinities_and_nans_are_equal_other_nans_fail() -> None:
    accumulator = ErrorAccumulator(Tolerance(1e-5, 1e-4))
    accumulator.add(np.array([np.inf, -np.inf, np.nan, 1.0]), np.array([np.inf, -np.inf, np.nan, 1.0]))
    assert accumulator.result().passed
    accumulator.add(np.array([np.nan, np.inf]), np.array([1.0, -np.inf]))
    stats = accumulator.result()
    assert (stats.elements, stats.outside) == (6, 2) and stats.max_abs == np.inf
    assert stats.histogram[-1] == 2  # NaN and inf errors land above the range


def test_integers_compare_exactly_and_shapes_must_match() -> None:
    accumulator = ErrorAccumulator(Tolerance(0.0, 0.0))
    accumulator.add(np.array([3, 4, 5]), np.array([3, 4, 6]))
    assert accumulator.result().outside == 1
    mismatched = ErrorAccumulator(Tolerance(1e-5, 1e-4))
    mismatched.add(np.zeros((2, 3)), np.zeros((3, 2)))
    assert not mismatched.result().passed and "[2, 3]" in (mismatched.result().shape_mismatch or "")


def test_statistics_combine_over_inputs() -> None:
    accumulator = ErrorAccumulator(Tolerance(1e-5, 1e-4))
    accumulator.add(np.zeros(4), np.zeros(4))
    accumulator.add(np.full(4, 1.0), np.full(4, 1.1))
    stats = accumulator.result()
    assert stats.elements == 8 and stats.outside == 4
    assert stats.mean_abs == pytest.approx(0.05) and stats.median_abs == pytest.approx(0.1)  # worst input's median
    assert stats.cosine == pytest.approx(1.0)


def test_cosine_similarity() -> None:
    assert cosine_similarity(np.array([1.0, 0.0]), np.array([0.0, 2.0])) == pytest.approx(0.0)
    assert cosine_similarity(np.array([1.0, 2.0]), np.array([2.0, 4.0])) == pytest.approx(1.0)
    assert cosine_similarity(np.zeros(3), np.zeros(3)) == 1.0
    assert cosine_similarity(np.zeros(3), np.ones(3)) == 0.0


def test_histogram_bins() -> None:
    counts = error_histogram(np.array([0.0, 1e-12, 1e-9, 1e-3, 0.9e2, 1e3, np.nan]))
    assert len(counts) == HIST_BINS + 2 == len(HIST_EDGES) + 1
    assert counts[0] == 2 and counts[-1] == 2 and counts.sum() == 7
