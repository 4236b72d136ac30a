"""More built-in converters for ops the torch exporter cannot translate: ``prims::view_of`` (what ``squeeze`` of
several dims leaves behind) and ``aten::_adaptive_avg_pool3d``."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import torch

from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry


class _SqueezeDims(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.squeeze(x, (1, 3))


@converter_case(lambda: _SqueezeDims(), inputs=[((5, 1, 4, 1), "float32")])
def convert_view_of(ctx: ConverterContext) -> gs.Tensor:
    """``prims::view_of``: a view of the whole tensor, i.e. the same values (``Identity``)."""
    return ctx.op.Identity(ctx.inputs[0])


class _AdaptiveAvgPool3d(torch.nn.Module):
    def __init__(self, size: tuple[int, int, int]) -> None:
        super().__init__()
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.adaptive_avg_pool3d(x, self.size)


def _averaging_matrix(size_in: int, size_out: int) -> np.ndarray:
    """(size_in, size_out): column j averages PyTorch's adaptive region j, [floor(j*in/out), ceil((j+1)*in/out))."""
    matrix = np.zeros((size_in, size_out), np.float64)
    for j in range(size_out):
        start, end = (j * size_in) // size_out, -(-((j + 1) * size_in) // size_out)
        matrix[start:end, j] = 1.0 / (end - start)
    return matrix


def _static_spatial(node: gs.Node, settings: object) -> bool:
    shape = node.inputs[0].shape
    return shape is not None and len(shape) in (4, 5) and all(isinstance(d, int) for d in shape[-3:])


@converter_case(lambda: _AdaptiveAvgPool3d((2, 3, 2)), inputs=[((2, 3, 5, 7, 4), "float32")])
@converter_case(
    lambda: _AdaptiveAvgPool3d((3, 2, 4)), inputs=[((2, 6, 5, 8), "float32")], dynamic={"x": {0: ("c", 1, 2, 4)}}
)
def convert_adaptive_avg_pool3d(ctx: ConverterContext) -> gs.Tensor:
    """``aten::_adaptive_avg_pool3d``: a box mean is separable, so one ``MatMul`` per spatial axis with that axis'
    averaging matrix (the last axis first; a ``Transpose`` brings each of the others last and back). Needs static
    spatial sizes; batch and channels may be dynamic."""
    x = ctx.inputs[0]
    shape = ctx.input_shapes[0] or ()
    rank = len(shape)
    dtype = ctx.input_dtypes[0] or np.float32
    out_sizes = [int(s) for s in ctx.attrs["output_size"]]
    for offset, axis in enumerate((rank - 1, rank - 2, rank - 3)):
        size_in, size_out = int(shape[axis]), out_sizes[2 - offset]
        matrix = ctx.constant(_averaging_matrix(size_in, size_out).astype(dtype))
        if axis == rank - 1:
            x = ctx.op.MatMul(x, matrix)
            continue
        perm = list(range(rank))
        perm[axis], perm[rank - 1] = rank - 1, axis
        x = ctx.op.Transpose(ctx.op.MatMul(ctx.op.Transpose(x, perm=perm), matrix), perm=perm)
    return x


def register_misc_converters(registry: ConverterRegistry) -> None:
    """Register ``prims::view_of`` and ``aten::_adaptive_avg_pool3d`` on ``registry``."""
    registry.register("prims::view_of.default")(convert_view_of)
    registry.register("aten::_adaptive_avg_pool3d.default", validator=_static_spatial)(convert_adaptive_avg_pool3d)
