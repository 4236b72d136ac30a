"""Antialiased resizing (``F.interpolate(..., antialias=True)``, bilinear and bicubic) as two MatMuls TensorRT builds.

The exporter writes ``aten::_upsample_bilinear2d_aa`` / ``_upsample_bicubic2d_aa`` as an ONNX ``Resize`` with
``antialias=1``, which TensorRT's parser rejects ("Antialiasing is not supported currently"). The resampling is
separable and linear: ``out = W_h @ x @ W_w^T`` with one constant ``[out, in]`` weight matrix per axis, computed here
as PyTorch's antialias kernel computes them (``aten/src/ATen/native/UpSample.h``, ``_compute_weights_aa``; the
formula, not its code): with ``scale`` = input / output size (``1 / scale_factor`` when the call passed one;
``(in - 1) / (out - 1)`` with ``align_corners``), the filter (triangle for bilinear; Keys' cubic with ``a = -0.5``
for bicubic) stretched by ``max(scale, 1)`` over a support of ``interp_size / 2 * max(scale, 1)`` input pixels around
the center ``scale * (i + 0.5)``, the window cut to the input and its weights normalised to sum to 1. Computed in
float64 (PyTorch's float64 kernel gives the same weights to 1e-12) and stored in the input's type: the same sums as
PyTorch's up to float rounding. The exporter's translation is also wrong with ``align_corners=True``: ONNX's
``align_corners`` Resize centers the windows elsewhere (0.5 off on a 15 x 12 -> 6 x 5 image); the MatMuls are not.

An axis whose size does not change has identity weights and no MatMul. Static spatial input sizes are needed for
the constants (batch and channels may be dynamic); with a dynamic height or width the converter writes the
exporter's own ``Resize`` (ONNX Runtime runs it; TensorRT's parser rejects it and the check says so).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx_graphsurgeon as gs
import torch
import torch.nn.functional as F

from converters.cases import converter_case
from converters.context import ConverterContext
from converters.errors import ConversionError
from converters.registry import ConverterRegistry

#: Keys' cubic convolution coefficient of PyTorch's antialiased bicubic filter (PIL's choice).
CUBIC_A = -0.5


def _triangle(x: float) -> float:
    x = abs(x)
    return 1.0 - x if x < 1.0 else 0.0


def _keys_cubic(x: float) -> float:
    x, a = abs(x), CUBIC_A
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    if x < 2.0:
        return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    return 0.0


#: mode -> (interpolation size: the filter's support in input pixels at scale 1, the filter)
FILTERS: dict[str, tuple[int, Callable[[float], float]]] = {"bilinear": (2, _triangle), "bicubic": (4, _keys_cubic)}


def antialias_weights(
    in_size: int, out_size: int, mode: str, *, align_corners: bool = False, scale_factor: float | None = None
) -> np.ndarray:
    """``[out_size, in_size]`` float64 weights of PyTorch's antialiased resize along one axis (module doc):
    ``out = weights @ x`` along that axis. ``scale_factor`` is the factor the call passed (None: from the sizes)."""
    interp_size, filter_fn = FILTERS[mode]
    if align_corners:
        scale = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    else:
        scale = 1.0 / scale_factor if scale_factor is not None and scale_factor > 0 else in_size / out_size
    stretch = max(scale, 1.0)
    support = interp_size / 2 * stretch
    weights = np.zeros((out_size, in_size), np.float64)
    for i in range(out_size):
        center = scale * (i + 0.5)
        low = max(math.trunc(center - support + 0.5), 0)  # C's truncating cast, as PyTorch computes the window
        high = min(math.trunc(center + support + 0.5), in_size)
        row = np.array([filter_fn((j - center + 0.5) / stretch) for j in range(low, high)], np.float64)
        total = row.sum()
        weights[i, low:high] = row / total if total != 0.0 else row
    return weights


def _mode(ctx: ConverterContext) -> str:
    return "bicubic" if "bicubic" in ctx.key.op_type else "bilinear"


def _scale_factors(ctx: ConverterContext) -> list[float | None]:
    """The factor the call passed per spatial axis (``scale_factors`` of the ``.vec`` overload; None: sizes given)."""
    factors = ctx.attrs.get("scale_factors")
    return [float(f) for f in factors] if factors else [None, None]


def _output_sizes(ctx: ConverterContext, sizes: list[int], factors: list[float | None]) -> list[int]:
    declared = list(ctx.node.outputs[0].shape or ())[-2:]
    if len(declared) == 2 and all(isinstance(d, int) for d in declared):
        return [int(d) for d in declared]
    given = ctx.attrs.get("output_size")
    if given:
        return [int(s) for s in given]
    if any(f is None for f in factors):
        raise ConversionError(f"{ctx.key} has neither an output size nor scale factors", node=ctx.name,
                              fix="call F.interpolate with size= or scale_factor=")  # fmt: skip
    return [int(math.floor(s * float(f))) for s, f in zip(sizes, factors, strict=True)]  # type: ignore[arg-type]


def _exporters_resize(ctx: ConverterContext, factors: list[float | None]) -> gs.Tensor:
    """The ``Resize(antialias=1)`` the exporter writes, for a dynamic height or width (no constant weights)."""
    x = ctx.inputs[0]
    attrs = {
        "mode": "cubic" if _mode(ctx) == "bicubic" else "linear",
        "antialias": 1,
        "exclude_outside": 1,
        "cubic_coeff_a": CUBIC_A,
        "coordinate_transformation_mode": "align_corners" if ctx.attrs.get("align_corners") else "half_pixel",
    }
    given = ctx.attrs.get("output_size")
    if given:
        leading = ctx.op.Shape(x, start=0, end=2)
        sizes = ctx.op.Concat(leading, ctx.constant(np.array([int(s) for s in given], np.int64)), axis=0)
        return ctx.op.Resize(x, None, None, sizes, **attrs)
    scales = np.array([1.0, 1.0, *(float(f) for f in factors)], np.float32)  # type: ignore[arg-type]
    return ctx.op.Resize(x, None, ctx.constant(scales), **attrs)


class _Interpolate(torch.nn.Module):
    def __init__(self, **options: object) -> None:
        super().__init__()
        self.options = options

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, antialias=True, **self.options)  # type: ignore[arg-type]


def antialiased_resize(ctx: ConverterContext) -> gs.Tensor:
    """``aten::_upsample_bilinear2d_aa`` / ``_upsample_bicubic2d_aa``: the width's weights then the height's, as
    MatMuls with constant matrices (module doc); the exporter's Resize when the height or width is dynamic."""
    x = ctx.inputs[0]
    shape = list(ctx.input_shapes[0] or ())
    factors = _scale_factors(ctx)
    sizes = shape[-2:]
    if len(shape) != 4 or not all(isinstance(s, int) for s in sizes):
        return _exporters_resize(ctx, factors)
    in_sizes = [int(s) for s in sizes]
    out_sizes = _output_sizes(ctx, in_sizes, factors)
    dtype = ctx.input_dtypes[0] or np.dtype(np.float32)
    align = bool(ctx.attrs.get("align_corners"))
    height, width = (
        antialias_weights(n_in, n_out, _mode(ctx), align_corners=align, scale_factor=f)
        for n_in, n_out, f in zip(in_sizes, out_sizes, factors, strict=True)
    )
    out = x
    if not _is_identity(width):
        out = ctx.op.MatMul(out, ctx.constant(width.T.astype(dtype), "width_weights"))  # [..., H, W] -> [..., H, W']
    if not _is_identity(height):
        out = ctx.op.MatMul(ctx.constant(height.astype(dtype), "height_weights"), out)  # [H', H] x [..., H, W']
    return out if out is not x else ctx.op.Identity(x)


