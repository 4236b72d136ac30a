"""Outputs that are uninitialised memory: found in the exported program, judged by shape and dtype only.

``torch.empty``, ``new_empty``, ``empty_like``, ``empty_strided``, ``new_empty_strided``, ``empty_permuted``
allocate without writing: their values are whatever the memory held, in PyTorch as in the graph (the exporter
turns them into zeros, often folded into a constant). When such a tensor reaches a graph output directly or
through views (or value-preserving copies: ``clone``, ``contiguous``, a ``*_copy`` view), there is nothing to
compare value by value, so the output is judged by :data:`RULE`. The export stage records these outputs in the
ONNX model's ``metadata_props`` (:data:`METADATA_KEY`), read back by :func:`uninitialised_outputs`, so the
information travels with the graph through the passes, the artifact and the validation. An output computed from
uninitialised memory by anything else (``empty(...) + 1``) is still compared value by value: it fails loudly
rather than passing on a guess.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch

logger = logging.getLogger(__name__)

#: The key of the ONNX model's ``metadata_props`` entry: JSON, output name -> the allocating node.
METADATA_KEY = "torch_trt_pipeline.uninitialised_outputs"

#: ATen ops whose result is allocated and not written.
EMPTY_OPS: frozenset[Any] = frozenset(
    {
        torch.ops.aten.empty,
        torch.ops.aten.empty_like,
        torch.ops.aten.empty_strided,
        torch.ops.aten.new_empty,
        torch.ops.aten.new_empty_strided,
        torch.ops.aten.empty_permuted,
    }
)

#: Ops that pass their first argument's values through unchanged, besides views (``OpOverload.is_view``).
_VALUE_PRESERVING: frozenset[Any] = frozenset(
    {
        torch.ops.aten.clone,
        torch.ops.aten.contiguous,
        torch.ops.aten.alias,
        torch.ops.aten.lift_fresh_copy,
        torch.ops.aten.detach,
    }
)

RULE = (
    "an output that is uninitialised memory (an empty tensor reaching it directly or through views) is judged by "
    "shape and dtype only: its values are whatever the memory held, in PyTorch as in the graph"
)


def uninitialised_in_program(program: torch.export.ExportedProgram | None, names: Sequence[str]) -> dict[str, str]:
    """The user outputs of ``program`` (named ``names``, in order) that are uninitialised memory -> the
    allocating node (``"aten.new_empty.default 'new_empty'"``); ``{}`` when the outputs cannot be matched."""
    from torch.export.graph_signature import OutputKind, TensorArgument

    if program is None:
        return {}
    nodes = {node.name: node for node in program.graph.nodes}
    outputs = [s.arg for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    tensors = [a for a in outputs if isinstance(a, TensorArgument)]
    if len(tensors) != len(names):
        logger.debug("uninitialised outputs not looked for: %d tensor outputs, %d names", len(tensors), len(names))
        return {}
    found = {}
    for name, argument in zip(names, tensors, strict=True):
        source = _allocation(nodes.get(argument.name))
        if source is not None:
            found[name] = source
    return found


def _allocation(node: torch.fx.Node | None) -> str | None:
    """The empty-allocating node whose values ``node`` holds, following views and value-preserving copies."""
    while node is not None and node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        packet = node.target.overloadpacket
        if packet in EMPTY_OPS:
            return f"{node.target} {node.name!r}"
        preserving = node.target.is_view or packet in _VALUE_PRESERVING
        preserving = preserving or torch.Tag.view_copy in node.target.tags
        if not preserving or not node.args or not isinstance(node.args[0], torch.fx.Node):
            return None
        node = node.args[0]
    return None


def mark_uninitialised(model: onnx.ModelProto, found: dict[str, str]) -> None:
    """Record ``found`` (output name -> allocating node) in ``model``'s ``metadata_props`` (nothing if empty)."""
    kept = [p for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    if found:
        model.metadata_props.add(key=METADATA_KEY, value=json.dumps(found, sort_keys=True))


def uninitialised_outputs(model: onnx.ModelProto) -> dict[str, str]:
    """The graph outputs recorded as uninitialised memory (output name -> allocating node), still outputs of
    ``model``'s graph."""
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            recorded = json.loads(prop.value)
            outputs = {o.name for o in model.graph.output}
            return {str(k): str(v) for k, v in recorded.items() if k in outputs}
    return {}


@dataclass(frozen=True)
class ShapeStats:
    """An uninitialised output against PyTorch's, over all inputs: compared by shape and dtype only."""

    elements: int
    source: str
    mismatch: str | None = None

    @property
    def passed(self) -> bool:
        """Shapes and kinds of values (bool, integer, float) agree on every input."""
        return self.mismatch is None

    @property
    def outside(self) -> int:
        """Elements outside the rule: none when shapes and dtypes agree, all of them otherwise."""
        return 0 if self.passed else self.elements

    @property
    def note(self) -> str:
        """The verdict in words, for reports and errors."""
        what = f"uninitialised memory (from {self.source}): judged by shape and dtype only, not by value"
        return what + (f": {self.mismatch}" if self.mismatch else "")

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready data."""
        return {"elements": self.elements, "source": self.source, "mismatch": self.mismatch, "note": self.note}


class ShapeAccumulator:
    """Add one (actual, reference) pair per input; ``result()`` says whether shapes and dtypes agreed on all.

    >>> acc = ShapeAccumulator("aten.new_empty.default 'new_empty'")
    >>> acc.add(np.zeros((2, 3), np.float32), np.full((2, 3), 1e30, np.float32))
    >>> acc.result().passed
    True
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.elements = 0
        self.mismatch: str | None = None

    def add(self, actual: np.ndarray, reference: np.ndarray) -> None:
        """Check one pair's shapes and dtypes."""
        actual, reference = np.asarray(actual), np.asarray(reference)
        self.elements += int(actual.size)
        if actual.shape != reference.shape:
            self.mismatch = f"shape {list(actual.shape)} against the reference's {list(reference.shape)}"
        elif _kind(actual) != _kind(reference):  # a float64 output may come back as the float32 it is computed in
            self.mismatch = f"{_kind(actual)} values against the reference's {_kind(reference)} values"

    def result(self) -> ShapeStats:
        """The verdict over every pair added."""
        return ShapeStats(self.elements, self.source, self.mismatch)


def _kind(array: np.ndarray) -> str:
    if array.dtype == np.bool_:
        return "bool"
    return "integer" if np.issubdtype(array.dtype, np.integer) else "float"
