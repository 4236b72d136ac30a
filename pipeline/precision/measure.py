"""Watching intermediate tensors on ONNX Runtime, and the float32 islands that measurement calls for.

Intermediate tensors are observed by marking them as graph outputs. Each session marks at least
:data:`OBSERVE_CHUNK` of them, and more while their estimated size (the graph's shapes, symbolic dimensions bound
from the feeds) stays within :data:`OBSERVE_BYTES`: the memory of one run stays bounded however large the graph, and a
graph whose tensors are small runs once per feed instead of once per 256 tensors (timm's 1,092-node HaloNet: 5 runs
per feed before, 1 now). Graph optimizations are off, so what is observed is the graph as written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from passes.model_io.external_data import ort_session_bytes
from passes.model_io.graphs import module_path
from passes.precision.rules import Island
from passes.precision.types import LowType

#: Tensors observed per ONNX Runtime session, at least (and at most, for :mod:`pipeline.precision.search`).
OBSERVE_CHUNK = 256
#: A session observes more than OBSERVE_CHUNK tensors while their estimated bytes (per feed) stay within this.
OBSERVE_BYTES = 512 << 20
Feed = Mapping[str, np.ndarray]


def float_tensors(model: onnx.ModelProto) -> list[str]:
    """Graph inputs and node outputs of a float type (float32, float16, bfloat16), in graph order."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.input, *inferred.output, *inferred.value_info]}
    names = [i.name for i in model.graph.input] + [o for n in model.graph.node for o in n.output if o]
    return [n for n in dict.fromkeys(names) if types.get(n) in floats]


def observe(
    model: onnx.ModelProto,
    feeds: Sequence[Feed],
    names: Sequence[str],
    visit: Callable[[str, int, np.ndarray], None],
    providers: Sequence[str] = ("CPUExecutionProvider",),
) -> None:
    """Run ``model`` on every feed and call ``visit(name, feed_index, value)`` for each tensor of ``names``."""
    inputs = {i.name for i in model.graph.input}
    for chunk in observed_chunks(model, names, feeds):
        session = _session(_with_outputs(model, [n for n in chunk if n not in inputs]), providers)
        wanted = [n for n in chunk if n not in inputs]
        for index, feed in enumerate(feeds):
            values = dict(zip(wanted, session.run(wanted, session_feed(session, feed)), strict=True)) if wanted else {}
            for name in chunk:
                visit(name, index, np.asarray(feed[name] if name in inputs else values[name]))


def observed_chunks(model: onnx.ModelProto, names: Sequence[str], feeds: Sequence[Feed]) -> list[list[str]]:
    """``names`` in order, split into the tensors each session observes: at least :data:`OBSERVE_CHUNK` a chunk, more
    while the chunk's estimated bytes stay within :data:`OBSERVE_BYTES` (a tensor of unknown size counts as the
    largest known one)."""
    sizes = _estimated_bytes(model, feeds)
    unknown = max(sizes.values(), default=0)
    chunks: list[list[str]] = []
    chunk: list[str] = []
    total = 0
    for name in names:
        size = sizes.get(name, unknown)
        if len(chunk) >= OBSERVE_CHUNK and total + size > OBSERVE_BYTES:
            chunks.append(chunk)
            chunk, total = [], 0
        chunk.append(name)
        total += size
    return [*chunks, chunk] if chunk else chunks


def _estimated_bytes(model: onnx.ModelProto, feeds: Sequence[Feed]) -> dict[str, int]:
    """Bytes of each tensor whose shape the graph records, symbolic dimensions bound from the feeds' shapes."""
    bound: dict[str, int] = {}
    for value in model.graph.input:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param:
                sizes = [f[value.name].shape[axis] for f in feeds if value.name in f and f[value.name].ndim > axis]
                if sizes:
                    bound[dim.dim_param] = max(bound.get(dim.dim_param, 0), max(sizes))
    found: dict[str, int] = {}
    for value in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        tensor = value.type.tensor_type
        if not tensor.HasField("shape") or not tensor.elem_type:
            continue
        count = 1
        for dim in tensor.shape.dim:
            size = dim.dim_value if dim.HasField("dim_value") else bound.get(dim.dim_param)
            if size is None:
                break
            count *= size
        else:
            try:
                itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
            except (KeyError, TypeError, ValueError):  # a type numpy has no dtype for: its size is unknown
                continue
            found[value.name] = count * itemsize
    return found


#: ONNX Runtime's names of the half types a graph input may have (precision_io="low").
_HALF_INPUTS = {"tensor(float16)": np.float16}


def session_feed(session: ort.InferenceSession, feed: Feed) -> dict[str, np.ndarray]:
    """``feed`` with float32 arrays narrowed to the session's float16 inputs (a graph with precision_io="low");
    calibration feeds hold values already rounded to float16, so this is exact."""
    types = {i.name: _HALF_INPUTS.get(i.type) for i in session.get_inputs()}
    return {
        name: value.astype(half) if (half := types.get(name)) is not None and value.dtype == np.float32 else value
        for name, value in feed.items()
    }


def _with_outputs(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    present = {o.name for o in out.graph.output}
    out.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in present)
    return out


def _session(model: onnx.ModelProto, providers: Sequence[str]) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(ort_session_bytes(model, options), sess_options=options, providers=list(providers))


def peak_magnitudes(
    model: onnx.ModelProto, feeds: Sequence[Feed], providers: Sequence[str] = ("CPUExecutionProvider",)
) -> dict[str, float]:
    """The largest finite ``|x|`` of every float tensor over all feeds."""
    peaks: dict[str, float] = {}

    def visit(name: str, _: int, value: np.ndarray) -> None:
        if not value.size:
            return
        peak = float(np.max(np.abs(value)))
        if not np.isfinite(peak):  # an inf or nan somewhere: the largest finite value, if any
            finite = np.abs(value[np.isfinite(value)])
            if not finite.size:
                return
            peak = float(finite.max())
        peaks[name] = max(peaks.get(name, 0.0), peak)

    observe(model, feeds, float_tensors(model), visit, providers)
    return peaks


def measured_islands(
    model: onnx.ModelProto,
    feeds: Sequence[Feed],
    low: LowType,
    margin: float,
    providers: Sequence[str] = ("CPUExecutionProvider",),
) -> list[Island]:
    """Nodes that produce or read a tensor whose peak ``|x|`` times ``margin`` exceeds ``low``'s largest value.

    The producer must compute it in float32, and so must every reader: casting it down would make it inf.
    """
    limit = low.max_finite / margin
    peaks = peak_magnitudes(model, feeds, providers)
    islands: dict[str, Island] = {}
    for node in model.graph.node:
        metadata = {p.key: p.value for p in node.metadata_props}
        for role, tensors in (("produces", node.output), ("reads", node.input)):
            over = [(t, peaks[t]) for t in tensors if peaks.get(t, 0.0) > limit]
            if over and node.name not in islands:
                tensor, peak = max(over, key=lambda item: item[1])
                reason = (
                    f"{role} {tensor!r} with max |x| {peak:.3g} on the calibration inputs; x {margin:g} margin "
                    f"exceeds {low.dtype_name}'s largest {low.max_finite:.4g}"
                )
                islands[node.name] = Island(node.name, node.op_type, "measured", reason, module_path(metadata))
    return list(islands.values())
