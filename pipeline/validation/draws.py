"""Validation inputs drawn like the sample, keeping the properties the model may require of them.

A model often accepts only some inputs: ``cholesky`` a symmetric positive-definite matrix, ``binary_cross_entropy``
probabilities, ``bucketize`` sorted boundaries, ``embedding_bag`` offsets that start at 0. A plain draw (a normal
with the sample's mean and spread) breaks all of these, and PyTorch refuses the input or computes something
undefined. So each property below is detected on the sample tensor itself and kept by its draws
(:func:`properties` lists them for a sample): ``mask``, ``offsets`` and ``spd`` stand alone; at most one of the
value properties (``unit_interval``, ``positive``, ``non_negative``) combines with ``distinct`` and ``sorted``:

==================  =========================================================  ==================================
property            detected when the sample is                                 draws
==================  =========================================================  ==================================
``mask``            bool, or integer holding only 0 and 1                       the sample's own pattern, cropped
                                                                                or edge-extended to the new shape
``offsets``         integer, at least 2 along its last axis, non-decreasing     sorted integers in the sample's
                    along it and starting at 0 there                            range, starting at 0
``spd``             float, trailing square matrices (n >= 2) that are           random SPD matrices (well
                    symmetric and positive definite (Cholesky succeeds)         conditioned) whose mean diagonal
                                                                                is the sample's
``unit_interval``   float, every value within [0, 1]                            in (0, 1): a normal in logit space
                                                                                with the sample's logit mean/spread
``positive``        float, every value > 0                                      log-normal with the sample's log
                                                                                mean and spread
``non_negative``    float, every value >= 0                                     |normal| with the sample's mean
                                                                                and spread
``distinct``        2 to 2**20 values, no two equal (float or integer)          no two equal: float values that
                                                                                collide after the cast are drawn
                                                                                again; integers drawn without
                                                                                replacement (when the range holds
                                                                                enough); combined with the above
``sorted``          at least 2 along its last axis, non-decreasing along it,    the draws sorted along the last
                    not constant (float or integer)                             axis (combined with the above)
==================  =========================================================  ==================================

Otherwise floats come from a normal with the sample's mean and spread and integers uniformly from its range.
A property the sample holds by chance is kept too: harmless, the draws are random all the same. Draws are
seeded (``settings.seed``), so validation is reproducible.
"""

from __future__ import annotations

import numpy as np

#: The properties a draw keeps, in the order they are tried and listed.
PROPERTIES: tuple[str, ...] = (
    "mask",
    "offsets",
    "spd",
    "unit_interval",
    "positive",
    "non_negative",
    "distinct",
    "sorted",
)

_LOGIT_CLIP = 1e-6  # a sample value of exactly 0 or 1 has an infinite logit: clip it for the fit only
# past a million values a float32 sample rarely is without ties, and finding them costs a sort of every draw
_DISTINCT_MAX_SIZE = 1 << 20
_DISTINCT_ROUNDS = 20  # redraws of colliding values (each round leaves a tiny fraction of the previous ties)


def properties(sample: np.ndarray) -> tuple[str, ...]:
    """The properties of :data:`PROPERTIES` that ``sample`` has and its draws keep.

    >>> properties(np.array([0.0, 0.25, 0.5]))
    ('unit_interval', 'distinct', 'sorted')
    >>> properties(np.array([0, 3, 5], dtype=np.int64))
    ('offsets',)
    """
    if not sample.size:
        return ()
    if sample.dtype == np.bool_ or (np.issubdtype(sample.dtype, np.integer) and _is_mask(sample)):
        return ("mask",)
    if np.issubdtype(sample.dtype, np.integer):
        if _is_sorted(sample) and bool((sample[..., 0] == 0).all()):
            return ("offsets",)
        found: tuple[str, ...] = ()
    elif not np.issubdtype(sample.dtype, np.floating):
        return ()
    elif _is_spd(sample):
        return ("spd",)
    else:
        value = _value_property(sample)
        found = (value,) if value else ()
    if 2 <= sample.size <= _DISTINCT_MAX_SIZE and np.unique(sample).size == sample.size:
        found = (*found, "distinct")
    return (*found, "sorted") if _is_sorted(sample) else found


def draw_like(
    sample: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator, kept: tuple[str, ...] | None = None
) -> np.ndarray:
    """A random array of ``shape`` and ``sample``'s dtype that keeps ``sample``'s :func:`properties` (``kept``,
    when they are known already: several draws of one sample detect them once).

    >>> rng = np.random.default_rng(0)
    >>> p = draw_like(np.array([0.2, 0.9], dtype=np.float32), (1000,), rng)
    >>> bool(((p > 0) & (p < 1)).all()), p.dtype
    (True, dtype('float32'))
    """
    # np.asarray: for a 0-d shape numpy hands back a scalar, which Polygraphy's runners cannot take
    return np.asarray(_draw(sample, shape, rng, properties(sample) if kept is None else kept))


def _draw(sample: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator, kept: tuple[str, ...]) -> np.ndarray:
    if "mask" in kept:
        return _resize_like(sample, shape)
    if "offsets" in kept:
        drawn = np.sort(_integers(sample, shape, rng), axis=-1)
        drawn[..., 0] = 0
        return drawn
    if "spd" in kept and len(shape) >= 2 and shape[-1] == shape[-2]:  # a dynamic dim may make it non-square
        return _spd(sample, shape, rng)
    size = int(np.prod(shape))
    if np.issubdtype(sample.dtype, np.integer):
        flat = _distinct_integers(sample, size, rng) if "distinct" in kept else _integers(sample, (size,), rng)
    else:
        flat = _floats(sample, kept, size, rng)
    drawn = flat.reshape(shape)
    if "sorted" in kept and drawn.ndim:
        drawn = np.sort(drawn, axis=-1)
    return drawn


