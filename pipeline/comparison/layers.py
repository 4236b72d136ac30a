"""Per-layer comparison: where, module by module, the final graph departs from PyTorch.

PyTorch runs with forward hooks recording each submodule's output. The exporter records on every ONNX node the
PyTorch module it came from (``passes.model_io.graphs.module_path``); for each module the ONNX tensor compared with its
output is the one produced by the *last* node (topological order) under that module path or any of its
submodules whose shape fits the module's output and whose type does: the graph's own type (a float output matches
any float tensor: float16 or bfloat16 in a low-precision graph), compared under the tolerance of the type the
graph computes it in (:func:`pipeline.accuracy.stats.judgement`, the policy of ``convert`` and ``compare``);
a tensor that depends on a random node is judged by distribution. Modules are listed in topological order (a module and
its last submodule, which share a tensor, child first); the first one outside tolerance is the first divergence.

Intermediates are observed in chunks: each chunk marks as many tensors as graph outputs as fit the memory budget
(counting the backend's copy and the PyTorch copy, for one input at a time), runs the backend and the hooked
model on every input, keeps the statistics and drops the tensors. The backend is ONNX Runtime on the final graph
(:class:`OnnxRuntimeLayers`) or TensorRT engines built with the chunk's tensors marked as outputs
(:class:`pipeline.comparison.tensorrt_layers.TensorRTLayers`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import onnx
import torch

from passes.model_io.graphs import module_path
from pipeline.accuracy.distribution import DistributionStats, random_tensors
from pipeline.accuracy.stats import Accumulator, ErrorStats, Judgement, accumulator, judgement
from pipeline.comparison import DEFAULT_MEMORY_BUDGET
from pipeline.comparison.runners import ModuleOutputRunner, first_tensor, onnxruntime_session
from pipeline.progress import track
from pipeline.runtime.io_spec import IOSpec
from pipeline.settings import Settings
from pipeline.validation.stage import Feed, polygraphy_quiet, tensor_from_array

logger = logging.getLogger(__name__)

_FLOAT_TYPES = frozenset({"float32", "float16", "bfloat16", "float64"})

_ONNX_TYPE = {
    "float32": onnx.TensorProto.FLOAT,
    "float16": onnx.TensorProto.FLOAT16,
    "bfloat16": onnx.TensorProto.BFLOAT16,
    "float64": onnx.TensorProto.DOUBLE,
    "int64": onnx.TensorProto.INT64,
    "int32": onnx.TensorProto.INT32,
    "int16": onnx.TensorProto.INT16,
    "int8": onnx.TensorProto.INT8,
    "uint8": onnx.TensorProto.UINT8,
    "bool": onnx.TensorProto.BOOL,
}


@dataclass(frozen=True)
class ModuleOutput:
    """What one submodule returned on the largest input (first tensor leaf), and when it finished."""

    module: str
    type_name: str
    order: int
    calls: int
    shape: tuple[int, ...] | None
    dtype: str | None


_DTYPE_NAME: dict[int, str] = {int(v): k for k, v in _ONNX_TYPE.items()}


@dataclass(frozen=True)
class LayerMatch:
    """A PyTorch module output matched to a tensor of the final graph (same shape; ``dtype`` is the graph's)."""

    module: str
    type_name: str
    tensor: str
    node: str
    op_type: str
    position: int
    order: int
    calls: int
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class LayerComparison:
    """One module's output against the matched ONNX tensor, over all inputs."""

    module: str
    type_name: str
    tensor: str
    node: str
    op_type: str
    dtype: str
    calls: int
    atol: float
    rtol: float
    stats: ErrorStats | DistributionStats
    computed_in: str = ""
    rms_atol: float = 0.0
    rms: float = 0.0

    @property
    def passed(self) -> bool:
        """Within tolerance on every compared element."""
        return self.stats.passed


@dataclass(frozen=True)
class Divergence:
    """The first module outside tolerance, every ONNX node under it, and the suspects: those nodes not under a
    submodule that was compared and passed."""

    layer: LayerComparison
    nodes: tuple[tuple[str, str], ...]
    suspects: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class LayerReport:
    """The per-layer comparison on one backend: every matched module with its figures, and those left unmatched."""

    backend: str
    layers: tuple[LayerComparison, ...]
    unmatched: tuple[tuple[str, str, str], ...]  # (module, type, reason)
    first_divergence: Divergence | None
    chunks: int
    memory_budget: int
    nodes_without_module: int = 0
    note: str = ""  # where the intermediates come from, and what that means for reading them


class LayerBackend(Protocol):
    """Where intermediates are observed: ``markable`` keeps the matches whose tensor it can observe (the others
    come back as unmatched rows with the reason); ``runner`` is a Polygraphy runner whose outputs include the
    given ``(tensor, dtype)`` pairs."""

    name: str
    note: str

    def markable(self, matches: Sequence[LayerMatch]) -> tuple[list[LayerMatch], list[tuple[str, str, str]]]:
        """The matches whose tensors this backend can expose as outputs, and the rest with the reason."""
        ...

    def runner(self, tensors: Sequence[tuple[str, str]]) -> Any:
        """A Polygraphy runner that returns ``tensors`` as outputs."""
        ...


class OnnxRuntimeLayers:
    """ONNX Runtime on a copy of the final graph whose outputs are the chunk's tensors."""

    name = "onnxruntime"

    def __init__(self, final: onnx.ModelProto, io: IOSpec, settings: Settings, note: str = "") -> None:
        self.io, self.settings = io, settings
        self.note = note or "ONNX Runtime on the final graph"
        self._working = onnx.ModelProto()
        self._working.CopyFrom(final)

    def markable(self, matches: Sequence[LayerMatch]) -> tuple[list[LayerMatch], list[tuple[str, str, str]]]:
        """Every match: ONNX Runtime can expose any tensor of the graph."""
        return list(matches), []

    def runner(self, tensors: Sequence[tuple[str, str]]) -> Any:
        """An ONNX Runtime runner of the graph with ``tensors`` made graph outputs."""
        from polygraphy.backend.onnxrt import OnnxrtRunner

        del self._working.graph.output[:]
        for tensor, dtype in tensors:
            self._working.graph.output.append(onnx.helper.make_tensor_value_info(tensor, _ONNX_TYPE[dtype], None))
        return OnnxrtRunner(onnxruntime_session(self._working, self.io, self.settings), name="onnxruntime-layers")


def compare_layers(
    model: torch.nn.Module,
    reference: torch.nn.Module,
    io: IOSpec,
    final: onnx.ModelProto,
    feeds: Sequence[Feed],
    settings: Settings,
    *,
    float64: bool = False,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    backend: LayerBackend | None = None,
) -> LayerReport:
    """Compare every matched module output of ``reference`` (``model`` or its float64 copy) with ``backend``'s
    intermediates (default: ONNX Runtime on ``final``), over ``feeds``, holding at most about ``memory_budget``
    bytes of intermediates at a time."""
    backend = backend or OnnxRuntimeLayers(final, io, settings)
    largest = max(feeds, key=lambda f: sum(int(np.asarray(v).size) for v in f.values()))
    outputs = record_module_outputs(model, io, largest)
    matches, unmatched = match_modules(final, outputs)
    matches, hidden = backend.markable(matches)
    chunks = chunk_matches(matches, memory_budget)
    random = random_tensors(final)
    judged = {m.module: judgement(m.module, m.dtype, settings) for m in matches}
    accumulators = {m.module: accumulator(judged[m.module].tolerance, random.get(m.tensor)) for m in matches}
    for index, chunk in enumerate(track(chunks, len(chunks), "per-layer comparison", unit="chunk")):
        logger.info("per-layer chunk %d/%d: %d tensors", index + 1, len(chunks), len({m.tensor for m in chunk}))
        runner = backend.runner(list(dict((m.tensor, m.dtype) for m in chunk).items()))
        _run_chunk(chunk, runner, reference, io, feeds, accumulators, float64)
    layers, mismatched = _results(matches, accumulators, judged)
    return LayerReport(
        backend=backend.name,
        layers=tuple(layers),
        unmatched=(*unmatched, *hidden, *mismatched),
        first_divergence=first_divergence(layers, final),
        chunks=len(chunks),
        memory_budget=memory_budget,
        nodes_without_module=sum(1 for n in final.graph.node if module_path(_metadata(n)) is None),
        note=backend.note,
    )


def record_module_outputs(model: torch.nn.Module, io: IOSpec, feed: Feed) -> dict[str, ModuleOutput]:
    """Run ``model`` once with hooks on every submodule; record each one's output shape, dtype and finish order
    (its last call's). Only metadata is kept, not the tensors."""
    seen: dict[str, ModuleOutput] = {}
    counter = iter(range(1 << 62))

    def hook(path: str) -> Any:
        def record(module: torch.nn.Module, args: Any, output: Any) -> None:
            tensor = first_tensor(output)
            calls = seen[path].calls + 1 if path in seen else 1
            shape = tuple(tensor.shape) if tensor is not None else None
            dtype = str(tensor.dtype).removeprefix("torch.") if tensor is not None else None
            seen[path] = ModuleOutput(path, type(module).__name__, next(counter), calls, shape, dtype)

        return record

    handles = [m.register_forward_hook(hook(path)) for path, m in model.named_modules() if path]
    try:
        tensors = {k: tensor_from_array(v) for k, v in feed.items()}
        args, kwargs = io.feed_to_call(tensors)
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def match_modules(
    final: onnx.ModelProto, outputs: dict[str, ModuleOutput]
) -> tuple[list[LayerMatch], list[tuple[str, str, str]]]:
    """Each module's ONNX tensor (see the module docstring), in topological order; and the modules without one,
    with the reason."""
    types = _static_types(final)
    under: dict[str, list[int]] = {}
    for position, node in enumerate(final.graph.node):
        path = module_path(_metadata(node))
        while path:  # the node is under its module and every ancestor of it
            under.setdefault(path, []).append(position)
            path = path.rpartition(".")[0]
    matches, unmatched = [], []
    for out in outputs.values():
        if out.shape is None or out.dtype is None:
            unmatched.append((out.module, out.type_name, "returns no tensor"))
            continue
        found = _last_fitting(final, under.get(out.module, []), out, types)
        if isinstance(found, str):
            unmatched.append((out.module, out.type_name, found))
            continue
        position, tensor = found
        node = final.graph.node[position]
        graph_dtype = _DTYPE_NAME.get(int(types[tensor][0]), out.dtype or "float32")
        nbytes = int(np.prod(out.shape, dtype=np.int64)) * torch.empty((), dtype=getattr(torch, out.dtype)).itemsize
        matches.append(
            LayerMatch(
                out.module,
                out.type_name,
                tensor,
                node.name,
                node.op_type,
                position,
                out.order,
                out.calls,
                graph_dtype,
                nbytes,
            )
        )
    matches.sort(key=lambda m: (m.position, m.order))
    return matches, unmatched


def chunk_matches(matches: Sequence[LayerMatch], memory_budget: int) -> list[list[LayerMatch]]:
    """Consecutive groups of matches whose tensors fit ``memory_budget``: each distinct tensor costs its size
    once for ONNX Runtime and once per module recorded from PyTorch. A tensor larger than the budget gets a
    chunk of its own."""
    chunks: list[list[LayerMatch]] = []
    current: list[LayerMatch] = []
    used = 0
    tensors: set[str] = set()
    for m in matches:
        cost = m.nbytes * (1 if m.tensor in tensors else 2)
        if current and used + cost > memory_budget:
            chunks.append(current)
            current, used, tensors = [], 0, set()
            cost = 2 * m.nbytes
        current.append(m)
        used += cost
        tensors.add(m.tensor)
    if current:
        chunks.append(current)
    return chunks


def first_divergence(layers: Sequence[LayerComparison], final: onnx.ModelProto) -> Divergence | None:
    """The first layer outside tolerance with the ONNX nodes under its module and the suspects among them."""
    failing = next((layer for layer in layers if not layer.passed), None)
    if failing is None:
        return None
    prefix = failing.module + "."
    cleared = [layer.module + "." for layer in layers if layer.passed and layer.module.startswith(prefix)]
    nodes, suspects = [], []
    for node in final.graph.node:
        path = module_path(_metadata(node)) or ""
        if path == failing.module or path.startswith(prefix):
            nodes.append((node.name, node.op_type))
            if not any((path + ".").startswith(c) for c in cleared):
                suspects.append((node.name, node.op_type))
    return Divergence(failing, tuple(nodes), tuple(suspects))


def _results(
    matches: Sequence[LayerMatch], accumulators: dict[str, Accumulator], judged: dict[str, Judgement]
) -> tuple[list[LayerComparison], list[tuple[str, str, str]]]:
    """The compared layers, and the matches whose tensor turned out to have another shape at run time (so it was
    not the module's output after all: listed as unmatched)."""
    layers, mismatched = [], []
    for m in matches:
        stats = accumulators[m.module].result()
        if stats.shape_mismatch is not None:
            mismatched.append((m.module, m.type_name, f"its matched tensor {m.tensor} has {stats.shape_mismatch}"))
            continue
        tolerance = judged[m.module].tolerance
        layers.append(
            LayerComparison(
                m.module,
                m.type_name,
                m.tensor,
                m.node,
                m.op_type,
                m.dtype,
                m.calls,
                tolerance.atol,
                tolerance.rtol,
                stats,
                judged[m.module].computed_in,
                tolerance.rms_atol,
                tolerance.rms,
            )
        )
    return layers, mismatched


def _run_chunk(
    chunk: Sequence[LayerMatch],
    backend: Any,
    reference: torch.nn.Module,
    io: IOSpec,
    feeds: Sequence[Feed],
    accumulators: dict[str, Accumulator],
    float64: bool,
) -> None:
    """Run the backend runner and the hooked model on every feed and add each module's errors. The backend gets
    only the inputs it has: an engine whose outputs are early intermediates may have lost later-used inputs."""
    hooked = ModuleOutputRunner(reference, io, [m.module for m in chunk], float64=float64)
    with polygraphy_quiet(), backend, hooked:
        wanted = set(backend.get_input_metadata().keys())
        for feed in feeds:
            actual = backend.infer({name: value for name, value in feed.items() if name in wanted})
            expected = hooked.infer(feed)
            for m in chunk:
                if m.module in expected:
                    accumulators[m.module].add(np.asarray(actual[m.tensor]), np.asarray(expected[m.module]))


def _last_fitting(
    final: onnx.ModelProto,
    positions: Sequence[int],
    out: ModuleOutput,
    types: dict[str, tuple[int, tuple[int | None, ...] | None]],
) -> tuple[int, str] | str:
    """(node position, tensor) of the last node output under the module fitting its output; else the reason."""
    if not positions:
        return (
            "no ONNX node carries its name scope (folded into a constant, removed as an identity such as "
            "dropout in eval mode, or computed by its parent)"
        )
    wanted = _fitting_types(out.dtype or "")
    for position in reversed(positions):
        for tensor in reversed(final.graph.node[position].output):
            if not tensor or tensor not in types:
                continue
            elem_type, static = types[tensor]
            if elem_type in wanted and _shape_fits(static, out.shape or ()):
                return position, tensor
    shape = list(out.shape or ())
    kind = "float" if out.dtype in _FLOAT_TYPES else out.dtype
    return f"none of the {len(positions)} ONNX nodes under it produces a {kind} tensor of shape {shape}"


def _fitting_types(dtype: str) -> set[int]:
    """The graph types that can hold a module output of ``dtype``: any float type for a float (the graph's own
    precision), else exactly ``dtype``."""
    if dtype in _FLOAT_TYPES:
        return {_ONNX_TYPE[t] for t in _FLOAT_TYPES}
    return {_ONNX_TYPE[dtype]} if dtype in _ONNX_TYPE else set()


def _shape_fits(static: tuple[int | None, ...] | None, actual: tuple[int, ...]) -> bool:
    if static is None:
        return True  # no static shape: checked at run time
    return len(static) == len(actual) and all(s is None or s == a for s, a in zip(static, actual, strict=True))


def _static_types(final: onnx.ModelProto) -> dict[str, tuple[int, tuple[int | None, ...] | None]]:
    """Element type and shape (None for symbolic dims) of every typed tensor, after ONNX shape inference."""
    try:
        inferred = onnx.shape_inference.infer_shapes(final)
    except Exception as exc:  # e.g. a graph over 2 GiB; the graph's own value_info is used instead
        logger.info("shape inference failed (%s); matching by the graph's recorded types", exc)
        inferred = final
    types: dict[str, tuple[int, tuple[int | None, ...] | None]] = {}
    graph = inferred.graph
    for value in [*graph.value_info, *graph.output, *graph.input]:
        tensor_type = value.type.tensor_type
        shape = None
        if tensor_type.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim)
        types[value.name] = (tensor_type.elem_type, shape)
    return types


def _metadata(node: onnx.NodeProto) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}
