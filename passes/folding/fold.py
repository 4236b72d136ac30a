"""Constant folding with a size threshold, so large weights are not duplicated.

The pass does what ``graph.fold_constants(fold_shapes=True, size_threshold=..., error_ok=True)`` of onnx-graphsurgeon
0.6.1 does, step for step (:func:`fold_constants`), at a cost that grows linearly with the graph. graph-surgeon copies
the whole graph, walks the copy several times and changes it to find what is foldable; here that analysis runs on the
graph itself, recording what the copy would change instead of changing a copy. The foldable nodes are then evaluated
on ONNX Runtime (:mod:`passes.folding.evaluation`), and their results replace them as graph-surgeon replaces them.

Graphs with subgraphs, local functions, tensor names used by distinct tensors, tensors with several producers or
graph inputs with a producer go to graph-surgeon itself.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.exporters.onnx_exporter import dtype_to_onnx
from onnx_graphsurgeon.importers.onnx_importer import get_itemsize
from onnx_graphsurgeon.util import misc

from converters.settings import Settings
from passes.base import PassResult
from passes.cleanup.graph import is_flat, is_sorted, remove_unused
from passes.folding.evaluation import evaluate
from passes.model_io.external_data import constant_values

logger = logging.getLogger(__name__)

#: IR version 10 (onnx 1.16) is read by every ONNX Runtime this project supports.
FOLDING_IR_VERSION = 10

# Q/DQ stay for TensorRT; random draws must stay draws (folded, every call would return the same sample)
_NO_FOLD_OPS = frozenset(
    {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
    | {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"}
)
_CONSTANT_ATTRS = frozenset({"value", "value_float", "value_floats", "value_int", "value_ints"})
_CAST_ELISION_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Greater", "Less", "Concat"})


class FoldConstants:
    """Evaluate nodes whose inputs are all constant (on ONNX Runtime, as graph-surgeon's folding does).

    A folded result larger than ``settings.fold_size_threshold`` bytes is not materialised: folding a Transpose
    of a weight that other nodes still read would otherwise store the weight twice. Shape computations on static
    shapes are folded too (``fold_shapes``).
    """

    name = "fold_constants"

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        before = _fingerprint(graph)
        if graph.ir_version is None:
            # graph-surgeon folds by exporting to ONNX Runtime; without an IR version it writes onnx's newest,
            # which ONNX Runtime may reject, and the fold then fails silently.
            graph.ir_version = FOLDING_IR_VERSION
        linear = fold_constants(graph, settings.fold_size_threshold)
        if not linear:
            graph.fold_constants(fold_shapes=True, size_threshold=settings.fold_size_threshold, error_ok=True)
        remove_unused(graph)
        # Settled: a second run finds every Constant node lowered, every cast pattern elided and every foldable node
        # folded, or left for a reason that holds again (size, an op ONNX Runtime cannot run). graph-surgeon's own
        # folding of subgraphs can inline a branch whose nodes fold on the next run.
        return PassResult(graph, _fingerprint(graph) != before, settled=linear)


def _fingerprint(graph: gs.Graph) -> tuple[int, int]:
    constants = 0
    for node in graph.nodes:
        for tensor in node.inputs:
            if isinstance(tensor, gs.Constant):
                constants += 1
    return len(graph.nodes), constants


def fold_constants(graph: gs.Graph, size_threshold: int | None) -> bool:
    """``graph.fold_constants(fold_shapes=True, size_threshold=size_threshold, error_ok=True)``; False (graph
    untouched) when the graph is not one this function takes (see the module doc)."""
    tensors = _tensor_map(graph)
    if tensors is None:
        return False
    # graph-surgeon takes the tensors again after these two steps. Neither changes the producer of a Gather, Slice or
    # Shape output (the order the shape folding visits), and a tensor they leave unused changes nothing below.
    _lower_constant_nodes(tensors)
    _elide_shape_casts(graph)
    analysis = _Analysis(graph, tensors)
    analysis.find_foldable()
    analysis.fold_shapes()
    outputs = analysis.outputs_to_evaluate(size_threshold)
    values: dict[str, Any] = dict(analysis.folded)  # graph-surgeon also lists the constants, then skips them
    if outputs:
        nodes = analysis.nodes_computing(outputs)
        values.update(evaluate(graph, nodes, outputs, analysis.folded))
    _replace(tensors, values, size_threshold)
    return True


def _tensor_map(graph: gs.Graph) -> dict[str, gs.Tensor] | None:
    """``graph.tensors()`` (same names, same order), or None when a name is shared by distinct tensors, a tensor
    has several producers, or a graph input has a producer."""
    if not is_flat(graph) or any(t.inputs for t in graph.inputs):
        return None
    tensors: dict[str, gs.Tensor] = {}

    def add(items: Iterable[gs.Tensor]) -> bool:
        for tensor in items:
            if tensor.name:
                known = tensors.setdefault(tensor.name, tensor)
                if known is not tensor or len(tensor.inputs) > 1:
                    return False
        return True

    if not add(graph.inputs):
        return None
    for node in graph.nodes:
        if not (add(node.inputs) and add(node.outputs)):
            return None
    return tensors if add(graph.outputs) else None


def _lower_constant_nodes(tensors: dict[str, gs.Tensor]) -> None:
    """graph-surgeon's pass 1: the output of a ``Constant`` node becomes a constant tensor."""
    for tensor in list(tensors.values()):
        if len(tensor.inputs) != 1 or tensor.inputs[0].op != "Constant":
            continue
        node = tensor.inputs[0]
        if len(node.attrs) != 1:
            logger.warning("Constant node %s must contain exactly one attribute", node.name)
            continue
        name, value = next(iter(node.attrs.items()))
        if name not in _CONSTANT_ATTRS:
            logger.warning("Unsupported attribute for Constant node %s: %s", node.name, name)
            continue
        if isinstance(value, gs.Node.AttributeRef):
            continue
        tensor.to_constant(value._values if isinstance(value, gs.Constant) else np.array(value))
        tensor.inputs.clear()


def _elide_shape_casts(graph: gs.Graph) -> None:
    """graph-surgeon's pass 2, unchanged: ``Cast(int -> float) -> op -> Cast(back to int)`` on shape values
    computes in the integer type (TensorRT does not take float shape tensors)."""
    try:
        for node in graph.nodes:
            _elide_casts_around(node, graph)
    except Exception as exc:  # error_ok: graph-surgeon logs and goes on
        logger.warning("'Shape tensor cast elision' routine failed with: %s", exc)


def _elide_casts_around(node: gs.Node, graph: gs.Graph) -> None:
    if node.op not in _CAST_ELISION_OPS:
        return
    for out_tensor in node.outputs:
        if out_tensor in graph.outputs or any(out_node.op != "Cast" for out_node in out_tensor.outputs):
            return
    inp_casts = [
        inp_node
        for inp_tensor in node.inputs
        for inp_node in inp_tensor.inputs
        if inp_node.op == "Cast" and inp_node.attrs["to"] == onnx.TensorProto.DataType.FLOAT
    ]
    if not inp_casts:
        return
    inp_dtypes = [dtype_to_onnx(inp_cast.inputs[0].dtype) for inp_cast in inp_casts]
    if len(set(inp_dtypes)) != 1:
        return
    final_type = inp_dtypes[0]
    out_casts = [
        out_node
        for out_tensor in node.outputs
        for out_node in out_tensor.outputs
        if out_node.op == "Cast"
        and out_node.attrs["to"] in [onnx.TensorProto.DataType.INT32, onnx.TensorProto.DataType.INT64]
    ]
    if not out_casts:
        return
    out_dtypes = [out_cast.attrs["to"] for out_cast in out_casts]
    if len(set(out_dtypes)) != 1 or out_dtypes[0] != final_type:
        return
    for index, inp in enumerate(node.inputs):
        if isinstance(inp, gs.Constant):
            inp.values = inp.values.astype(onnx.helper.tensor_dtype_to_np_dtype(final_type))
        for cast in inp_casts:
            if cast.outputs[0] == inp:
                node.inputs[index] = cast.inputs[0]
    for index, out in enumerate(node.outputs):
        for cast in out_casts:
            if cast.inputs[0] == out:
                out_tensor = cast.outputs[0]
                out_tensor.inputs.clear()
                node.outputs[index] = out_tensor


class _Analysis:
    """graph-surgeon's passes 3 and 4 on its copy of the graph, without the copy.

    ``constants`` is graph-surgeon's ``graph_constants`` (name -> tensor, in the same order); ``folded`` holds the
    shape values graph-surgeon's copy turns into constants (the graph itself is left alone until the end).
    """

    def __init__(self, graph: gs.Graph, tensors: dict[str, gs.Tensor]) -> None:
        self.graph = graph
        self.tensors = tensors
        self.constants: dict[str, gs.Tensor] = {n: t for n, t in tensors.items() if isinstance(t, gs.Constant)}
        self.folded: dict[str, np.ndarray] = {}
        self._foldable_nodes: set[int] = set()
        self._sorted = is_sorted(graph)
        self._position: dict[int, int] | None = None

    def is_constant(self, tensor: gs.Tensor) -> bool:
        return isinstance(tensor, gs.Constant) or tensor.name in self.folded

    def shape(self, tensor: gs.Tensor) -> Any:
        return self.folded[tensor.name].shape if tensor.name in self.folded else tensor.shape

    def dtype(self, tensor: gs.Tensor) -> Any:
        return self.folded[tensor.name].dtype if tensor.name in self.folded else tensor.dtype

    def values(self, tensor: gs.Tensor) -> Any:
        """Read without caching: graph-surgeon loads lazy values on its copy, leaving the graph's as they are."""
        return self.folded[tensor.name] if tensor.name in self.folded else constant_values(tensor)

    def producers(self, tensor: gs.Tensor) -> Sequence[gs.Node]:
        return () if tensor.name in self.folded else tensor.inputs

    def find_foldable(self) -> None:
        """``update_foldable_outputs``: a sweep over the nodes in graph order, marking those whose inputs are all
        constant (their outputs become constants)."""
        for node in self.graph.nodes:
            if id(node) not in self._foldable_nodes and self._foldable(node):
                self._mark(node)

    def refresh(self, new: Sequence[gs.Tensor]) -> None:
        """The sweep graph-surgeon repeats after each kind of shape folding, when ``new`` became constant. In a
        topologically sorted graph only the consumers of ``new``, and theirs, can change, and they are visited in
        graph order; otherwise every node is visited again."""
        if not self._sorted:
            self.find_foldable()
            return
        if self._position is None:
            self._position = {id(node): i for i, node in enumerate(self.graph.nodes)}
        position = self._position
        heap = [position[id(c)] for t in new for c in t.outputs if id(c) in position]
        heapq.heapify(heap)
        nodes = self.graph.nodes
        visited: set[int] = set()
        while heap:
            i = heapq.heappop(heap)
            node = nodes[i]
            if i in visited or id(node) in self._foldable_nodes:
                continue
            visited.add(i)
            if self._foldable(node):
                self._mark(node)
                for consumer in (c for t in node.outputs for c in t.outputs if id(c) in position):
                    heapq.heappush(heap, position[id(consumer)])

    def _mark(self, node: gs.Node) -> None:
        self._foldable_nodes.add(id(node))
        self.constants.update({out.name: out for out in node.outputs})

    def _foldable(self, node: gs.Node) -> bool:
        if node.op in _NO_FOLD_OPS:
            return False
        if node.op == "Cast" and node.attrs.get("to") == onnx.TensorProto.UINT8:
            return False  # TensorRT takes no UInt8 constant, only a Cast to it (parser_fixes.uint8_constants)
        if not all(t.name in self.constants for t in node.inputs if t.name):
            return False
        return not any(isinstance(v, gs.Node.AttributeRef) for v in node.attrs.values())

    def fold_shapes(self) -> None:
        """Pass 4: Gather, then Slice, then Shape of a tensor with a static shape; foldability updated after each
        kind, as graph-surgeon does (and, as there, an error stops that kind only)."""
        kinds = (("Gather", self._shape_gather), ("Slice", self._shape_slice), ("Shape", self._shape))
        candidates: dict[str, list[gs.Tensor]] = {op: [] for op, _ in kinds}
        for tensor in self.tensors.values():  # graph-surgeon asks every tensor; only these can answer
            if len(tensor.inputs) == 1 and tensor.inputs[0].op in candidates:
                candidates[tensor.inputs[0].op].append(tensor)
        new: list[gs.Tensor] = []  # constant since the last sweep (a kind that fails is not followed by one)
        for op, fold in kinds:
            try:
                for tensor in candidates[op]:
                    value = fold(tensor)
                    if value is not None:
                        self.folded[tensor.name] = value
                        self.constants[tensor.name] = tensor
                        new.append(tensor)
            except Exception as exc:
                logger.warning("'%s' routine failed with:\n%s", f"fold_shape_{op.lower()}", exc)
            else:
                self.refresh(new)
                new = []

    def _producer(self, tensor: gs.Tensor, op: str) -> gs.Node | None:
        producers = self.producers(tensor)
        if len(producers) != 1 or producers[0].op != op:
            return None
        return producers[0]

    def _shape_input(self, node: gs.Node | None) -> gs.Tensor | None:
        if node is None:
            return None
        tensor = node.inputs[0]
        return None if tensor.name in self.constants else tensor

    def _scalar(self, tensor: gs.Tensor) -> Any:
        return self.values(tensor) if not self.shape(tensor) else list(self.values(tensor))[0]

    def _shape(self, tensor: gs.Tensor) -> np.ndarray | None:
        inp = self._shape_input(self._producer(tensor, "Shape"))
        if inp is None or inp.shape is None or misc.is_dynamic_shape(inp.shape):
            return None
        return np.array(inp.shape, dtype=np.int64)

    def _shape_gather(self, tensor: gs.Tensor) -> np.ndarray | None:
        gather = self._producer(tensor, "Gather")
        if gather is None:
            return None
        data, indices_tensor = gather.inputs[0], gather.inputs[1]
        inp = self._shape_input(self._producer(data, "Shape"))
        if inp is None or inp.shape is None or not self.is_constant(indices_tensor):
            return None
        indices = self.values(indices_tensor)
        if not indices.shape:
            shape = inp.shape[int(indices)]
            if misc.is_dynamic_dimension(shape):
                return None
        else:
            shape = [inp.shape[index] for index in indices]
            if misc.is_dynamic_shape(shape):
                return None
        return np.array(shape, dtype=np.int64)

    def _shape_slice(self, tensor: gs.Tensor) -> np.ndarray | None:
        node = self._producer(tensor, "Slice")
        if node is None:
            return None
        data = node.inputs[0]
        if len(node.inputs) >= 3:
            starts, ends = node.inputs[1:3]
            if not (self.is_constant(starts) and self.is_constant(ends)):
                return None
            starts, ends = self._scalar(starts), self._scalar(ends)
        elif "starts" in node.attrs and "ends" in node.attrs:
            starts, ends = node.attrs["starts"][0], node.attrs["ends"][0]
        else:
            return None
        inp = self._shape_input(self._producer(data, "Shape"))
        if inp is None or inp.shape is None:
            return None
        if len(node.inputs) > 3:
            axes = node.inputs[3]
            if not self.is_constant(axes) or self._scalar(axes) != 0:
                return None
        elif "axes" in node.attrs and node.attrs["axes"][0] != 0:
            return None
        steps = 1
        if len(node.inputs) > 4:
            if not self.is_constant(node.inputs[4]):
                return None
            steps = self._scalar(node.inputs[4])
        elif "steps" in node.attrs:
            steps = node.attrs["steps"][0]
        shape = inp.shape[starts:ends:steps]
        if misc.is_dynamic_shape(shape):
            return None
        return np.array(shape, dtype=np.int64)

    def outputs_to_evaluate(self, size_threshold: int | None) -> list[gs.Tensor]:
        """``should_eval_foldable`` over the constants, as graph-surgeon writes it (it compares consumer node names
        with tensor names, so in effect every foldable tensor with a consumer, or none, is evaluated)."""
        outputs = []
        for tensor in self.constants.values():
            shape, dtype = self.shape(tensor), self.dtype(tensor)
            non_const = not self.is_constant(tensor)
            is_graph_output = not tensor.outputs
            has_non_foldable_outputs = any(out.name not in self.constants for out in tensor.outputs)
            known = shape is not None and not misc.is_dynamic_shape(shape) and dtype is not None
            exceeds = (known and size_threshold is not None) and (
                misc.volume(shape) * get_itemsize(dtype) > size_threshold
            )
            if non_const and (is_graph_output or has_non_foldable_outputs) and not exceeds:
                outputs.append(tensor)
        return outputs

    def nodes_computing(self, outputs: Sequence[gs.Tensor]) -> list[gs.Node]:
        """The nodes graph-surgeon's cleanup keeps in its copy for ``outputs``, in graph order."""
        seen = {t.name for t in outputs if t.name}
        queue = list(outputs)
        needed: set[int] = set()
        position = 0
        while position < len(queue):
            tensor = queue[position]
            position += 1
            for producer in self.producers(tensor):
                needed.add(id(producer))
                for inp in producer.inputs:  # an omitted input has no producer in graph-surgeon's copy
                    if inp.name and inp.name not in seen:
                        seen.add(inp.name)
                        queue.append(inp)
        return [node for node in self.graph.nodes if id(node) in needed]


def _replace(tensors: dict[str, gs.Tensor], values: dict[str, Any], size_threshold: int | None) -> None:
    """Pass 5's end: each evaluated or shape-folded tensor becomes a constant, unless it is over the threshold."""
    large: dict[str, int] = {}
    for name, value in values.items():
        tensor = tensors[name]
        if isinstance(tensor, gs.Constant):
            continue
        if size_threshold is not None and value.nbytes > size_threshold:
            logger.debug("not folding %s: %d bytes is over the threshold of %d", name, value.nbytes, size_threshold)
            continue
        if size_threshold is None and value.nbytes > (1 << 20):
            large[name] = value.nbytes
        tensor.to_constant(value)
        tensor.inputs.clear()
    if large:
        logger.warning("folded large tensors (set fold_size_threshold to keep them computed): %s", large)
