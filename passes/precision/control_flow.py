"""Control flow under the precision pass: a Loop, If or Scan runs in float32 with its bodies whole, an island.

Why an island, not retyped bodies: the Loop bodies this project emits are recurrences (the orthogonal polynomials'
three-term recurrence, iterative eigen solvers, series for the incomplete gamma function) whose rounding grows with
every step and whose stopping tests compare against float32 epsilons a half type cannot reach; a retyped body would
also need every rule of this pass applied inside it, with carried values and scan outputs agreeing on one type
across iterations. An If's branches run once, so converting each like the outer graph (its outer reads and outputs
as a float32 boundary) would be sound and would speed up torch.cond models with heavy branches; it is not done
because the pipeline's safety nets see the outer graph only: range measurement and the accuracy search move
top-level nodes, so a branch that overflows could not be rescued, and ONNX Runtime runs half graphs through a
float32 emulation that rounds top-level values only (``pipeline/runtime/ort/half_emulation.py``), so a bfloat16 branch
would not even run there (no bfloat16 Gemm kernel).

So the node keeps float32 and the casts sit at its boundary: its explicit inputs and outputs (as for any float32
island), and the outer-scope values its bodies read by name, which the rest of the graph may have turned low. Those
are the ones easy to miss: ONNX Runtime then refuses the graph (``Graph attribute inferencing failed ... Tensor
element type mismatch. 1 != 10``).

>>> for tensor in outer_references(loop):   # doctest: +SKIP
...     replace_in_bodies(loop, tensor, cast_to_float32(tensor))
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx_graphsurgeon as gs


def has_bodies(node: gs.Node) -> bool:
    """Does the node hold subgraphs (Loop's body, If's branches, Scan's body)?"""
    return any(isinstance(value, gs.Graph) for value in node.attrs.values())


def bodies(node: gs.Node) -> Iterator[gs.Graph]:
    """The node's subgraphs, nested ones included (a Loop in a Loop's body), outermost first."""
    for value in node.attrs.values():
        if isinstance(value, gs.Graph):
            yield value
            for inner in value.nodes:
                yield from bodies(inner)


def outer_references(node: gs.Node) -> list[gs.Variable]:
    """The variables the node's bodies read from the scope around ``node`` (not the node's explicit inputs), in the
    order first read. Constants are left out: graph-surgeon exports every constant a body reads into that body."""
    found: dict[int, gs.Variable] = {}
    for body in _direct_bodies(node):
        _collect(body, set(), found)
    return list(found.values())


def _direct_bodies(node: gs.Node) -> Iterator[gs.Graph]:
    return (value for value in node.attrs.values() if isinstance(value, gs.Graph))


def _collect(body: gs.Graph, enclosing: set[int], found: dict[int, gs.Variable]) -> None:
    """Add to ``found`` what ``body`` (or a body nested in it) reads that neither it nor ``enclosing`` defines."""
    local = enclosing | {id(t) for t in body.inputs} | {id(t) for n in body.nodes for t in n.outputs}
    read = [t for inner in body.nodes for t in inner.inputs] + list(body.outputs)  # an output may be an outer value
    for tensor in read:
        if isinstance(tensor, gs.Variable) and tensor.name and id(tensor) not in local:
            found.setdefault(id(tensor), tensor)
    for inner in body.nodes:
        for nested in _direct_bodies(inner):
            _collect(nested, local, found)


def replace_in_bodies(node: gs.Node, old: gs.Tensor, new: gs.Tensor) -> int:
    """Every node of ``node``'s bodies (nested ones included) that reads ``old`` reads ``new``, and a body output that
    is ``old`` becomes ``new``; returns how many places changed. Compared by identity (graph-surgeon's ``==``
    compares names)."""
    count = 0
    for body in bodies(node):
        for position, tensor in enumerate(body.outputs):
            if tensor is old:
                body.outputs[position] = new
                count += 1
        for inner in body.nodes:
            for index, tensor in enumerate(inner.inputs):
                if tensor is old:
                    inner.inputs[index] = new
                    count += 1
    return count
