"""Activation-aware weight quantization (``calibration_method="awq"``) for the 4-bit formats.

The method followed is AWQ: Lin, Tang, Tang, Yang, Chen, Wang, Xiao, Dang, Gan and Han, "AWQ: Activation-aware
Weight Quantization for LLM Compression and Acceleration", MLSys 2024 (arXiv:2306.00978), sections 3.2 and 3.3:

1. **Scales.** A few input channels of a linear layer carry large activations; their weights matter most. Scaling
   those weight rows up by ``s`` (and the activation down by ``1 / s``) keeps the float product and shrinks their
   relative rounding error. With ``s_x`` the mean ``|x|`` of each input channel over the calibration tokens, the
   paper searches ``s = s_x ** alpha`` over a grid of ``alpha`` in ``[0, 1]`` (20 points), normalised by
   ``sqrt(max(s) * min(s))`` as its reference implementation does, and keeps the ``alpha`` that minimises the
   output error ``|| Q(W diag(s)) (diag(s)^-1 x) - W x ||^2`` on the calibration activations. The layers that read
   one activation tensor (query, key and value projections) share one ``s``, searched on their summed error.
   ``alpha = 0`` is ``s = 1``, plain max scaling: the search never does worse than it on the calibration data.
2. **Clipping.** Then each block's range is shrunk to the ratio (1.0 down to 0.5, 11 steps) that minimises that
   block's contribution to the output error (the paper's weight-clipping search), per output channel.

The scales travel into the graph as a ``Mul`` by ``1 / s`` before the layers (:mod:`passes.quantize.weight_only`).
Both searches run in numpy on at most :data:`MAX_TOKENS` calibration tokens per activation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from passes.quantize.blockwise import BlockFormat, fake_quantize

logger = logging.getLogger(__name__)

#: The alpha grid of the scale search (the paper's 20 points).
ALPHAS = np.linspace(0.0, 1.0, 20, endpoint=False)
#: The clipping ratios tried per block (the paper's reference implementation: 1.0 down to 0.5).
CLIP_RATIOS = np.linspace(1.0, 0.5, 11)
#: Calibration tokens (rows of activations) the scale search uses per activation tensor, and the clipping search
#: (the reference implementation's ``n_sample_token`` for clipping is 512).
MAX_TOKENS = 1024
CLIP_TOKENS = 512


@dataclass(frozen=True)
class AwqChoice:
    """What the search chose for the layers reading one activation tensor."""

    activation: str
    nodes: tuple[str, ...]
    alpha: float
    error_max: float  # output error with plain max scales (alpha 0, no clipping), summed over the layers
    error_awq: float  # output error with the chosen scales and clipping


def _fake(fmt: BlockFormat, matrix: np.ndarray, block: int, scale_type: type) -> np.ndarray:
    return fake_quantize(fmt, matrix, fmt.block_size(block), scale_type)


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in float32 through PyTorch: numpy's OpenBLAS threads collapse on thin products (``[T, 16] @ [16,
    N]`` per NVFP4 block: 30x slower than one thread, measured, on a loaded 2-core machine)."""
    return torch.matmul(torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(np.ascontiguousarray(b))).numpy()


def _output_error(x: np.ndarray, matrix: np.ndarray, approx: np.ndarray) -> float:
    """``|| x approx^T - x matrix^T ||^2`` for ``[N, K]`` matrices and ``x [T, K]``."""
    return float(np.sum(_matmul(x, (approx - matrix).T).astype(np.float64) ** 2))


def search_scales(
    fmt: BlockFormat,
    x: np.ndarray,
    matrices: Sequence[np.ndarray],
    block: int,
    scale_type: type = np.float32,
) -> tuple[np.ndarray, float, float, float]:
    """AWQ's scale search for the ``[N, K]`` matrices that read the activations ``x [T, K]``: ``s``, its alpha, and
    the summed output error with max scales and with ``s``."""
    mean = np.abs(x).mean(axis=0).astype(np.float64)
    mean = np.maximum(mean, 1e-8)
    best: tuple[float, np.ndarray, float] | None = None
    plain = 0.0
    for alpha in ALPHAS:
        s = mean**alpha
        s = s / np.sqrt(s.max() * s.min())
        s = np.maximum(s, 1e-4).astype(np.float32)
        scaled_x = (x / s[None, :]).astype(np.float32)
        error = sum(
            _output_error(scaled_x, m * s[None, :], _fake(fmt, m * s[None, :], block, scale_type)) for m in matrices
        )
        if alpha == 0.0:
            plain = error
        if best is None or error < best[2]:
            best = (float(alpha), s, error)
    assert best is not None
    return best[1], best[0], plain, best[2]