def _floats(sample: np.ndarray, kept: tuple[str, ...], size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` floats in ``sample``'s dtype from the distribution its value property picks; with ``distinct``,
    values that collide after the cast to the dtype are drawn again (float32 normals collide: 8,000 draws hold a
    tie or two, and sort's indices then legitimately differ)."""
    values = sample.astype(np.float64)
    if "unit_interval" in kept:
        clipped = np.clip(values, _LOGIT_CLIP, 1 - _LOGIT_CLIP)
        logit = np.log(clipped) - np.log1p(-clipped)

        def draw(n: int) -> np.ndarray:
            return 1.0 / (1.0 + np.exp(-_normal(logit, (n,), rng)))
    elif "positive" in kept:

        def draw(n: int) -> np.ndarray:
            return np.exp(_normal(np.log(values), (n,), rng))
    elif "non_negative" in kept:

        def draw(n: int) -> np.ndarray:
            return np.abs(_normal(values, (n,), rng))
    else:

        def draw(n: int) -> np.ndarray:
            return _normal(values, (n,), rng)

    flat = draw(size).astype(sample.dtype)
    for _ in range(_DISTINCT_ROUNDS if "distinct" in kept else 0):
        repeated = _repeated(flat)
        if not repeated.size:
            break
        flat[repeated] = draw(repeated.size).astype(sample.dtype)
    return flat


def _repeated(flat: np.ndarray) -> np.ndarray:
    """Indices of the values of ``flat`` that repeat an earlier one."""
    _, first = np.unique(flat, return_index=True)
    keep = np.zeros(flat.size, dtype=bool)
    keep[first] = True
    return np.flatnonzero(~keep)


def _normal(values: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A normal with the mean and spread of ``values`` (spread 1 when they are constant)."""
    if not values.size:
        return rng.standard_normal(shape)
    return rng.standard_normal(shape) * (float(values.std()) or 1.0) + float(values.mean())


def _integers(sample: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    lo, hi = (int(sample.min()), int(sample.max())) if sample.size else (0, 1)
    return rng.integers(lo, hi + 1, size=shape).astype(sample.dtype)


def _distinct_integers(sample: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` distinct integers from the sample's range, when the range holds that many."""
    lo, hi = int(sample.min()), int(sample.max())
    if hi - lo + 1 < size:  # a larger (dynamic) shape than the range allows: ties cannot be avoided
        return _integers(sample, (size,), rng)
    if hi - lo < 2**31:
        return (rng.choice(hi - lo + 1, size, replace=False) + lo).astype(sample.dtype)
    # a range wider than numpy's choice takes (int64 edges): uniform draws, the rare repeats drawn again
    drawn = _integers(sample, (size,), rng)
    while True:
        _, first = np.unique(drawn, return_index=True)
        if len(first) == size:
            return drawn
        repeats = np.setdiff1d(np.arange(size), first)
        drawn[repeats] = _integers(sample, (len(repeats),), rng)


def _spd(sample: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Symmetric positive-definite matrices G G^T / n + I (eigenvalues in [1, ~5]: well conditioned), scaled so
    that their mean diagonal is the sample's."""
    n = shape[-1]
    g = rng.standard_normal(shape)
    spd = g @ np.swapaxes(g, -1, -2) / n + np.eye(n)
    scale = float(np.diagonal(sample.astype(np.float64), axis1=-2, axis2=-1).mean())
    spd *= scale / float(np.diagonal(spd, axis1=-2, axis2=-1).mean())
    return ((spd + np.swapaxes(spd, -1, -2)) / 2).astype(sample.dtype)


def _value_property(sample: np.ndarray) -> str | None:
    if not np.isfinite(sample).all():
        return None
    low, high = float(sample.min()), float(sample.max())
    if low >= 0 and high <= 1:
        return "unit_interval"
    if low > 0:
        return "positive"
    return "non_negative" if low >= 0 else None


def _is_sorted(sample: np.ndarray) -> bool:
    if sample.ndim == 0 or sample.shape[-1] < 2:
        return False
    steps = np.diff(sample, axis=-1)
    return bool((steps >= 0).all() and (steps > 0).any())


def _is_spd(sample: np.ndarray) -> bool:
    if sample.ndim < 2 or sample.shape[-1] != sample.shape[-2] or sample.shape[-1] < 2:
        return False
    matrices = sample.astype(np.float64)
    if not np.isfinite(matrices).all():
        return False
    scale = float(np.abs(matrices).max()) or 1.0
    if not np.allclose(matrices, np.swapaxes(matrices, -1, -2), rtol=1e-5, atol=1e-6 * scale):
        return False
    try:
        np.linalg.cholesky(matrices)
    except np.linalg.LinAlgError:
        return False
    return True


def _is_mask(sample: np.ndarray) -> bool:
    return bool(np.isin(sample, (0, 1)).all())


def _resize_like(sample: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The sample cropped or extended (repeating its last entry along each axis) to ``shape``."""
    if sample.ndim == 0:  # nothing to resize (np.pad refuses the empty pad list of a 0-d array)
        return sample.copy()
    grown = np.pad(sample, [(0, max(0, new - old)) for old, new in zip(sample.shape, shape, strict=True)], mode="edge")
    return np.asarray(grown[tuple(slice(0, n) for n in shape)], order="C")
