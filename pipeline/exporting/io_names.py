"""The exported graph's inputs and outputs named after the model's arguments and results, and its dynamic dimensions
after the names the user declared (in every shape that uses them)."""

from __future__ import annotations

import re
from typing import Any

import onnx_graphsurgeon as gs
import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import OutputKind, TensorArgument

from converters.context import unique_name
from converters.errors import ExportError
from pipeline.settings import DynamicDim

_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a symbol in a shape expression (``2*s31 + 1``)


def rename_io(graph: gs.Graph, in_names: list[str], out_names: list[str]) -> None:
    """Give the graph's inputs and outputs the model's argument and result names, in place.

    An internal tensor already holding one of those names is moved aside; an output that is also an input, or
    repeats an earlier output, gets its own copy through an Identity so every graph output has a distinct name.
    """
    # graph-surgeon tensors compare equal by name, so membership tests below use identity (`is`).
    io_tensors = [*graph.inputs, *graph.outputs]
    taken = set(graph.tensors())
    wanted = set(in_names) | set(out_names)
    for name, tensor in graph.tensors().items():  # an internal tensor holding a wanted name moves aside
        if name in wanted and not any(tensor is t for t in io_tensors):
            tensor.name = unique_name(f"{name}_internal", taken)
    for i, tensor in enumerate(io_tensors):  # temporary names first, so no two tensors ever share a name
        tensor.name = unique_name(f"__io_{i}", taken)
    for tensor, name in zip(graph.inputs, in_names, strict=True):
        tensor.name = name
    new_outputs: list[gs.Tensor] = []
    for tensor, name in zip(graph.outputs, out_names, strict=True):
        if any(tensor is t for t in [*graph.inputs, *new_outputs]):  # pass-through or repeated output
            copy = gs.Variable(name, dtype=tensor.dtype, shape=tensor.shape)
            graph.nodes.append(gs.Node("Identity", name=f"{name}/identity", inputs=[tensor], outputs=[copy]))
            tensor = copy
        tensor.name = name
        new_outputs.append(tensor)
    graph.outputs = new_outputs


def name_dynamic_dims(graph: gs.Graph, dims: tuple[DynamicDim, ...]) -> None:
    """The user's names on the dynamic input axes, and in every shape that uses them (outputs included: the
    exporter writes its own symbols, ``s31``, which mean nothing to the user)."""
    inputs = {t.name: t for t in graph.inputs}
    renamed: dict[str, str] = {}
    for d in dims:
        tensor = inputs[d.input]
        shape = list(tensor.shape)
        if isinstance(shape[d.axis], int):
            raise ExportError(
                f"dimension {d.axis} of input {d.input!r} was declared dynamic ({d.name!r}) but the exporter fixed it "
                f"to {shape[d.axis]}",
                fix="the model forces that size (a reshape or a constant shape); drop it from dynamic=",
            )
        if isinstance(shape[d.axis], str):
            renamed.setdefault(shape[d.axis], d.name)
        shape[d.axis] = d.name
        tensor.shape = shape
    if not renamed:
        return

    def rename(dim: Any) -> Any:  # in one pass, so that names swapped between symbols stay right
        return _SYMBOL.sub(lambda m: renamed.get(m.group(0), m.group(0)), dim) if isinstance(dim, str) else dim

    for tensor in graph.tensors().values():
        if isinstance(tensor, gs.Variable) and tensor.shape is not None:
            tensor.shape = [rename(dim) for dim in tensor.shape]


def outputs_in_call_order(graph: gs.Graph, program: torch.export.ExportedProgram, result: Any) -> bool:
    """Put the graph's outputs in the order the eager call returns its tensors, in place, when the trace built the
    result in another order (Mistral 3's image outputs: a ``ModelOutput`` whose fields were set in another order
    under torch.export, so its pooler output came before its hidden states). Only when the program's output paths
    are the eager tensors' paths, reordered; returns whether the outputs moved."""
    spec = program.call_spec.out_spec
    user = [o for o in program.graph_signature.output_specs if o.kind == OutputKind.USER_OUTPUT]
    if spec is None or len(user) != spec.num_leaves:
        return False
    try:  # a type registered with pytree without key paths (diffusers' outputs) cannot be compared: left as is
        leaves = pytree.tree_flatten_with_path(pytree.tree_unflatten(list(range(spec.num_leaves)), spec))[0]
        flat = pytree.tree_flatten_with_path(result)[0]
    except ValueError:
        return False
    traced = [
        pytree.keystr(path) for (path, _), o in zip(leaves, user, strict=True) if isinstance(o.arg, TensorArgument)
    ]
    eager = [pytree.keystr(path) for path, leaf in flat if isinstance(leaf, torch.Tensor)]
    if len(traced) != len(graph.outputs) or traced == eager or sorted(traced) != sorted(eager):
        return False
    if len(set(traced)) != len(traced):
        return False
    position = {path: index for index, path in enumerate(traced)}
    graph.outputs = [graph.outputs[position[path]] for path in eager]
    return True
