"""A UInt8 constant graph output as a ``Cast`` of an int32 constant.

TensorRT's constant layer takes INT32, float and half weights only ("invalid weights type of UInt8"), and UInt8 is
allowed only at the network's edges ("does not support UINT8 types for intermediate tensors"); a ``Cast`` to UInt8
that is a graph output builds. A decomposition that makes an empty ``uint8`` tensor (``_batch_norm_with_update``'s
``reserve`` output, ``torch.empty(0, dtype=torch.uint8)``) leaves a UInt8 initializer as a graph output, which the
builder refuses. The fix writes that output as ``Cast(int32 constant, to=UINT8)`` (exact: int32 holds every uint8
value); constant folding leaves a ``Cast`` to UInt8 alone for this reason. There is no node to match, so the rule
matches none and its pass rewrites the graph outputs; a UInt8 constant read inside the graph stays (TensorRT has no
UInt8 intermediate tensor to give it).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from converters.settings import Settings
from passes.base import PassResult
from passes.rules import Facts, RewriteContext, RewriteRule


def is_uint8_constant(tensor: gs.Tensor) -> bool:
    """A constant (initializer) of element type uint8."""
    return isinstance(tensor, gs.Constant) and np.dtype(tensor.values.dtype) == np.uint8


class UInt8ConstantOutputsAsCasts(RewriteRule[None]):
    """Each uint8 constant graph output -> ``Cast(int32 constant, to=UINT8)`` under the output's name."""

    name = "uint8_constant_outputs_as_casts"
    ops: frozenset[str] = frozenset()  # graph outputs, not nodes: see __call__

    def check(self, node: gs.Node, facts: Facts) -> None | str:
        """No node is rewritten: the pass works on the graph's outputs."""
        return "the fix rewrites uint8 constant graph outputs, not nodes"

    def rewrite(self, plan: None, ctx: RewriteContext) -> None:
        """Never called (``check`` declines every node)."""

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        """Rewrite the uint8 constant graph outputs; modified when there was one."""
        modified = False
        for position, output in enumerate(graph.outputs):
            if not is_uint8_constant(output):
                continue
            name = output.name
            source = gs.Constant(f"{name}/int32", output.values.astype(np.int32))
            variable = gs.Variable(name, dtype=np.uint8, shape=list(output.values.shape))
            output.name = f"{name}/uint8"  # the initializer, unused from now on, gives up the output's name
            cast = gs.Node("Cast", name=f"{name}/Cast", attrs={"to": onnx.TensorProto.UINT8}, inputs=[source])
            cast.outputs = [variable]
            graph.nodes.append(cast)
            graph.outputs[position] = variable
            modified = True
        return PassResult(graph, modified)
