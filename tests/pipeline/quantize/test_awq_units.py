"""AWQ's searches on small arrays (``pipeline.quantize.awq``), judged against brute-force references written from the
paper (Lin et al., MLSys 2024, sections 3.2 and 3.3) in float64: the scale search's ``s``, alpha and errors, the
clipping search's choice per block and output channel, what ``awq`` hands to the graph (the clipped weights in the
original scale, the shared ``s``, the errors it reports), and the calibration tokens it samples. No model and no
graph: each test takes milliseconds, so that mutation testing (docs/mutation.md) can run them per mutant.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from passes.quantize.blockwise import BLOCK_FORMATS, BlockFormat, fake_quantize
from pipeline.quantize.awq import (
    ALPHAS,
    CLIP_RATIOS,
    CLIP_TOKENS,
    MAX_TOKENS,
    AwqChoice,
    awq,
    clip_weights,
    sample_tokens,
    search_scales,
)

INT4, NVFP4 = BLOCK_FORMATS["int4"], BLOCK_FORMATS["nvfp4"]
BLOCK = 16


def outliers(tokens: int = 64, channels: int = 32, seed: int = 0) -> np.ndarray:
    """Activations ``[T, K]`` with a few input channels 30x larger than the rest (the case AWQ is for)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, channels)).astype(np.float32)
    x[:, [3, 17, 20]] *= 30.0
    return x


def weights(rows: int = 8, channels: int = 32, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, channels)).astype(np.float32)


def error64(x: np.ndarray, matrix: np.ndarray, approx: np.ndarray) -> float:
    """``|| x approx^T - x matrix^T ||^2`` in float64."""
    return float(np.sum((x.astype(np.float64) @ (approx.astype(np.float64) - matrix.astype(np.float64)).T) ** 2))


def reference_scales(x: np.ndarray, alpha: float) -> np.ndarray:
    """The paper's ``s = s_x ** alpha``, normalised by ``sqrt(max(s) * min(s))``; a dead channel's mean floored at
    1e-8 and every scale at 1e-4 (no division by zero in ``x / s``)."""
    mean = np.maximum(np.abs(x.astype(np.float64)).mean(axis=0), 1e-8)
    s = mean**alpha
    return np.maximum(s / np.sqrt(s.max() * s.min()), 1e-4).astype(np.float32)


def scaled_error(
    fmt: BlockFormat, x: np.ndarray, matrices: list[np.ndarray], s: np.ndarray, scale_type: type = np.float32
) -> float:
    """The search's objective: ``sum || Q(W diag(s)) (diag(s)^-1 x) - W x ||^2``, as the search computes its
    operands (float32 ``x / s`` and ``W s``)."""
    xs = (x / s[None, :]).astype(np.float32)
    return sum(error64(xs, m * s[None, :], fake_quantize(fmt, m * s[None, :], BLOCK, scale_type)) for m in matrices)


# -- the scale search ----------------------------------------------------------------------------------------------


def test_the_grids_are_the_papers() -> None:
    assert np.allclose(ALPHAS, np.arange(20) / 20, rtol=0, atol=1e-12) and np.allclose(
        CLIP_RATIOS, 1.0 - np.arange(11) / 20
    )
    assert (MAX_TOKENS, CLIP_TOKENS) == (1024, 512)


@pytest.mark.parametrize("fmt", [INT4, NVFP4], ids=["int4", "nvfp4"])
def test_the_scale_search_picks_the_alpha_of_least_output_error_on_the_grid(fmt: BlockFormat) -> None:
    x, matrices = outliers(), [weights(seed=1), weights(rows=4, seed=2)]
    s, alpha, plain, best = search_scales(fmt, x, matrices, BLOCK)
    errors = {float(a): scaled_error(fmt, x, matrices, reference_scales(x, float(a))) for a in ALPHAS}
    expected = min(errors, key=lambda a: errors[a])  # the first of equal errors, as the search keeps it
    assert alpha == expected and 0.0 < alpha < 1.0  # outlier channels: neither max scales nor the full mean
    assert s.dtype == np.float32 and np.allclose(s, reference_scales(x, alpha), rtol=1e-6, atol=0)
    assert plain == pytest.approx(errors[0.0], rel=1e-4) and best == pytest.approx(errors[alpha], rel=1e-4)
    assert plain == pytest.approx(scaled_error(fmt, x, matrices, np.ones(32, np.float32)), rel=1e-4)  # max scales
    assert best < 0.7 * plain  # activation-aware beats max scaling where activations have outliers


