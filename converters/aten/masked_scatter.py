"""``aten::masked_scatter`` without ``NonZero``.

Vision-language models place their image features into the text embeddings with ``masked_scatter`` (LLaVA, Aya
Vision, Gemma 3, ...). The exporter writes it as ``NonZero`` + ``ScatterND``; TensorRT's parser has no ``NonZero``
importer, so that node left the whole model's engine split in two with ``NonZero`` on ONNX Runtime.

``masked_scatter(x, mask, source)`` fills the masked places of ``x``, in row-major order, with ``source``'s elements
in order: the ``n``-th masked element takes ``source.flatten()[n]``. So each element's source index is the count
of masked elements up to it, less one (a ``CumSum`` of the flattened mask), and the result is a ``Gather`` of the
flattened source at those indices, kept where the mask is set (``Where``). Exact, static shapes, no data-dependent
output size. Unmasked places read index 0 and are discarded (the source gets one zero appended, so that an empty
source, with no place masked, still has an element 0); a source shorter than the mask count is an error in PyTorch
and reads past its end here (as ``ScatterND`` would).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch

from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry


class _PlaceRows(torch.nn.Module):
    """Rows of ``x`` marked by a per-row mask take ``features``' rows in order, as a VLM places image features."""

    def forward(self, x: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        mask = (x[..., :1] > 0.2).expand_as(x)  # [batch, tokens, 1] broadcast to [batch, tokens, hidden]
        return x.masked_scatter(mask, features * 10)


class _PlaceElements(torch.nn.Module):
    """An element mask of the same shape, a source longer than needed, a float16 input."""

    def forward(self, x: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        return x.half().masked_scatter(x < 0, source.half()).float()


class _BroadcastMask(torch.nn.Module):
    """A mask of lower rank broadcast against ``x`` (the op broadcasts ``x`` and the mask to one shape)."""

    def forward(self, x: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        return x.masked_scatter(x[0, 0, :] > 0, source)


class _NothingPlaced(torch.nn.Module):
    """No place masked and an empty source (a prompt without images): ``x`` unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.masked_scatter(x > 100, x.new_zeros(0))


@converter_case(_NothingPlaced, inputs=[((2, 5), "float32")])
@converter_case(_PlaceRows, inputs=[((2, 6, 8), "float32"), ((96,), "float32")])
@converter_case(_PlaceElements, inputs=[((3, 5), "float32"), ((20,), "float32")])
@converter_case(_BroadcastMask, inputs=[((2, 4, 3), "float32"), ((24,), "float32")])
def convert_masked_scatter(ctx: ConverterContext) -> gs.Tensor:
    """``aten::masked_scatter(self, mask, source)``: the module doc's ``CumSum`` + ``Gather`` + ``Where``."""
    x, mask, source = ctx.inputs[:3]
    op = ctx.op
    x = op.Expand(x, op.Shape(mask))  # both to their common shape, as PyTorch broadcasts them
    mask = op.Expand(mask, op.Shape(x))
    flat = ctx.constant(np.array([-1], np.int64))
    flat_mask = op.Reshape(mask, flat)
    counted = op.CumSum(op.Cast(flat_mask, to=onnx.TensorProto.INT64), ctx.constant(np.array(0, np.int64)))
    index = op.Max(op.Sub(counted, ctx.constant(np.array(1, np.int64))), ctx.constant(np.array(0, np.int64)))
    # one zero past the source's elements: an empty source (no place masked, which PyTorch allows) still gathers
    dtype = ctx.input_dtypes[2] or ctx.input_dtypes[0] or np.dtype(np.float32)
    padded = op.Concat(op.Reshape(source, flat), ctx.constant(np.zeros(1, dtype)), axis=0)
    picked = op.Gather(padded, index, axis=0)
    return op.Reshape(op.Where(flat_mask, picked, op.Reshape(x, flat)), op.Shape(x))


def register_masked_scatter_converters(registry: ConverterRegistry) -> None:
    """Register the converter of ``aten::masked_scatter``."""
    registry.register("aten::masked_scatter.default")(convert_masked_scatter)
