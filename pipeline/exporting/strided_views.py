"""``as_strided`` of a view, rewritten onto the contiguous tensor whose memory the view reads.

``x.as_strided(size, stride, offset)`` reads ``x``'s *memory*: element ``i`` is ``storage[offset + sum(i_k *
stride_k)]``, whatever ``x``'s own strides are. ONNX has no memory layout: the exporter writes it as a ``Gather`` on
``x``'s elements in row-major order, which is its memory only when ``x`` is contiguous and starts its storage.
Longformer and LED chunk their sliding-window attention with ``as_strided`` on a transposed, reshaped query (a view
whose strides are not row-major): the graph gathered the wrong elements (logits off by 4 and more).

:func:`as_strided_on_base` follows such an ``x`` back through view ops to the nearest tensor that is contiguous and
starts its storage, or to the op that made the memory (whose result may be dense but laid out otherwise: an
elementwise op keeps its input's strides, and is permuted into memory order first), and applies ``as_strided`` to it
with the same size, strides and ``x``'s storage offset: the same elements, now in row-major order. A view whose
memory is not found (overlapping or offset) is left as it was.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

_A = torch.ops.aten
#: Ops whose result shares its first argument's memory (a view: no copy). ``reshape`` copies only into a contiguous
#: result, where the walk stops anyway: a non-contiguous reshape is a view.
_VIEWS = {
    _A.reshape.default, _A._unsafe_view.default,
    _A.view.default, _A.transpose.int, _A.permute.default, _A.t.default, _A.unsqueeze.default, _A.squeeze.dim,
    _A.squeeze.dims, _A.squeeze.default, _A.slice.Tensor, _A.select.int, _A.expand.default, _A.alias.default,
    _A.unflatten.int, _A.diagonal.default, _A.unfold.default, _A.narrow.default, _A.view_as.default,
    _A.as_strided.default, _A._reshape_alias.default,
}  # fmt: skip


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _starts_contiguous(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_contiguous() and value.storage_offset() == 0


def as_strided_on_base(graph: torch.fx.Graph) -> int:
    """Rewrite every ``as_strided`` of a non-contiguous view onto its contiguous base (the module doc); returns how
    many."""
    count = 0
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not _A.as_strided.default:
            continue
        source = node.args[0]
        value = _val(source)
        if not isinstance(value, torch.Tensor) or _starts_contiguous(value):
            continue
        base = source
        while isinstance(base, torch.fx.Node) and base.target in _VIEWS and not _starts_contiguous(_val(base)):
            base = base.args[0]
        order = _memory_order(_val(base)) if isinstance(base, torch.fx.Node) else None
        if order is None:
            logger.debug("as_strided of %s: no base whose memory it reads was found; left as it is", source.name)
            continue
        if order != sorted(order):  # a dense tensor laid out otherwise (an op kept its input's strides): in order
            with graph.inserting_before(node):
                permuted = graph.call_function(_A.permute.default, (base, order))
                permuted.meta = {**base.meta, "val": _val(base).permute(order)}
            base = permuted
        size, stride = node.args[1], node.args[2]
        offset = node.args[3] if len(node.args) > 3 and node.args[3] is not None else value.storage_offset()
        node.args = (base, size, stride, offset)
        count += 1
    return count


def _memory_order(value: Any) -> list[int] | None:
    """The axes of ``value`` in the order its memory lays them out (outermost first) when its elements fill its
    storage from the start exactly once (dense, no overlap, offset 0); None otherwise."""
    if not isinstance(value, torch.Tensor) or value.storage_offset() != 0:
        return None
    shape, strides = list(value.shape), list(value.stride())
    if not all(isinstance(d, int) for d in (*shape, *strides)):
        return None
    order = sorted(range(len(shape)), key=lambda axis: (-strides[axis], axis))
    expected = 1
    for axis in reversed(order):
        if shape[axis] != 1 and strides[axis] != expected:
            return None
        expected *= shape[axis]
    return order
