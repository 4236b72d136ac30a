"""Rewiring, the one way every rewrite puts something in place of a node: consumers read the replacement, graph
outputs keep their names and types.

:func:`redirect_consumers` points the consumers of one tensor at another (a bypass: ``x + 0`` read as ``x``);
:func:`replace_outputs` puts the tensors a converter or a rule built in place of a node's outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_graphsurgeon as gs

from converters.context import ConverterContext


def redirect_consumers(old: gs.Tensor, new: gs.Tensor) -> bool:
    """Every node that reads ``old`` reads ``new`` instead (graph outputs are not touched); False if none read it.

    Tensors are compared by identity: graph-surgeon's ``==`` compares names, and its synchronised lists take item,
    not slice, assignment.
    """
    moved = False
    for consumer in list(old.outputs):
        for index, tensor in enumerate(consumer.inputs):
            if tensor is old:
                consumer.inputs[index] = new
                moved = True
    return moved


def replace_outputs(graph: gs.Graph, node: gs.Node, outputs: Sequence[gs.Tensor], ctx: ConverterContext) -> None:
    """Replace ``node``'s outputs by ``outputs`` (built through ``ctx``) and detach ``node`` for cleanup."""
    for old, new in zip(list(node.outputs), outputs, strict=True):
        _rewire(graph, old, new, ctx)
    node.outputs.clear()
    node.inputs.clear()


def _rewire(graph: gs.Graph, old: gs.Tensor, new: gs.Tensor, ctx: ConverterContext) -> None:
    """Consumers of ``old`` read ``new``; a tensor the converter created takes ``old``'s name and type."""
    redirect_consumers(old, new)
    created = any(new is t for n in ctx.created for t in n.outputs) and not any(new is t for t in graph.outputs)
    name = old.name
    if created:
        old.name = ctx.fresh_name("replaced")
        new.name = name
        if isinstance(new, gs.Variable):
            new.dtype = new.dtype or old.dtype
            new.shape = new.shape or old.shape
    for index, tensor in enumerate(graph.outputs):
        if tensor is old:
            if created:
                graph.outputs[index] = new
            else:  # the converter returned an input or a constant: a graph output needs its own tensor
                copy = gs.Variable(name, dtype=old.dtype, shape=old.shape)
                old.name = ctx.fresh_name("replaced")
                identity = gs.Node("Identity", ctx.fresh_name("Identity"), inputs=[new], outputs=[copy])
                identity.converted_by = "rewiring"
                graph.nodes.append(identity)
                graph.outputs[index] = copy