def test_scales_of_alpha_zero_are_one_and_the_search_never_does_worse_than_max() -> None:
    """Activations of equal magnitude in every channel: every alpha gives ``s = 1``, so max scaling (the first)
    is kept, with its own error as the best."""
    x = np.where(np.random.default_rng(3).standard_normal((40, 32)) > 0, 2.0, -2.0).astype(np.float32)
    s, alpha, plain, best = search_scales(INT4, x, [weights()], BLOCK)
    assert alpha == 0.0 and np.array_equal(s, np.ones(32, np.float32)) and best == plain > 0


def test_a_dead_input_channel_gets_a_small_finite_scale() -> None:
    x = outliers()
    x[:, 5] = 0.0  # a channel no calibration token uses
    s, alpha, _, best = search_scales(INT4, x, [weights()], BLOCK)
    assert np.all(np.isfinite(s)) and np.isfinite(best) and alpha > 0
    assert s[5] == pytest.approx(reference_scales(x, alpha)[5]) and s[5] == s.min()
    assert s.min() >= np.float32(1e-4)


def test_the_search_follows_the_float_type_of_the_block_scales() -> None:
    x, matrices = outliers(), [weights()]
    s32, _, _, best32 = search_scales(INT4, x, matrices, BLOCK)
    s16, alpha16, _, best16 = search_scales(INT4, x, matrices, BLOCK, np.float16)
    xs = (x / s16[None, :]).astype(np.float32)
    m = matrices[0] * s16[None, :]
    assert best16 == pytest.approx(error64(xs, m, fake_quantize(INT4, m, BLOCK, np.float16)), rel=1e-4)
    assert best16 != best32


# -- the clipping search -------------------------------------------------------------------------------------------


