"""Edge (replicate) ``Pad`` with a negative pad, as constant-index ``Gather`` per axis.

``F.pad(x, (-4, 5), mode="replicate")`` exports as ``Pad(mode="edge")`` with pads ``[-4, 5]``. PyTorch reads
``out[i] = x[clamp(i - begin, 0, n - 1)]`` over the *original* extent, so a crop that removes every element and a pad
that then replicates are fine; ONNX Runtime crops first and refuses to edge-pad what is left when that is empty
("Pad: invalid mode: 2 with zero effective input extent"). The rule writes PyTorch's reading directly: per padded axis
one ``Gather`` with the constant indices ``clip(arange(n + begin + end) - begin, 0, n - 1)``. Needs the pads constant
and the input's dimensions static on the axes with a nonzero pad; exact for every pad.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from passes.parser_fixes.values import ValueResolver, is_omitted, rank_of
from passes.rules import Facts, RewriteContext, RewriteRule


@dataclass(frozen=True)
class EdgeGatherPlan:
    """Per padded axis: the axis and its constant source indices."""

    axes: tuple[int, ...]
    indices: tuple[tuple[int, ...], ...]


def edge_indices(size: int, begin: int, end: int) -> np.ndarray:
    """The source index of each output position along an axis of ``size`` edge-padded by ``begin``/``end``
    (negative: cropped), as PyTorch's replicate padding reads it."""
    return np.clip(np.arange(size + begin + end) - begin, 0, size - 1).astype(np.int64)


class NegativeEdgePadToGather(RewriteRule[EdgeGatherPlan]):
    """``Pad(mode="edge")`` with a negative pad -> one ``Gather`` per padded axis (module doc)."""

    name = "negative_edge_pad_to_gather"
    ops = frozenset({"Pad"})

    def check(self, node: gs.Node, facts: Facts) -> EdgeGatherPlan | str:
        """A plan for an edge Pad with a negative constant pad over static dimensions; else the reason."""
        if node.attrs.get("mode", "constant") != "edge":
            return f"mode {node.attrs.get('mode', 'constant')!r}, not 'edge'"
        x = node.inputs[0]
        rank = rank_of(x)
        if rank is None:
            return "input rank unknown"
        resolver = ValueResolver(facts.opset)
        resolved = resolver.resolve(node.inputs[1])
        if resolved is None:
            return "pads are not a constant"
        axes = list(range(rank))
        if len(node.inputs) > 3 and not is_omitted(node.inputs[3]):
            given = resolver.resolve(node.inputs[3])
            if given is None:
                return "axes are not a constant"
            axes = [int(a) % rank for a in given.tolist()]
        pads = [int(p) for p in resolved.tolist()]
        if len(pads) != 2 * len(axes):
            return f"{len(pads)} pads for {len(axes)} axes"
        if min(pads) >= 0:
            return "no negative pad: ONNX Runtime and TensorRT take it as it is"
        begins, ends = pads[: len(axes)], pads[len(axes) :]
        padded = [(a, b, e) for a, b, e in zip(axes, begins, ends, strict=True) if b or e]
        sizes = [x.shape[a] for a, _, _ in padded]
        if not all(isinstance(s, int | np.integer) and s > 0 for s in sizes):
            return f"input dimensions {sizes} on the padded axes are not static and nonzero"
        indices = [edge_indices(int(s), b, e) for s, (_, b, e) in zip(sizes, padded, strict=True)]
        if any(i.size == 0 for i in indices):
            return "an axis is cropped to nothing: an empty output, left to the backend"
        return EdgeGatherPlan(tuple(a for a, _, _ in padded), tuple(tuple(i.tolist()) for i in indices))

    def rewrite(self, plan: EdgeGatherPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """Gather each padded axis with its constant indices."""
        y: gs.Tensor = ctx.node.inputs[0]
        for axis, indices in zip(plan.axes, plan.indices, strict=True):
            y = ctx.op.Gather(y, np.array(indices, np.int64), axis=axis)
        return [y]
