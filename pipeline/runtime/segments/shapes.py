"""The types and shapes of the values that cross between segments, and the optimization profile of each TensorRT
segment's inputs.

A value between segments is not a graph input, so no user declared its range. As Torch-TensorRT does for its
segments, the whole final graph is run (here on ONNX Runtime) on the inputs validation uses (the sample, inputs drawn
like it and, with dynamic dimensions, their min and max sizes) and every boundary value's shape is recorded:

- a dimension ONNX shape inference knows is fixed;
- a dimension that follows the declared dynamic dimensions gets the smallest and largest size seen, and the sample's
  size as ``opt``;
- a dimension downstream of an op whose output size depends on the data (NonZero, Unique, Compress, a Loop, a
  plugin) gets ``[1, bound]``, ``bound`` the largest element count of any boundary value or graph input seen: the
  count of a NonZero or Unique result cannot exceed the elements of its input. An empty result (size 0) is outside
  every TensorRT profile.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import torch

from converters.errors import BuildError, PipelineError
from pipeline.runtime.io_spec import IOSpec, TensorSpec
from pipeline.settings import DynamicDim, Settings

#: Ops whose output sizes depend on the values of their inputs, not only on their shapes.
DATA_DEPENDENT_OPS = frozenset({"NonZero", "Unique", "Compress", "NonMaxSuppression", "Loop", "Scan"})


@dataclass(frozen=True)
class Observed:
    """What the runs saw of one value: its numpy dtype name and its shape on each input."""

    dtype: str
    shapes: tuple[tuple[int, ...], ...]


def observe(
    model: onnx.ModelProto, names: Sequence[str], feeds: Sequence[Mapping[str, np.ndarray]], settings: Settings
) -> dict[str, Observed]:
    """Run ``model`` on ONNX Runtime on every feed with ``names`` as extra outputs; their dtypes and shapes."""
    from pipeline.runtime.ort.executor import OnnxRuntimeExecutor

    given = {v.name for v in _graph_inputs(model)}  # fed, not computed: taken from the feeds below
    wanted = [n for n in dict.fromkeys(names) if n not in {o.name for o in model.graph.output} | given]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in wanted)
    inputs = tuple(TensorSpec(v.name, "float32", ()) for v in _graph_inputs(model))
    outputs = tuple(TensorSpec(o.name, "float32", ()) for o in probe.graph.output)
    executor = OnnxRuntimeExecutor(probe, IOSpec(inputs, outputs, "", (), "", (), ()), settings)
    runs: list[dict[str, np.ndarray]] = []
    for feed in feeds:
        tensors = [torch.from_numpy(np.ascontiguousarray(feed[spec.name])) for spec in inputs]
        try:
            results = executor.run(tensors)
        except PipelineError:
            raise
        except Exception as error:  # ONNX Runtime refusing the graph on an input: said, with its node, not raw
            raise BuildError(
                "segments: ONNX Runtime could not run the final graph on a validation input to plan the segments: "
                f"{type(error).__name__}: {' '.join(str(error).split())[:400]}",
                fix="the node named in the message is where it failed: convert with backend='onnxruntime' to see it "
                "alone, inspect module.onnx there, and please report it with the model",
            ) from error
        runs.append({spec.name: r.numpy() for spec, r in zip(outputs, results, strict=True)})
        runs[-1].update({name: np.asarray(feed[name]) for name in feed})
    seen = [n for n in dict.fromkeys(names)]
    return {
        name: Observed(_dtype_name(runs[0][name].dtype), tuple(tuple(run[name].shape) for run in runs)) for name in seen
    }


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in initializers]


def _dtype_name(dtype: np.dtype) -> str:
    return "bool" if dtype == np.bool_ else str(dtype)


def data_dependent_values(model: onnx.ModelProto) -> set[str]:
    """Values whose shape may depend on the data: outputs of :data:`DATA_DEPENDENT_OPS` and of nodes outside the
    standard domains (plugins, custom ops), and every value computed from one of them."""
    from pipeline.runtime.segments.partition import used_values

    tainted: set[str] = set()
    for node in model.graph.node:
        custom = node.domain not in ("", "ai.onnx")
        if custom or node.op_type in DATA_DEPENDENT_OPS or any(v in tainted for v in used_values(node)):
            tainted.update(o for o in node.output if o)
    return tainted


def boundary_specs(
    model: onnx.ModelProto,
    names: Iterable[str],
    observed: Mapping[str, Observed],
    settings: Settings,
) -> tuple[dict[str, TensorSpec], tuple[DynamicDim, ...]]:
    """A :class:`TensorSpec` per value crossing between segments, and the dynamic dimensions of those that are not
    graph inputs (graph inputs keep the dimensions the user declared)."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    types = {v.name: v.type.tensor_type for v in [*inferred.input, *inferred.value_info, *inferred.output]}
    graph_inputs = {v.name: v for v in _graph_inputs(model)}
    tainted = data_dependent_values(model)
    bound = max((int(np.prod(s)) for o in observed.values() for s in o.shapes), default=1)
    specs: dict[str, TensorSpec] = {}
    dims: list[DynamicDim] = []
    for name in dict.fromkeys(names):
        seen = observed[name]
        dtype = _onnx_dtype(types[name].elem_type) if name in types and types[name].elem_type else seen.dtype
        if name in graph_inputs:
            specs[name] = TensorSpec(name, dtype, _declared_shape(graph_inputs[name]))
            continue
        shape: list[int | str] = []
        for axis, sizes in enumerate(zip(*seen.shapes, strict=True)):
            known = _inferred_dim(types.get(name), axis, len(seen.shapes[0]))
            if known is not None:
                shape.append(known)
            elif name in tainted:
                shape.append(f"{name}:{axis}")
                dims.append(DynamicDim(name, axis, f"{name}:{axis}", 1, max(1, sizes[0]), max(bound, *sizes, 1)))
            elif len(set(sizes)) > 1:
                shape.append(f"{name}:{axis}")
                dims.append(DynamicDim(name, axis, f"{name}:{axis}", max(1, min(sizes)), max(1, sizes[0]), max(sizes)))
            else:
                shape.append(int(sizes[0]))
        specs[name] = TensorSpec(name, dtype, tuple(shape))
    return specs, tuple(dims)


def _declared_shape(value: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    return tuple(
        d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in value.type.tensor_type.shape.dim
    )


def _inferred_dim(tensor: onnx.TypeProto.Tensor | None, axis: int, rank: int) -> int | None:
    if tensor is None or not tensor.HasField("shape") or len(tensor.shape.dim) != rank:
        return None
    dim = tensor.shape.dim[axis]
    return int(dim.dim_value) if dim.HasField("dim_value") else None


def _onnx_dtype(elem_type: int) -> str:
    if elem_type == onnx.TensorProto.BFLOAT16:
        return "bfloat16"
    return _dtype_name(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)))


def value_info(spec: TensorSpec) -> onnx.ValueInfoProto:
    """The ONNX value info of a spec (symbolic dimensions by name)."""
    elem = (
        onnx.TensorProto.BFLOAT16
        if spec.dtype == "bfloat16"
        else onnx.helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype))
    )
    return onnx.helper.make_tensor_value_info(spec.name, elem, list(spec.shape))
