"""Pattern rewrites: declare a pattern and a replacement; the matcher hands bindings to the rewrite.

A rule is pattern + check + rewrite (as in onnxscript's rewriter). ``check`` is pure and returns the reason a
candidate was rejected (``None`` accepts), so "why didn't my rule match here?" has an answer:
``rule.explain(graph, node_name)``. Matching is deterministic (nodes in graph order, rules in tuple order). A
pattern rule is one kind of :class:`passes.rules.RewriteRule`, run by :class:`passes.rules.RulePass`.
We do not build on graph-surgeon's GraphPattern: upstream reports false positives in 0.5.9 and duplicated nodes
in 0.6.1.

>>> rule = Rule("div_by_const", Op("Div", Var("x"), Const("c", lambda v: np.all(v != 0))),
...             lambda b, ctx: ctx.op.Mul(b["x"], ctx.constant((1 / b.constants["c"]).astype(np.float32))))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from converters.context import ConverterContext
from passes.rules import Facts, RewriteContext, RewriteRule


@dataclass(frozen=True)
class Var:
    """Any tensor; the same name used twice must bind the same tensor."""

    name: str


@dataclass(frozen=True)
class Const:
    """A constant tensor (initializer or Constant node), optionally constrained by a predicate on its value."""

    name: str
    value: Callable[[np.ndarray], Any] | None = None


@dataclass(frozen=True)
class Op:
    """A node: op type(s), input patterns, attribute constraints (values or predicates), optional binding name.

    ``commutative=True`` also tries the two inputs swapped. ``outputs`` is the number of node outputs the
    rewrite must return when this is the rule's root.
    """

    op: str | tuple[str, ...]
    inputs: tuple[Var | Const | Op, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    name: str | None = None
    domain: str = ""
    commutative: bool = False
    outputs: int = 1

    def __init__(
        self,
        op: str | tuple[str, ...],
        *inputs: Var | Const | Op,
        attrs: Mapping[str, Any] | None = None,
        name: str | None = None,
        domain: str = "",
        commutative: bool = False,
        outputs: int = 1,
    ) -> None:
        for key, value in (
            ("op", op),
            ("inputs", tuple(inputs)),
            ("attrs", dict(attrs or {})),
            ("name", name),
            ("domain", domain),
            ("commutative", commutative),
            ("outputs", outputs),
        ):
            object.__setattr__(self, key, value)


class Bindings(dict[str, Any]):
    """Pattern names -> tensors (``Var``, ``Const``) and nodes (named ``Op``); ``.constants`` holds values."""

    def __init__(self) -> None:
        super().__init__()
        self.constants: dict[str, np.ndarray] = {}
        self.nodes: list[gs.Node] = []


class NoMatch(Exception):
    """Why a candidate did not match (the message is the reason); the matcher's internal signal."""


Where = Callable[[Bindings, gs.Graph], str | None]
Build = Callable[[Bindings, ConverterContext], gs.Tensor | Sequence[gs.Tensor]]


class Rule(RewriteRule[Bindings]):
    """A pattern rule: ``pattern`` (an :class:`Op` tree) is matched at each node of its root op type; ``check``
    (optional, pure) returns the reason it rejects a match; ``rewrite(bindings, ctx)`` builds the replacement with
    ``ctx.op``. It is a :class:`~passes.rules.RewriteRule`: run it with ``RulePass(name, (rule, ...))``."""

    def __init__(self, name: str, pattern: Op, rewrite: Build, check: Where | None = None) -> None:
        self.name = name
        self.pattern = pattern
        self.ops = frozenset((pattern.op,) if isinstance(pattern.op, str) else pattern.op)
        self._build = rewrite
        self._where = check

    def looks_at(self, node: gs.Node) -> bool:
        """The root op type and domain of the pattern."""
        return node.op in self.ops and (node.domain or "") == self.pattern.domain

    def check(self, node: gs.Node, facts: Facts) -> Bindings | str:
        """Bindings for ``node`` as the pattern's root, or why the pattern (or the rule's check) rejects it."""
        bindings = Bindings()
        try:
            _match_op(self.pattern, node, bindings, root=True)
        except NoMatch as exc:
            return str(exc)
        reason = self._where(bindings, facts.graph) if self._where else None
        return f"check rejected it: {reason}" if reason else bindings

    def rewrite(self, plan: Bindings, ctx: RewriteContext) -> gs.Tensor | Sequence[gs.Tensor]:
        """The replacement built by the rule's rewrite function."""
        return self._build(plan, ctx)