@converter_case(
    lambda: _Interpolate(size=(6, 5), mode="bilinear", align_corners=True),  # the exporter's Resize is 0.5 off here
    inputs=[((2, 3, 15, 12), "float32")],
    dynamic={"x": {0: ("batch", 1, 2, 4)}},
)
def convert_bilinear_antialiased(ctx: ConverterContext) -> gs.Tensor:
    """``aten::_upsample_bilinear2d_aa.vec``: :func:`antialiased_resize`."""
    return antialiased_resize(ctx)


@converter_case(
    lambda: _Interpolate(scale_factor=0.3, mode="bicubic"),
    inputs=[((2, 3, 17, 11), "float32")],
    dynamic={"x": {0: ("batch", 1, 2, 4)}},
)
def convert_bicubic_antialiased(ctx: ConverterContext) -> gs.Tensor:
    """``aten::_upsample_bicubic2d_aa.vec``: :func:`antialiased_resize`."""
    return antialiased_resize(ctx)


def _is_identity(weights: np.ndarray) -> bool:
    return weights.shape[0] == weights.shape[1] and bool(np.array_equal(weights, np.eye(weights.shape[0])))


def register_antialias_converters(registry: ConverterRegistry) -> None:
    """Register the antialiased resize converters: the ``.vec`` overloads ``F.interpolate`` calls (a direct call of
    the ``.default`` overload keeps the exporter's Resize)."""
    registry.register("aten::_upsample_bilinear2d_aa.vec")(convert_bilinear_antialiased)
    registry.register("aten::_upsample_bicubic2d_aa.vec")(convert_bicubic_antialiased)