def clip_weights(
    fmt: BlockFormat, x: np.ndarray, matrix: np.ndarray, block: int, scale_type: type = np.float32
) -> np.ndarray:
    """``matrix [N, K]`` with each block's range clipped to the ratio of :data:`CLIP_RATIOS` that minimises the
    block's output error on ``x [T, K]`` (per output channel); NVFP4's fixed blocks of 16 are searched alike."""
    size = fmt.block_size(block)
    rows, columns = matrix.shape
    blocks = columns // size
    grouped = matrix.reshape(rows, blocks, size)
    amax = np.abs(grouped).max(axis=2, keepdims=True)
    best_error = np.full((rows, blocks), np.inf)
    chosen = grouped.copy()
    xb = np.ascontiguousarray(x.reshape(x.shape[0], blocks, size).transpose(1, 0, 2))  # [blocks, T, size]
    for ratio in CLIP_RATIOS:
        clipped = np.clip(grouped, -ratio * amax, ratio * amax)
        approx = _fake(fmt, clipped.reshape(rows, columns), block, scale_type).reshape(rows, blocks, size)
        delta = approx - grouped
        # per block b and row n: sum over tokens of (x_b . delta_{n,b})^2 (a batched BLAS product)
        products = _matmul(xb, delta.transpose(1, 2, 0))  # [blocks, T, N]
        error = np.einsum("btn,btn->nb", products, products)
        better = error < best_error
        best_error = np.where(better, error, best_error)
        chosen = np.where(better[:, :, None], clipped, chosen)
    return chosen.reshape(rows, columns).astype(np.float32)


def awq(
    fmt: BlockFormat,
    groups: Mapping[str, Sequence[str]],
    activations: Mapping[str, np.ndarray],
    matrices: Mapping[str, np.ndarray],
    block: int,
    scale_type: type = np.float32,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[AwqChoice]]:
    """The AWQ search over every group (activation tensor -> the nodes that read it): node -> ``s``, node -> its
    clipped ``[N, K]`` matrix (before scaling by ``s``), and what was chosen per group."""
    scales: dict[str, np.ndarray] = {}
    clipped: dict[str, np.ndarray] = {}
    choices = []
    for activation, nodes in groups.items():
        x = activations[activation]
        s, alpha, plain, _ = search_scales(fmt, x, [matrices[n] for n in nodes], block, scale_type)
        scaled_x = (x / s[None, :]).astype(np.float32)
        final = 0.0
        for node in nodes:
            scaled = clip_weights(
                fmt, scaled_x[:: max(1, len(x) // CLIP_TOKENS)], matrices[node] * s[None, :], block, scale_type
            )
            clipped[node] = scaled / s[None, :]
            scales[node] = s
            final += _output_error(scaled_x, matrices[node] * s[None, :], _fake(fmt, scaled, block, scale_type))
        choices.append(AwqChoice(activation, tuple(nodes), alpha, plain, final))
        logger.debug("awq %s: alpha %.2f, output error %.4g -> %.4g", activation, alpha, plain, final)
    return scales, clipped, choices


def sample_tokens(values: Sequence[np.ndarray], seed: int = 0) -> np.ndarray:
    """At most :data:`MAX_TOKENS` rows ``[T, K]`` of the observed activations (every axis but the last flattened)."""
    rows = np.concatenate([np.asarray(v, np.float32).reshape(-1, np.shape(v)[-1]) for v in values])
    if len(rows) <= MAX_TOKENS:
        return rows
    pick = np.random.default_rng(seed).choice(len(rows), MAX_TOKENS, replace=False)
    return rows[np.sort(pick)]
