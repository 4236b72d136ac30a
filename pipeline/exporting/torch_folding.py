"""The exporter's optimizer folds a float computation of constants with PyTorch's kernels, not numpy's.

``torch.onnx.export`` optimizes with onnxscript, whose constant folding evaluates a node of constant inputs with ONNX's
reference implementation (numpy). numpy's float32 transcendental functions are not PyTorch's: ``exp(1.0)`` is
2.7182819843 in numpy (0.65 ulp from e) and 2.7182817459 in PyTorch (correctly rounded). A value the model computes from
its parameters at run time (Mistral Large 4's rotary frequencies ``inv_freq * alpha.exp()``) is then held as a constant
1-2 ulps from what PyTorch computes; multiplied by positions it puts the converted rotary keys at 2.2x PyTorch's own
float32 error (the fp32 rule allows 2x). Within :func:`torch_constant_folding` the elementwise float ops of
:data:`TORCH_KERNELS` are folded with PyTorch's kernel on the same inputs, so the constant is the model's own value;
every other op keeps onnxscript's evaluation. On an onnxscript without that evaluator nothing is patched. The
evaluator's method is replaced while any export holds the block (:class:`~pipeline.exporting.patching.SharedPatch`:
exports may run in threads).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch

from pipeline.exporting.patching import SharedPatch

#: Elementwise ONNX ops (no attributes) folded with PyTorch's kernel when every input is a float array.
TORCH_KERNELS: dict[str, Callable[..., torch.Tensor]] = {
    "Exp": torch.exp,
    "Log": torch.log,
    "Sqrt": torch.sqrt,
    "Reciprocal": torch.reciprocal,
    "Sin": torch.sin,
    "Cos": torch.cos,
    "Tan": torch.tan,
    "Tanh": torch.tanh,
    "Atan": torch.atan,
    "Erf": torch.erf,
    "Sigmoid": torch.sigmoid,
    "Pow": torch.pow,
    "Div": torch.div,
}

_FLOATS = (np.float16, np.float32, np.float64)


def _wrap(original: Any) -> Any:
    def evaluate(self: Any, domain: str, op: str, version: int, *args: Any, **kwargs: Any) -> Any:
        kernel = TORCH_KERNELS.get(op) if domain in ("", "ai.onnx") and not kwargs else None
        if kernel is None or not args or not all(isinstance(a, np.ndarray) and a.dtype in _FLOATS for a in args):
            return original(self, domain, op, version, *args, **kwargs)
        try:
            with torch.no_grad():
                value = kernel(*(torch.from_numpy(np.ascontiguousarray(a)) for a in args)).numpy()
        except (RuntimeError, TypeError):  # no PyTorch kernel for these types: onnxscript's evaluation
            return original(self, domain, op, version, *args, **kwargs)
        return value.astype(args[0].dtype, copy=False)  # ONNX's Pow keeps its base's type

    return evaluate


def _patch() -> SharedPatch | None:
    try:
        folding = importlib.import_module("onnxscript.optimizer._constant_folding")
    except ImportError:
        return None
    cls = getattr(folding, "ReferenceEvaluator", None)
    if cls is None or not callable(cls.__dict__.get("evaluate")):
        return None
    return SharedPatch(cls, "evaluate", _wrap)


_PATCH = _patch()


@contextmanager
def torch_constant_folding() -> Iterator[None]:
    """Within the block, onnxscript folds the ops of :data:`TORCH_KERNELS` with PyTorch (module doc)."""
    with _PATCH.held() if _PATCH is not None else nullcontext():
        yield
