"""Validation inputs drawn like the sample keep what the sample shows the model requires: each property detected on
the sample tensor, kept by its draws, and real models that PyTorch refused drawn inputs for now validated on all
of them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import pipeline
from pipeline.validation.draws import draw_like, properties


def _draws(sample: np.ndarray, shape: tuple[int, ...] | None = None, count: int = 20) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [draw_like(sample, shape or sample.shape, rng) for _ in range(count)]


def test_values_within_unit_interval_stay_within_it_and_spread_like_the_sample() -> None:
    sample = np.array([0.2, 0.7, 0.9, 0.4], dtype=np.float32)
    assert properties(sample) == ("unit_interval", "distinct")
    drawn = np.concatenate(_draws(sample, (50,)))
    assert drawn.dtype == np.float32 and ((drawn > 0) & (drawn < 1)).all()
    assert 0.3 < drawn.mean() < 0.8 and drawn.std() > 0.1  # random, not the sample repeated


def test_positive_and_non_negative_values_stay_so() -> None:
    positive = np.array([3.0, 0.5, 7.0, 12.0], dtype=np.float32)
    with_zero = np.array([0.0, 3.0, 7.0, 2.0], dtype=np.float32)
    assert properties(positive) == ("positive", "distinct") and properties(with_zero) == ("non_negative", "distinct")
    assert all((d > 0).all() for d in _draws(positive, (100,)))
    assert all((d >= 0).all() for d in _draws(with_zero, (100,)))
    assert properties(np.array([-1.0, 2.0, 0.5, 2.0], dtype=np.float32)) == ()  # a plain normal


def test_sorted_last_axis_stays_sorted_for_floats_and_integers() -> None:
    boundaries = np.array([[-7.9, -4.3, -2.4, 3.6], [-1.0, 0.0, 2.0, 2.5]], dtype=np.float32)
    assert properties(boundaries) == ("distinct", "sorted")
    for drawn in _draws(boundaries, (3, 6)):
        assert (np.diff(drawn, axis=-1) >= 0).all() and drawn.min() < 0  # sorted, still signed like the sample
    integers = np.array([2, 5, 9], dtype=np.int64)
    assert properties(integers) == ("distinct", "sorted")
    assert all((np.diff(d) >= 0).all() and d.min() >= 2 for d in _draws(integers))


def test_offsets_stay_non_decreasing_from_zero() -> None:
    offsets = np.array([0, 3, 4], dtype=np.int64)
    assert properties(offsets) == ("offsets",)
    for drawn in _draws(offsets, (5,)):
        assert drawn[0] == 0 and (np.diff(drawn) >= 0).all() and drawn.max() <= 4 and drawn.dtype == np.int64


def test_symmetric_positive_definite_matrices_stay_spd_and_scaled_like_the_sample() -> None:
    g = np.random.default_rng(1).standard_normal((2, 4, 4))
    sample = (g @ g.transpose(0, 2, 1) + 4 * np.eye(4)).astype(np.float32) * 10
    assert properties(sample) == ("spd",)
    for drawn in _draws(sample, (3, 4, 4), count=10):
        assert np.array_equal(drawn, drawn.transpose(0, 2, 1))
        assert np.linalg.eigvalsh(drawn.astype(np.float64)).min() > 0
        mean_diagonal = np.diagonal(drawn, axis1=-2, axis2=-1).mean()
        assert mean_diagonal == pytest.approx(np.diagonal(sample, axis1=-2, axis2=-1).mean(), rel=1e-5)
    not_definite = np.array([[1.0, -2.0], [-2.0, 1.0]], dtype=np.float32)  # symmetric, eigenvalues 3 and -1
    assert properties(not_definite) == ()  # its values repeat: not distinct either


def test_distinct_values_stay_distinct() -> None:
    """8,000 float32 normals hold ties (about 2 in 3 such draws), and sort/argsort indices then legitimately differ
    from PyTorch's; a sample without ties gets draws without ties, floats and integers."""
    sample = np.random.default_rng(2).standard_normal(8000).astype(np.float32)
    assert properties(sample) == ("distinct",)
    assert all(np.unique(d).size == 8000 for d in _draws(sample, count=5))
    ids = np.array([7, 2, 9, 4], dtype=np.int64)
    assert properties(ids) == ("distinct",)
    assert all(np.unique(d).size == 6 and d.min() >= 2 and d.max() <= 9 for d in _draws(ids, (6,)))


def test_masks_keep_their_pattern() -> None:
    mask = np.array([[1, 1, 0]], dtype=np.int64)
    assert properties(mask) == ("mask",)
    assert np.array_equal(draw_like(mask, (2, 4), np.random.default_rng(0)), [[1, 1, 0, 0], [1, 1, 0, 0]])


class _Cholesky(nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return torch.linalg.cholesky(a)


class _BinaryCrossEntropy(nn.Module):
    def forward(self, p: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.binary_cross_entropy(p, target, reduction="none")


class _Bucketize(nn.Module):
    def forward(self, x: torch.Tensor, boundaries: torch.Tensor) -> torch.Tensor:
        return torch.bucketize(x, boundaries)


class _EmbeddingBag(nn.Module):
    def forward(self, weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding_bag(indices, weight, offsets, mode="sum")


def _spd(n: int) -> torch.Tensor:
    g = torch.randn(n, n, generator=torch.Generator().manual_seed(0))
    return g @ g.T + n * torch.eye(n)


@pytest.mark.parametrize(
    ("model", "sample"),
    [
        (_Cholesky(), (_spd(3),)),
        (_BinaryCrossEntropy(), (torch.tensor([0.2, 0.7, 0.9, 0.4]), torch.tensor([0.0, 1.0, 1.0, 0.0]))),
        (_Bucketize(), (torch.tensor([[-3.0, 0.5], [1.5, 8.0]]), torch.tensor([-7.9, -4.3, -2.4, -1.7, 3.6]))),
        (
            _EmbeddingBag(),
            (torch.randn(10, 3), torch.tensor([5, 1, 6, 5, 6]), torch.tensor([0, 3], dtype=torch.int64)),
        ),
    ],
    ids=["cholesky-spd", "bce-unit-interval", "bucketize-sorted", "embedding-bag-offsets"],
)
def test_models_that_refused_plain_draws_validate_on_every_drawn_input(model: nn.Module, sample: tuple) -> None:
    """Before: PyTorch raised on the drawn inputs (not positive definite, outside [0, 1], offsets[0] != 0) or they
    were undefined (unsorted boundaries); now every drawn input is one the model takes, and none is dropped."""
    module = pipeline.convert(model.eval(), sample, backend="onnxruntime", validation_inputs=4)
    accuracy = module.report.accuracy
    assert accuracy is not None and accuracy.passed
    assert accuracy.inputs == 5 and accuracy.dropped == ()