def _match_op(pattern: Op, node: gs.Node, bindings: Bindings, *, root: bool = False) -> None:
    ops = (pattern.op,) if isinstance(pattern.op, str) else pattern.op
    if node.op not in ops or (node.domain or "") != pattern.domain:
        raise NoMatch(f"node {node.name!r} is {node.op}, the pattern wants {' or '.join(ops)}")
    if root and len(node.outputs) != pattern.outputs:
        raise NoMatch(f"node {node.name!r} has {len(node.outputs)} outputs, the pattern {pattern.outputs}")
    for key, want in pattern.attrs.items():
        have = node.attrs.get(key)
        ok = bool(want(have)) if callable(want) else have == want
        if not ok:
            raise NoMatch(f"attribute {key} of {node.name!r} is {have!r}, the pattern wants {want!r}")
    orders = [pattern.inputs]
    if pattern.commutative and len(pattern.inputs) == 2:
        orders.append(pattern.inputs[::-1])
    reasons = []
    for order in orders:
        trial = _copy(bindings)
        try:
            _match_inputs(order, node, trial)
        except NoMatch as exc:
            reasons.append(str(exc))
            continue
        _merge(bindings, trial)
        if pattern.name:
            bindings[pattern.name] = node
        bindings.nodes.append(node)
        return
    raise NoMatch(" / swapped: ".join(reasons))


def _match_inputs(patterns: Sequence[Var | Const | Op], node: gs.Node, bindings: Bindings) -> None:
    if len(node.inputs) != len(patterns):
        raise NoMatch(f"node {node.name!r} has {len(node.inputs)} inputs, the pattern {len(patterns)}")
    for index, (pattern, tensor) in enumerate(zip(patterns, node.inputs, strict=True)):
        where = f"input {index} of {node.name!r}"
        if isinstance(pattern, Var):
            _bind(bindings, pattern.name, tensor, where)
        elif isinstance(pattern, Const):
            value = _constant_value(tensor)
            if value is None:
                raise NoMatch(f"{where} ({tensor.name!r}) is not a constant")
            if pattern.value is not None and not bool(pattern.value(value)):
                raise NoMatch(f"{where}: constant {tensor.name!r} fails the value constraint of {pattern.name!r}")
            _bind(bindings, pattern.name, tensor, where)
            bindings.constants[pattern.name] = value
        else:
            producer = tensor.inputs[0] if isinstance(tensor, gs.Variable) and tensor.inputs else None
            if producer is None:
                raise NoMatch(f"{where} ({tensor.name!r}) is not produced by a node")
            if len(tensor.outputs) > 1:  # an inner node whose result is used elsewhere cannot be replaced
                raise NoMatch(f"{where}: {tensor.name!r} has other consumers")
            _match_op(pattern, producer, bindings)


def _bind(bindings: Bindings, name: str, tensor: gs.Tensor, where: str) -> None:
    bound = bindings.get(name)
    if bound is not None and bound is not tensor:
        raise NoMatch(f"{where}: {name!r} is already bound to {bound.name!r}, not {tensor.name!r}")
    bindings[name] = tensor


def _constant_value(tensor: gs.Tensor) -> np.ndarray | None:
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    producer = tensor.inputs[0] if tensor.inputs else None
    if producer is not None and producer.op == "Constant" and isinstance(producer.attrs.get("value"), gs.Constant):
        return np.asarray(producer.attrs["value"].values)
    return None


def _copy(bindings: Bindings) -> Bindings:
    trial = Bindings()
    trial.update(bindings)
    trial.constants.update(bindings.constants)
    trial.nodes.extend(bindings.nodes)
    return trial


def _merge(into: Bindings, trial: Bindings) -> None:
    into.update(trial)
    into.constants.update(trial.constants)
    into.nodes[:] = trial.nodes
