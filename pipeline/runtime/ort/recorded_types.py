"""The types an ONNX graph records for its named values (inputs, ``value_info``, outputs), as the session-graph
rewrites of this package read them: an element type and a list of dimensions, each a size, a symbolic name or
``None``."""

from __future__ import annotations

import onnx

Dim = int | str | None
"""A dimension: its size, its symbolic name, or ``None`` when unknown."""


def recorded_types(model: onnx.ModelProto) -> dict[str, tuple[int, list[Dim]]]:
    """Element type and dimensions of every named value whose type the graph records (inputs, value_info,
    outputs)."""
    out: dict[str, tuple[int, list[Dim]]] = {}
    for value in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        tensor = value.type.tensor_type
        out[value.name] = (
            tensor.elem_type,
            [
                d.dim_value if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else None
                for d in tensor.shape.dim
            ],
        )
    return out


def shapes_of(model: onnx.ModelProto) -> dict[str, list[Dim]]:
    """The dimensions of every named value with a recorded shape."""
    return {name: dims for name, (_, dims) in recorded_types(model).items()}


def dim_size(dim: Dim) -> int | None:
    """The size of a dimension known as a number, else None."""
    return dim if isinstance(dim, int) else None


def same_dim(a: Dim, b: Dim) -> bool:
    """Two dimensions known to be equal (the same size, or the same symbolic name)."""
    return a is not None and a == b
