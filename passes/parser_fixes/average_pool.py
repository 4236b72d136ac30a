"""An AveragePool whose window is larger than TensorRT's pooling layer takes, when one window covers the whole input:
a ``GlobalAveragePool`` (times a constant where the padding counts in the divisor).

``nn.AvgPool2d(kernel_size=hidden_dim, ceil_mode=True)`` is how transformers' EfficientNet pools its last feature
map (a 2,560 x 2,560 window over a 2 x 2 map): PyTorch and ONNX Runtime clamp the window to the padded input, so
the output is the plane's mean, but TensorRT's ``addPoolingNd`` refuses the window ("volume(windowSize) <
maxKernelDimsProduct"). The limit depends on the window's rank (:func:`max_window_volume`; measured on TensorRT-RTX
1.7): a 1-D or 2-D window must hold fewer than 100,000 elements (316 x 316 builds, 317 x 317 and a 1-D 100,000 do
not: the parser pools 1-D as 2-D), a 3-D window fewer than about 31.6 million, 100,000 ** 1.5 (300 x 300 x 351
builds, 300 x 300 x 352 does not), for MaxPool as for AveragePool.

When every spatial output size is 1 and the window, from its begin padding, reaches past the input's end on every
axis, the one window holds every input element. Its divisor (ONNX Runtime's and PyTorch's) is the product over
the axes of the input size (``count_include_pad=0``) or of ``min(kernel - pad_begin, size + pad_end) +
pad_begin`` (``count_include_pad=1``: the window clamped to the padded input). The rewrite is the plane's mean,
multiplied by ``prod(size) / divisor`` where the padding counts: the same sum and divisor, so exact up to float
rounding. Needs static spatial input dimensions; batch and channels may be dynamic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from passes.parser_fixes.values import dtype_of, rank_of
from passes.rules import Facts, RewriteContext, RewriteRule

_FLOAT_TYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
#: TensorRT's pooling layer takes 1-D and 2-D windows of fewer elements than this (module doc).
MAX_WINDOW_VOLUME = 100_000
#: ... and 3-D windows of fewer than this: 100,000 ** 1.5, rounded up (31,590,000 builds, 31,680,000 does not).
MAX_WINDOW_VOLUME_3D = 31_622_777


def max_window_volume(spatial_rank: int) -> int:
    """The pooling window volume TensorRT's ``addPoolingNd`` takes no more than (exclusive) for a window of
    ``spatial_rank`` axes."""
    return MAX_WINDOW_VOLUME_3D if spatial_rank >= 3 else MAX_WINDOW_VOLUME


@dataclass(frozen=True)
class GlobalPlan:
    """The mean over the spatial axes and the factor that turns it into the pool's average (1.0: none)."""

    dtype: np.dtype
    scale: float


class OversizedAveragePoolToGlobal(RewriteRule[GlobalPlan]):
    """``AveragePool`` with a window over TensorRT's limit that covers the whole input -> ``GlobalAveragePool``
    (times ``prod(size) / divisor`` where padding counts; module doc)."""

    name = "oversized_average_pool_to_global"
    ops = frozenset({"AveragePool"})

    def check(self, node: gs.Node, facts: Facts) -> GlobalPlan | str:
        """A plan when the window is over the limit and one window covers the whole static input; else the reason."""
        kernel = [int(k) for k in node.attrs.get("kernel_shape", [])]
        volume = int(np.prod(kernel)) if kernel else 0
        limit = max_window_volume(len(kernel))
        if volume < limit:
            return f"the window's {volume} elements are within TensorRT's limit ({limit} for a {len(kernel)}-D window)"
        x = node.inputs[0]
        dtype, rank = dtype_of(x), rank_of(x)
        if str(dtype) not in _FLOAT_TYPES:
            return f"{dtype} input: rewritten for floating-point types"
        if rank is None or rank != len(kernel) + 2 or x.shape is None:
            return "the input's rank is unknown"
        spatial = list(x.shape[2:])
        if not all(isinstance(d, int | np.integer) and d > 0 for d in spatial):
            return f"the input's spatial shape {spatial} is not static"
        auto_pad = node.attrs.get("auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
        if auto_pad not in ("NOTSET", "VALID"):
            return f"auto_pad {auto_pad}: a window over the limit with SAME padding is not rewritten"
        if any(int(d) != 1 for d in node.attrs.get("dilations", [])):
            return "a dilated window is not rewritten"
        n = len(kernel)
        pads = [0] * 2 * n if auto_pad == "VALID" else [int(p) for p in node.attrs.get("pads", [0] * 2 * n)]
        strides = [int(s) for s in node.attrs.get("strides", [1] * n)]
        ceil_mode = bool(node.attrs.get("ceil_mode", 0))
        sizes = [int(d) for d in spatial]
        for axis, (size, k, stride) in enumerate(zip(sizes, kernel, strides, strict=True)):
            begin, end = pads[axis], pads[n + axis]
            if k - begin < size:
                return f"the window does not cover the whole input on spatial axis {axis} (kernel {k}, size {size})"
            if _output_size(size, k, stride, begin, end, ceil_mode) != 1:
                return f"more than one window on spatial axis {axis}"
        divisor = float(np.prod(sizes))
        if int(node.attrs.get("count_include_pad", 0)):
            divisor = float(np.prod([min(k - pads[i], sizes[i] + pads[n + i]) + pads[i] for i, k in enumerate(kernel)]))
        assert dtype is not None
        return GlobalPlan(dtype, float(np.prod(sizes)) / divisor)

    def rewrite(self, plan: GlobalPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """``GlobalAveragePool(x)``, multiplied by the plan's factor when it is not 1."""
        op = ctx.typed(plan.dtype)
        mean = op.GlobalAveragePool(ctx.node.inputs[0])
        if plan.scale == 1.0:
            return [mean]
        return [op.Mul(mean, ctx.constant(np.array(plan.scale, plan.dtype), "padding_share"))]


def _output_size(size: int, kernel: int, stride: int, begin: int, end: int, ceil_mode: bool) -> int:
    """ONNX Runtime's (and PyTorch's) output size, ceil_mode's last window dropped when it starts in the end padding."""
    span = size + begin + end - kernel
    count = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (count - 1) * stride >= size + begin:
        count -= 1
    return count
