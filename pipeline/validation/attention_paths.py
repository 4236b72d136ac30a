"""Why a transformers model can fail validation with a graph that computes it right: PyTorch's ``sdpa`` attention
path skips the causal mask.

Under ``attn_implementation="sdpa"`` (transformers' default), ``create_causal_mask`` returns no mask when nothing is
padded and leaves causality to the attention module's ``is_causal`` (``masking_utils._ignore_causal_mask_sdpa``).
It never skips while the model is traced, so the exported graph always holds the causal mask. A model whose
attention modules say ``is_causal=False`` while building a causal mask (AIMv2's text tower) then attends
bidirectionally in PyTorch on an unpadded input and causally on a padded one, and the graph causally on both. The
model's ``"eager"`` attention always applies the mask it builds.

:func:`skipped_causal_mask` tells that case apart when validation fails: PyTorch's ``"eager"`` attention run on the
failing input disagrees with its ``"sdpa"`` one and agrees with the converted graph: within 1e-3, or (a float16
graph, which is never that close) ten times closer to ``"eager"`` than ``"sdpa"`` is, on every output that failed.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

#: The words the cause starts with (the model suite classifies the case by them).
SDPA_DISAGREES = "PyTorch's own 'sdpa' and 'eager' attention disagree on this model"
#: How close the graph must be to PyTorch's "eager" attention (per element, atol and rtol) to name this cause.
_AGREES = (1e-3, 1e-3)
#: Or how many times closer to "eager" than "sdpa" is (largest absolute difference), for a reduced-precision graph.
_CLOSER = 10.0


def _sdpa_model(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == "sdpa" and hasattr(model, "set_attn_implementation")


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or not np.issubdtype(a.dtype, np.floating):
        return bool(a.shape == b.shape and np.array_equal(a, b))
    atol, rtol = _AGREES
    return bool(np.allclose(a.astype(np.float64), b.astype(np.float64), atol=atol, rtol=rtol, equal_nan=True))


def _farthest(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or not np.issubdtype(a.dtype, np.floating) or a.size == 0:
        return 0.0 if a.shape == b.shape and np.array_equal(a, b) else float("inf")
    return float(np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def skipped_causal_mask(
    model: torch.nn.Module, call: Any, feed: Any, actual: dict[str, Any], failed: frozenset[str] | None = None
) -> str | None:
    """The cause (for the AccuracyError) when ``model`` is a transformers model on ``"sdpa"`` attention whose
    ``"eager"`` attention gives other outputs on ``feed`` and the backend's ``actual`` outputs agree with those;
    else None. ``failed`` names the outputs validation failed (all of them when None): each of those must differ
    between the two paths and be far closer to ``"eager"``; the others must agree with it within 1e-3 or have
    passed. ``call(feed)`` runs the model (the validation's PyTorch runner); the attention implementation is put
    back whatever happens."""
    if not _sdpa_model(model) or not feed or not actual:
        return None
    try:
        sdpa = call(feed)
        switch: Any = model.set_attn_implementation
        switch("eager")
        try:
            eager = call(feed)
        finally:
            switch("sdpa")
    except Exception as exc:  # noqa: BLE001 - a diagnosis only: the AccuracyError is raised either way
        logger.debug("the eager-attention check did not run: %s: %s", type(exc).__name__, exc)
        return None
    names = [n for n in actual if n in sdpa and n in eager]
    differs = [n for n in names if not _close(sdpa[n], eager[n])]
    failing = set(names) if failed is None else set(names) & failed

    def agrees(name: str) -> bool:
        if _close(actual[name], eager[name]):
            return True
        if name not in failing:
            return True  # validation passed it: within the precision's tolerance
        return name in differs and _farthest(actual[name], eager[name]) * _CLOSER <= _farthest(sdpa[name], eager[name])

    if not differs or not all(agrees(n) for n in names):
        return None
    return (
        f"{SDPA_DISAGREES} ({', '.join(differs)}) and the converted graph matches 'eager': transformers skips "
        "the causal mask under 'sdpa' when nothing is padded and leaves "
        "causality to attention modules that say is_causal=False, while the exported graph applies the mask"
    )
