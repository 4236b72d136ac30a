"""Built-in converters for ATen ops whose output size is static although it depends on which values are set:
``nonzero_static`` (a fixed number of rows, padded with ``fill_value``).

TensorRT-RTX has no importer for ONNX ``NonZero``; with a static output size none is needed: a cumulative sum over
the flattened mask gives each set element its output row, and one ``ScatterND`` writes the coordinates there.
``register_static_converters`` is the one list of them.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch

from converters.aten.numeric.linalg_steps import axes, const
from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry
from converters.settings import Settings


def static_nonzero(node: gs.Node, settings: Settings) -> bool:
    """``nonzero_static`` of an input whose shape is fully static (the coordinate table is built from it)."""
    shape = node.inputs[0].shape
    return shape is not None and all(isinstance(d, int) for d in shape)


class _NonzeroStatic(torch.nn.Module):
    def __init__(self, size: int, fill_value: int = -1) -> None:
        super().__init__()
        self.size, self.fill_value = size, fill_value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # relu: about half the entries are zero, so rows are skipped and (for large sizes) padded
        return torch.nonzero_static(torch.relu(x), size=self.size, fill_value=self.fill_value)


@converter_case(lambda: _NonzeroStatic(5), inputs=[((4, 3), "float32")])
@converter_case(lambda: _NonzeroStatic(20, fill_value=7), inputs=[((2, 3, 4), "float32")])
@converter_case(lambda: _NonzeroStatic(3), inputs=[((6,), "float32")])
def convert_nonzero_static(ctx: ConverterContext) -> gs.Tensor:
    """``aten::nonzero_static``: the coordinates of the first ``size`` non-zero elements (row-major order), as a
    ``(size, rank)`` int64 tensor whose unused rows hold ``fill_value``.

    Exact: element ``i`` set goes to row ``cumsum(mask)[i] - 1``; elements not set, or beyond ``size``, go to a
    spare row ``size`` that is sliced off. Coordinates come from a table computed at conversion time.
    """
    shape = tuple(int(d) for d in ctx.input_shapes[0] or ())
    size, fill = int(ctx.attrs["size"]), int(ctx.attrs.get("fill_value", -1))
    count = int(np.prod(shape))
    if size == 0 or not shape or count == 0:  # nothing to compute: an empty result, or all rows padding
        return _rows_without_input(ctx, ctx.inputs[0], size, len(shape), fill)
    flat = ctx.op.Reshape(ctx.inputs[0], const(ctx, np.array([-1], np.int64), "flat"))
    dtype = ctx.input_dtypes[0]
    if dtype is not None and np.dtype(dtype) == np.bool_:
        mask = flat
    else:
        mask = ctx.op.Not(ctx.op.Equal(flat, ctx.op.CastLike(const(ctx, np.array(0, np.int32), "zero"), flat)))
    rows = ctx.op.Sub(
        ctx.op.CumSum(ctx.op.Cast(mask, to=onnx.TensorProto.INT32), const(ctx, np.array(0, np.int32), "axis")),
        const(ctx, np.array(1, np.int32), "one"),
    )
    spare = const(ctx, np.array(size, np.int32), "spare")
    kept = ctx.op.And(mask, ctx.op.Less(rows, spare))
    target = ctx.op.Cast(ctx.op.Where(kept, rows, spare), to=onnx.TensorProto.INT64)
    coordinates = np.stack(np.unravel_index(np.arange(count), shape), axis=-1).astype(np.int64)
    padded = const(ctx, np.full((size + 1, len(shape)), fill, np.int64), "padding")
    written = ctx.op.ScatterND(padded, ctx.op.Unsqueeze(target, axes(ctx, -1)), const(ctx, coordinates, "coords"))
    return ctx.op.Slice(written, axes(ctx, 0), axes(ctx, size), axes(ctx, 0))


def _rows_without_input(ctx: ConverterContext, x: gs.Tensor, size: int, rank: int, fill: int) -> gs.Tensor:
    """The ``(size, rank)`` result when it does not depend on the values: a 0-d input has no coordinates (``rank``
    0), ``size`` 0 asks for none, an empty input has none set (every row padding). Still computed from ``x`` (an
    output that is a bare constant is no engine output)."""
    table = np.full((size, rank), fill, np.int64)
    flat = ctx.op.Reshape(x, const(ctx, np.array([-1], np.int64), "flat"))
    none = ctx.op.Cast(ctx.op.Slice(flat, axes(ctx, 0), axes(ctx, 0), axes(ctx, 0)), to=onnx.TensorProto.INT64)
    if table.size == 0:
        return ctx.op.Reshape(none, const(ctx, np.array(table.shape, np.int64), "shape"), allowzero=1)
    # zero added to every entry: broadcasting a 0-element slice would empty the table, so sum it first
    nothing = ctx.op.ReduceSum(none, keepdims=0)
    return ctx.op.Add(const(ctx, table, "padding"), nothing)


def register_static_converters(registry: ConverterRegistry) -> None:
    """Register every converter of this module on ``registry``, one explicit call each."""
    registry.register("aten::nonzero_static.default", validator=static_nonzero)(convert_nonzero_static)
