"""Putting a replacement in place of a node: consumers rewired, names and types kept."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_graphsurgeon as gs

from converters.context import ConverterContext


def replace_outputs(graph: gs.Graph, node: gs.Node, outputs: Sequence[gs.Tensor], ctx: ConverterContext) -> None:
    """Replace ``node``'s outputs by ``outputs`` (built through ``ctx``) and detach ``node`` for cleanup."""
    for old, new in zip(list(node.outputs), outputs, strict=True):
        _rewire(graph, old, new, ctx)
    node.outputs.clear()
    node.inputs.clear()


def _rewire(graph: gs.Graph, old: gs.Tensor, new: gs.Tensor, ctx: ConverterContext) -> None:
    """Consumers of ``old`` read ``new``; a tensor the converter created takes ``old``'s name and type."""
    for consumer in list(old.outputs):
        for index, tensor in enumerate(consumer.inputs):
            if tensor is old:
                consumer.inputs[index] = new
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
