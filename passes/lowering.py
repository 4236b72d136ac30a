"""The lowering pass: every opaque custom-op node, and every targeted standard op, replaced by its converter.

After it, no custom-domain node remains unless a converter chose a plugin (a node with ``plugin_namespace``);
otherwise the error lists each unconverted op with its count, one node, the PyTorch module it came from, and the
decorator line to write.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from converters.context import ConverterContext
from converters.errors import ConversionError, PipelineError
from converters.registry import ConverterEntry, ConverterRegistry
from converters.settings import Settings
from converters.targets import OpKey, node_key
from passes.base import PassResult
from passes.cleanup.graph import remove_unused, toposort
from passes.model_io.graphs import module_path
from passes.rewiring import replace_outputs

logger = logging.getLogger(__name__)

#: Domains whose nodes are not opaque custom ops: ONNX itself, ONNX Runtime's, onnxruntime-extensions', TensorRT's.
KNOWN_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "ai.onnx.contrib", "trt"})


class LowerCustomOps:
    """Apply ``registry`` to every node it has converters for, then insist no opaque node is left."""

    name = "lower_custom_ops"

    def __init__(self, registry: ConverterRegistry) -> None:
        self.registry = registry

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        modified = False
        unconverted: dict[OpKey, list[tuple[gs.Node, tuple[tuple[ConverterEntry, str], ...]]]] = {}
        for node in list(graph.nodes):
            if getattr(node, "converted_by", None):  # built by a converter: never lowered again
                continue
            key = node_key(node.domain, node.op)
            if key not in self.registry:
                if _is_opaque(node, graph):
                    unconverted.setdefault(key, []).append((node, ()))
                continue
            selection = self.registry.select(node, key, settings, dynamic=_has_dynamic_input(node))
            if selection.entry is None:
                if _is_opaque(node, graph) or any(not e.supports_dynamic_shapes for e, _ in selection.skipped):
                    unconverted.setdefault(key, []).append((node, selection.skipped))
                continue
            _replace(graph, node, key, selection.entry, settings)
            modified = True
        if unconverted:
            raise ConversionError(_unconverted_message(unconverted), fix=_FIX)
        if modified:
            toposort(remove_unused(graph))
        return PassResult(graph, modified)


_FIX = (
    "register a converter for each op listed (README, 'Writing a converter'): it receives a ConverterContext and "
    "returns the output tensors it built with ctx.op.<OnnxOp>(...)"
)


def _replace(graph: gs.Graph, node: gs.Node, key: OpKey, entry: ConverterEntry, settings: Settings) -> None:
    ctx = ConverterContext(graph, node, key, settings, entry.torch_op)
    try:
        result = entry.function(ctx)
    except PipelineError:
        raise
    except Exception as exc:
        raise ConversionError(
            f"converter {entry.name} for {key} raised {type(exc).__name__}: {exc}",
            node=node.name,
            fix="fix the converter; ctx.inputs, ctx.attrs, ctx.input_shapes show what it was given",
        ) from exc
    outputs = [result] if isinstance(result, gs.Tensor) else list(result or ())
    _check_outputs(ctx, entry, outputs)
    for created in ctx.created:
        created.converted_by = entry.name
        created.metadata = getattr(node, "metadata", {})
    logger.info("node %s (%s) converted by %s into %d nodes", node.name, key, entry.name, len(ctx.created))
    replace_outputs(graph, node, outputs, ctx)


def _check_outputs(ctx: ConverterContext, entry: ConverterEntry, outputs: Sequence[Any]) -> None:
    expected = ctx.node.outputs
    where = f"converter {entry.name} for {ctx.key}"
    if len(outputs) != len(expected) or not all(isinstance(t, gs.Tensor) for t in outputs):
        raise ConversionError(
            f"{where} returned {len(outputs)} value(s) ({', '.join(type(t).__name__ for t in outputs) or 'nothing'}); "
            f"the node has {len(expected)} output tensor(s)",
            node=ctx.name,
            fix="return one tensor per output of the node (a list or tuple for several), built with ctx.op",
        )
    inferred = _infer_types(ctx, outputs)
    for i, (old, (dtype, rank)) in enumerate(zip(expected, inferred, strict=True)):
        want_dtype = None if old.dtype is None else np.dtype(old.dtype)
        want_rank = None if old.shape is None else len(old.shape)
        if dtype is not None and want_dtype is not None and dtype != want_dtype:
            raise ConversionError(
                f"{where}: output {i} is {dtype}, the op's output is {want_dtype}",
                node=ctx.name,
                fix=f"cast it: ctx.op.Cast(x, to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype('{want_dtype}')))",
            )
        if rank is not None and want_rank is not None and rank != want_rank:
            raise ConversionError(
                f"{where}: output {i} has rank {rank}, the op's output has rank {want_rank}",
                node=ctx.name,
                fix="reshape or unsqueeze the result to the op's output rank",
            )


def _infer_types(ctx: ConverterContext, outputs: Sequence[gs.Tensor]) -> list[tuple[np.dtype | None, int | None]]:
    """Output dtypes and ranks of what the converter built, by ONNX shape inference on just those nodes."""
    unknown: list[tuple[np.dtype | None, int | None]] = [(None, None)] * len(outputs)
    produced = {id(t) for n in ctx.created for t in n.outputs}
    external = {
        id(t): t
        for n in ctx.created
        for t in n.inputs
        if isinstance(t, gs.Variable) and t.name and id(t) not in produced
    }
    if any(t.dtype is None for t in external.values()) or not all(id(t) in produced for t in outputs):
        return unknown
    mini = gs.Graph(
        nodes=list(ctx.created), inputs=list(external.values()), outputs=list(outputs), opset=ctx.graph.opset
    )
    try:
        model = onnx.shape_inference.infer_shapes(gs.export_onnx(mini, do_type_check=False))
    except Exception:  # inference is a check, not a requirement: a custom node inside stops it
        return unknown
    types = {v.name: v.type.tensor_type for v in (*model.graph.value_info, *model.graph.output)}
    result: list[tuple[np.dtype | None, int | None]] = []
    for t in outputs:
        tensor_type = types.get(t.name)
        if tensor_type is None or not tensor_type.elem_type:
            result.append((None, None))
            continue
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
        rank = len(tensor_type.shape.dim) if tensor_type.HasField("shape") else None
        result.append((dtype, rank))
    return result


def _has_dynamic_input(node: gs.Node) -> bool:
    return any(
        isinstance(t, gs.Variable) and t.shape is not None and any(not isinstance(d, int) for d in t.shape)
        for t in node.inputs
    )


def _is_opaque(node: gs.Node, graph: gs.Graph) -> bool:
    domain = node.domain or ""
    if domain in KNOWN_DOMAINS or "plugin_namespace" in node.attrs:
        return False
    return not any(f.domain == domain and f.name == node.op for f in graph.functions)


def _unconverted_message(unconverted: dict[OpKey, list[tuple[gs.Node, Any]]]) -> str:
    lines = [f"{len(unconverted)} op(s) have no converter that accepts them:"]
    for key, nodes in sorted(unconverted.items()):
        node, skipped = nodes[0]
        module = module_path(getattr(node, "metadata", {}) or {})
        origin = "" if module is None else f" from module {module or '(the root module)'!r}"
        lines.append(
            f"  {key} x{len(nodes)}, e.g. node {node.name!r}{origin}; write: @converters.register({str(key)!r})"
        )
        lines += [f"      skipped {entry.name}: {reason}" for entry, reason in skipped]
    return "\n".join(lines)