def reference_clip(fmt: BlockFormat, x: np.ndarray, matrix: np.ndarray, scale_type: type = np.float32) -> np.ndarray:
    """Per output channel and block, the clipping ratio of least ``sum_t (x_b . (Q(clip(w)) - w)_b)^2`` (every
    block clipped at one ratio, then quantized together: NVFP4's tensor scale follows the clipped amax); the first
    of equal errors kept."""
    size = fmt.block_size(BLOCK)
    rows, columns = matrix.shape
    chosen = matrix.copy()
    best = np.full((rows, columns // size), np.inf)
    for ratio in CLIP_RATIOS:
        clipped = matrix.copy()
        for b in range(columns // size):
            part = slice(b * size, (b + 1) * size)
            amax = np.abs(matrix[:, part]).max(axis=1, keepdims=True)
            clipped[:, part] = np.clip(matrix[:, part], -ratio * amax, ratio * amax)
        approx = fake_quantize(fmt, clipped, size, scale_type)
        for n in range(rows):
            for b in range(columns // size):
                part = slice(b * size, (b + 1) * size)
                delta = approx[n, part].astype(np.float64) - matrix[n, part]
                error = float(np.sum((x[:, part].astype(np.float64) @ delta) ** 2))
                if error < best[n, b] * (1 - 1e-9):
                    best[n, b], chosen[n, part] = error, clipped[n, part]
    return chosen


@pytest.mark.parametrize("fmt", [INT4, NVFP4], ids=["int4", "nvfp4"])
def test_clipping_keeps_per_block_and_channel_the_ratio_of_least_output_error(fmt: BlockFormat) -> None:
    x = outliers(tokens=48)
    matrix = weights(rows=6)
    matrix[2, 7] = 12.0  # an outlier weight: clipping its block pays off
    got = clip_weights(fmt, x, matrix, BLOCK)
    assert got.dtype == np.float32 and got.shape == matrix.shape
    assert np.allclose(got, reference_clip(fmt, x, matrix), rtol=1e-6, atol=1e-7)
    assert np.all(np.abs(got) <= np.abs(matrix)) and np.all(np.sign(got) * np.sign(matrix) >= 0)
    assert not np.array_equal(got, matrix)  # something was clipped
    for candidate_is_better in _block_errors(fmt, x, matrix, got) <= _block_errors(fmt, x, matrix, matrix) * (1 + 1e-6):
        assert candidate_is_better.all()  # never worse than no clipping, block by block


def _block_errors(fmt: BlockFormat, x: np.ndarray, matrix: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """``[N, blocks]``: each block's output error of ``candidate`` quantized, against ``matrix``."""
    delta = (fake_quantize(fmt, candidate, BLOCK) - matrix).astype(np.float64)
    blocks = matrix.shape[1] // 16
    return np.array(
        [
            [np.sum((x[:, b * 16 : (b + 1) * 16] @ delta[n, b * 16 : (b + 1) * 16]) ** 2) for b in range(blocks)]
            for n in range(matrix.shape[0])
        ]
    )


def test_a_block_no_token_reads_keeps_its_weights_unclipped() -> None:
    """Every ratio gives a block whose input channels are all zero the same output error (none): the first, 1.0, is
    kept, so the weights other inputs will meet there are not shrunk for nothing."""
    x = outliers(tokens=32)
    x[:, 16:] = 0.0
    matrix = weights(rows=4)
    got = clip_weights(INT4, x, matrix, BLOCK)
    assert np.array_equal(got[:, 16:], matrix[:, 16:])


def test_clipping_with_int4_blocks_wider_than_nvfp4s() -> None:
    x, matrix = outliers(channels=64), weights(rows=3, channels=64)
    matrix[1, 40] = -9.0
    got = clip_weights(INT4, x, matrix, 32)
    size = 32
    reference = matrix.copy()
    for n in range(3):
        for b in range(2):
            part = slice(b * size, (b + 1) * size)
            amax = np.abs(matrix[n, part]).max()
            errors = []
            for ratio in CLIP_RATIOS:
                clipped = matrix.copy()
                clipped[n, part] = np.clip(matrix[n, part], -ratio * amax, ratio * amax)
                delta = fake_quantize(INT4, clipped, size)[n, part].astype(np.float64) - matrix[n, part]
                errors.append(float(np.sum((x[:, part].astype(np.float64) @ delta) ** 2)))
            ratio = CLIP_RATIOS[int(np.argmin(errors))]
            reference[n, part] = np.clip(matrix[n, part], -ratio * amax, ratio * amax)
    assert np.allclose(got, reference, rtol=1e-6, atol=1e-7)


def test_small_weights_are_searched_with_the_graphs_float16_block_scales() -> None:
    """In a float16 graph the block scales are float16: for weights around 1e-4 their rounding moves the scale
    search to another alpha, and around 1e-5 the clipping search to other ratios; both follow the type asked for."""
    x = outliers(seed=0)
    small = weights(seed=1) * 1e-4
    _, alpha16, _, _ = search_scales(INT4, x, [small], BLOCK, np.float16)
    _, alpha32, _, _ = search_scales(INT4, x, [small], BLOCK)
    errors = {float(a): scaled_error(INT4, x, [small], reference_scales(x, float(a)), np.float16) for a in ALPHAS}
    assert alpha16 == min(errors, key=lambda a: errors[a]) and alpha16 != alpha32
    _, _, (choice,) = awq(INT4, {"x": ["n"]}, {"x": x}, {"n": small}, BLOCK, np.float16)
    assert choice.alpha == alpha16

    smaller = weights(seed=1) * 1e-5
    s, _, _, _ = search_scales(INT4, x, [smaller], BLOCK, np.float16)
    xs = (x / s[None, :]).astype(np.float32)
    expected = reference_clip(INT4, xs, smaller * s[None, :], np.float16)
    got = clip_weights(INT4, xs, smaller * s[None, :], BLOCK, np.float16)
    assert np.allclose(got, expected, rtol=1e-6, atol=0)
    assert not np.array_equal(got, clip_weights(INT4, xs, smaller * s[None, :], BLOCK))
    _, clipped, _ = awq(INT4, {"x": ["n"]}, {"x": x}, {"n": smaller}, BLOCK, np.float16)
    assert np.allclose(clipped["n"], expected / s[None, :], rtol=1e-6, atol=0)


# -- awq: what the graph receives ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("tokens", "step"), [(64, 1), (1100, 2)])
def test_awq_returns_clipped_weights_in_their_own_scale_and_one_s_per_group(tokens: int, step: int) -> None:
    x, y = outliers(tokens=tokens), outliers(tokens=tokens, seed=5)[:, ::-1].copy()
    matrices = {"q": weights(seed=1), "k": weights(rows=4, seed=2), "up": weights(seed=3)}
    matrices["q"][0, 3] = 10.0
    groups = {"x": ["q", "k"], "y": ["up"]}
    scales, clipped, choices = awq(INT4, groups, {"x": x, "y": y}, matrices, BLOCK)
    assert set(scales) == set(clipped) == {"q", "k", "up"}
    for activation, nodes in groups.items():
        a = {"x": x, "y": y}[activation]
        s, alpha, plain, _ = search_scales(INT4, a, [matrices[n] for n in nodes], BLOCK)
        xs = (a / s[None, :]).astype(np.float32)
        final = 0.0
        for node in nodes:
            assert np.array_equal(scales[node], s)  # one s for the layers reading one activation
            expected = clip_weights(INT4, xs[::step], matrices[node] * s[None, :], BLOCK) / s[None, :]
            assert np.allclose(clipped[node], expected, rtol=1e-6, atol=1e-7)
            # in the weight's own scale: the graph multiplies the activation by 1 / s and quantizes W s
            assert np.all(np.abs(clipped[node]) <= np.abs(matrices[node]) * (1 + 1e-6))
            assert np.allclose(clipped[node], matrices[node], atol=np.abs(matrices[node]).max() * 0.5)
            scaled = clipped[node] * s[None, :]
            final += error64(xs, matrices[node] * s[None, :], fake_quantize(INT4, scaled, BLOCK))
        choice = next(c for c in choices if c.activation == activation)
        assert choice == AwqChoice(activation, tuple(nodes), alpha, choice.error_max, choice.error_awq)
        assert choice.error_max == pytest.approx(plain, rel=1e-9)
        assert choice.error_awq == pytest.approx(final, rel=1e-4) and choice.error_awq < choice.error_max
    assert [c.activation for c in choices] == ["x", "y"]


def test_awq_says_what_it_chose_at_debug_level(caplog: pytest.LogCaptureFixture) -> None:
    x, matrix = outliers(), weights()
    with caplog.at_level(logging.DEBUG, logger="pipeline.quantize.awq"):
        _, _, (choice,) = awq(INT4, {"act": ["n"]}, {"act": x}, {"n": matrix}, BLOCK)
    lines = [r.getMessage() for r in caplog.records if r.name == "pipeline.quantize.awq"]
    assert lines == [
        f"awq act: alpha {choice.alpha:.2f}, output error {choice.error_max:.4g} -> {choice.error_awq:.4g}"
    ]


def test_awq_on_nvfp4_and_float16_scales() -> None:
    x, matrix = outliers(), weights()
    for fmt, scale_type in ((NVFP4, np.float32), (INT4, np.float16)):
        scales, clipped, (choice,) = awq(fmt, {"x": ["n"]}, {"x": x}, {"n": matrix}, BLOCK, scale_type)
        s, alpha, _, _ = search_scales(fmt, x, [matrix], BLOCK, scale_type)
        xs = (x / s[None, :]).astype(np.float32)
        expected = clip_weights(fmt, xs, matrix * s[None, :], BLOCK, scale_type) / s[None, :]
        assert choice.alpha == alpha and np.allclose(clipped["n"], expected, rtol=1e-6, atol=1e-7)
        approx = fake_quantize(fmt, clipped["n"] * s[None, :], BLOCK, scale_type)
        assert choice.error_awq == pytest.approx(error64(xs, matrix * s[None, :], approx), rel=1e-4)


# -- the calibration tokens ----------------------------------------------------------------------------------------


def test_up_to_max_tokens_rows_are_all_kept_in_order_as_float32() -> None:
    values = [np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4), np.full((4, 4), -1.0)]
    rows = sample_tokens(values)
    assert rows.dtype == np.float32 and rows.shape == (10, 4)
    assert np.array_equal(rows, np.concatenate([values[0].reshape(6, 4), values[1]]).astype(np.float32))
    exactly = [np.arange(MAX_TOKENS * 2, dtype=np.float32).reshape(MAX_TOKENS, 2)]
    assert np.array_equal(sample_tokens(exactly), exactly[0])


def test_more_rows_are_a_seeded_sample_without_repeats_in_their_order() -> None:
    values = [np.arange(600 * 3, dtype=np.float32).reshape(600, 3)] * 2  # 1200 rows, each twice
    values = [values[0], values[1] + 10_000]
    rows = sample_tokens(values)
    assert rows.shape == (MAX_TOKENS, 3)
    firsts = rows[:, 0]
    assert len(np.unique(firsts)) == MAX_TOKENS and np.all(np.diff(firsts) > 0)  # no repeats, in order
    assert np.array_equal(rows, sample_tokens(values, 0))  # the default seed is 0
    assert not np.array_equal(rows, sample_tokens(values, 1))
    every = np.concatenate(values)
    pick = np.sort(np.random.default_rng(7).choice(len(every), MAX_TOKENS, replace=False))
    assert np.array_equal(sample_tokens(values, 7), every[pick])
    one_more = [np.arange((MAX_TOKENS + 1) * 2, dtype=np.float32).reshape(MAX_TOKENS + 1, 2)]
    assert len(sample_tokens(one_more)) == MAX_TOKENS
