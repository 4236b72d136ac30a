"""Watching intermediate tensors on ONNX Runtime, and the float32 islands that measurement calls for.

Intermediate tensors are observed by marking them as graph outputs. Each session marks at least
:data:`OBSERVE_CHUNK` of them, and more while their estimated size (the graph's shapes, symbolic dimensions bound
from the feeds) stays within :data:`OBSERVE_BYTES`: the memory of one run stays bounded however large the graph, and a
graph whose tensors are small runs once per feed instead of once per 256 tensors (timm's 1,092-node HaloNet: 5 runs
per feed before, 1 now). Graph optimizations are off, so what is observed is the graph as written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from converters.context import unique_name
from converters.errors import ConversionError
from passes.model_io.external_data import ort_session_bytes
from passes.model_io.graphs import module_path
from passes.precision.types import LowType
from passes.records import Island

logger = logging.getLogger(__name__)

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
            try:
                ran = session.run(wanted, session_feed(session, feed)) if wanted else []
            except Exception as error:  # ONNX Runtime refusing the graph on an input: said, with the stage, not raw
                raise ConversionError(
                    f"the graph failed to run on calibration input {index} on ONNX Runtime while its tensors were "
                    f"measured (PyTorch ran that input): {str(error).strip()}",
                    fix="pass calibration=[...] with inputs like the sample (a graph exported as the sample decides "
                    "sizes from data serves inputs that decide alike: see the export's warning), or convert with "
                    "precision='fp32'",
                ) from error
            values = dict(zip(wanted, ran, strict=True))
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
    try:
        return ort.InferenceSession(ort_session_bytes(model, options), sess_options=options, providers=list(providers))
    except Exception as error:  # ONNX Runtime refusing the graph itself: said, with the stage, not raw
        raise ConversionError(
            f"ONNX Runtime could not load the graph whose tensors the precision stage measures: {str(error).strip()}",
            fix="ONNX Runtime has no kernel for the node named above with its types: check the custom passes or "
            "converters that wrote it (debug_passes=True names the pass after which the graph stops loading); a "
            "graph the default passes give should always load, so report the model if none of yours is involved",
        ) from error


def peak_magnitudes(
    model: onnx.ModelProto,
    feeds: Sequence[Feed],
    providers: Sequence[str] = ("CPUExecutionProvider",),
    names: Sequence[str] | None = None,
) -> dict[str, float]:
    """The largest finite ``|x|`` of every float tensor (or of ``names``) over all feeds (0.0 where none is finite).

    Computed inside the graph: each tensor gets a ``ReduceMax`` and a ``ReduceMin`` (of its float32 value), so one
    run per feed returns two scalars per tensor, whatever the graph's size, where observing the tensors themselves
    takes a run per chunk of them. A tensor whose extremes are not finite (it holds an inf or a nan), and every
    tensor of a graph before opset 13 or one ONNX Runtime does not run with the reductions, is observed instead."""
    wanted = float_tensors(model) if names is None else list(dict.fromkeys(names))
    inputs = {i.name for i in model.graph.input}
    peaks = dict.fromkeys(wanted, 0.0)
    for name in wanted:
        for feed in feeds:
            if name in inputs and name in feed:
                peaks[name] = max(peaks[name], _finite_peak(np.asarray(feed[name])))
    inner = [n for n in wanted if n not in inputs]
    observed = inner
    if inner and _default_opset(model) >= 13:
        reduced, outputs = _with_extreme_outputs(model, inner)
        try:
            session = _session(reduced, providers)
            runs = [session.run(outputs, session_feed(session, feed)) for feed in feeds]
        except Exception as exc:  # ONNX Runtime's own error on the added reductions: observe the tensors instead
            logger.info("peaks observed tensor by tensor: the graph with reductions does not run (%s)", exc)
        else:
            observed = []
            for index, name in enumerate(inner):
                extremes = np.array([run[j] for run in runs for j in (2 * index, 2 * index + 1)], np.float64)
                if extremes.size and np.isfinite(extremes).all():
                    peaks[name] = max(peaks[name], float(np.abs(extremes).max()))
                else:  # an inf or a nan (or an empty tensor): its largest finite value needs the values
                    observed.append(name)
    if observed:
        observe(model, feeds, observed, lambda name, _, value: _raise_peak(peaks, name, _finite_peak(value)), providers)
    return peaks


def _raise_peak(peaks: dict[str, float], name: str, value: float) -> None:
    peaks[name] = max(peaks[name], value)


def _finite_peak(value: np.ndarray) -> float:
    if not value.size:
        return 0.0
    peak = float(np.max(np.abs(value)))
    if np.isfinite(peak):
        return peak
    finite = np.abs(value[np.isfinite(value)])  # an inf or nan somewhere: the largest finite value, if any
    return float(finite.max()) if finite.size else 0.0


def _default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _with_extreme_outputs(model: onnx.ModelProto, names: Sequence[str]) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with two float32 scalar outputs per tensor of ``names``: its maximum and its minimum (a tensor
    that is not float32 is cast to it first: exact for float16 and bfloat16)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.output, *inferred.value_info]}
    taken = {t for n in graph.node for t in [*n.input, *n.output]} | {i.name for i in graph.input}
    taken |= {i.name for i in graph.initializer}

    added: dict[str, list[onnx.NodeProto]] = {}
    outputs: list[str] = []
    for name in names:
        source, nodes = name, added.setdefault(name, [])
        if types.get(name) != onnx.TensorProto.FLOAT:
            source = unique_name(f"{name}/peak/float", taken)
            nodes.append(onnx.helper.make_node("Cast", [name], [source], to=onnx.TensorProto.FLOAT))
        for op in ("ReduceMax", "ReduceMin"):
            extreme = unique_name(f"{name}/peak/{op}", taken)
            nodes.append(onnx.helper.make_node(op, [source], [extreme], keepdims=0))
            graph.output.append(onnx.helper.make_tensor_value_info(extreme, onnx.TensorProto.FLOAT, []))
            outputs.append(extreme)
    # each tensor's reductions right after its producer: ONNX Runtime runs nodes in this order and frees a tensor
    # after its last reader, so the graph's memory stays what it was (appended at the end, every tensor lived on)
    ordered: list[onnx.NodeProto] = []
    for node in graph.node:
        ordered.append(node)
        for output in node.output:
            ordered.extend(added.pop(output, []))
    del graph.node[:]
    graph.node.extend(ordered)
    for nodes in added.values():  # tensors no node of the main graph produces (none for float_tensors' names)
        graph.node.extend(nodes)
    return out, outputs


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
