"""The exporter's optimizer removes ``x + 0``, ``x - 0``, ``x * 1``, ``x / 1`` only where the constant is exactly that.

onnxscript 0.7's no-op rules match their constant within ``math.isclose``'s tolerances, ``abs_tol=1e-8`` and
``rel_tol=1e-5``: ``variance + 1e-8`` is "``x + 0``" to it and loses its epsilon, so an RMSNorm with
``eps=1e-8`` (transformers' Helium) normalises by ``rsqrt(mean(x**2))``: the graph differs from PyTorch float32
by 100 times PyTorch's own float32 error (4.9e-5 on Helium's last hidden state, where float64 says 4e-7), and a
zero row is ``0 * inf = NaN`` where PyTorch gives 0. ``x * 1.000005`` would go too. Plain ``torch.onnx.export``
does the same.

:func:`exact_identity_constants` patches onnxscript's constant matcher for the duration of the ``with`` block (as
:mod:`pipeline.exporting.rewriter_guard` patches its multi-output matcher): a pattern constant of 0 or 1 (the
identity of an add or a product) matches only a constant that is exactly that. Every other constant pattern
(fusions matching 0.044715 or 1/sqrt(2), written in float32) keeps onnxscript's tolerances, and an exact ``x + 0``
is still removed. On an onnxscript without that method nothing is patched.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np

from pipeline.exporting.patching import SharedPatch


def _identity_value(pattern_constant: Any) -> float | None:
    """0 or 1 when the pattern constant is that identity (a scalar, or a list of one value), else None."""
    value = getattr(pattern_constant, "value", None)
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return float(value) if isinstance(value, int | float) and value in (0, 1) else None


def _wrap(original: Any) -> Any:
    def _match_constant(self: Any, pattern_constant: Any, value: Any) -> bool:
        matched = original(self, pattern_constant, value)
        identity = _identity_value(pattern_constant)
        if not matched or identity is None:
            return matched
        try:
            actual = np.asarray(value.const_value.numpy())
        except Exception:  # noqa: BLE001 -- the original matched it, so it has a value; if not, let it stand
            return matched
        if actual.size and not np.all(actual == identity):
            return self.fail(f"Constant {value.name} is close to {identity:g} but not exactly it: {actual.ravel()[:4]}")
        return matched

    return _match_constant


def _patch() -> SharedPatch | None:
    try:
        matcher = importlib.import_module("onnxscript.rewriter._matcher")
    except ImportError:
        return None
    cls = getattr(matcher, "SimplePatternMatcher", None)
    if cls is None or not callable(cls.__dict__.get("_match_constant")) or not callable(cls.__dict__.get("fail")):
        return None
    return SharedPatch(cls, "_match_constant", _wrap)


_PATCH = _patch()


@contextmanager
def exact_identity_constants() -> Iterator[None]:
    """Within the block, onnxscript's rules match a pattern constant of 0 or 1 only exactly (module doc)."""
    with _PATCH.held() if _PATCH is not None else nullcontext():
        yield
