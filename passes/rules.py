"""The one way to write a graph rewrite: a rule is the op types it looks at, a pure ``check`` and a ``rewrite``.

- ``ops`` (and ``domains``): which nodes the rule looks at; every other node is none of its business.
- ``check(node, facts)`` reads the node and the graph (never modifies them) and returns a plan for the rewrite, or
  the reason it declines as a string, so "why didn't this rule fire on node X?" always has an answer:
  :func:`explain`. ``facts`` (:class:`Facts`) holds the graph and what a check may compute once per pass run.
- ``rewrite(plan, ctx)`` builds the replacement with ``ctx.op.<OnnxOp>(...)``, the builder converters use
  (:class:`RewriteContext` is a :class:`~converters.context.ConverterContext`), and returns one tensor per output
  of the node; :func:`passes.rewiring.replace_outputs` puts them in its place (graph outputs keep their names).
  A rewrite that edits the node in place (new constant inputs, say) returns ``None``.

A pass runs an explicit tuple of rules: :class:`RulePass`. Built-in passes (simplification, parser fixes, cast
cleanup) and user rules are all written this way, so a user rule goes into ``pipeline.convert(passes=...)`` or
``extra_passes=...`` like any other pass.

>>> class ReluOfRelu(RewriteRule[gs.Tensor]):                               # doctest: +SKIP
...     name, ops = "relu_of_relu", frozenset({"Relu"})
...     def check(self, node, facts):
...         inner = node.inputs[0].inputs[0] if node.inputs[0].inputs else None
...         return inner.outputs[0] if inner is not None and inner.op == "Relu" else "input is not a Relu"
...     def rewrite(self, plan, ctx):
...         return plan                                                     # Relu(Relu(x)) is Relu(x)
>>> RulePass("relu_of_relu", (ReluOfRelu(),))                               # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeAlias, TypeVar

import onnx_graphsurgeon as gs

from converters.context import ConverterContext
from converters.errors import ConversionError
from converters.settings import Settings
from converters.targets import node_key
from passes.base import STANDARD_DOMAINS, PassResult
from passes.cleanup.graph import remove_unused, toposort
from passes.rewiring import replace_outputs

logger = logging.getLogger(__name__)

Plan = TypeVar("Plan")
T = TypeVar("T")


class Facts:
    """What a check reads besides the node: the graph, and values computed once per pass run (``memo``)."""

    def __init__(self, graph: gs.Graph) -> None:
        self.graph = graph
        self._memo: dict[str, Any] = {}

    @property
    def opset(self) -> int:
        """The graph's default-domain opset."""
        return int(self.graph.opset)

    @property
    def graph_outputs(self) -> set[int]:
        """``id()`` of every graph output tensor (as the pass run began)."""
        return self.memo("graph_outputs", lambda: {id(t) for t in self.graph.outputs})

    def memo(self, key: str, make: Callable[[], T]) -> T:
        """``make()``, computed once per pass run under ``key`` (a value resolver, a type inference, ...)."""
        if key not in self._memo:
            self._memo[key] = make()
        value: T = self._memo[key]
        return value


class RewriteContext(ConverterContext):
    """The converter context for a rule's rewrite: the same ``ctx.op`` builder, names shared across the pass run.

    Everything it creates is named after the replaced node (a nameless node lends its first output's name).
    """

    def __init__(self, graph: gs.Graph, node: gs.Node, settings: Settings, names: set[str]) -> None:
        super().__init__(graph, node, node_key(node.domain, node.op), settings, names=names)

    @property
    def name(self) -> str:
        """The name nodes and tensors made for this node are named after."""
        node = self.node
        return str(node.name or (node.outputs[0].name if node.outputs else node.op))


Result: TypeAlias = gs.Tensor | Sequence[gs.Tensor] | None


class RewriteRule(Generic[Plan]):
    """A rule: the nodes it looks at (``ops``, ``domains``), a pure ``check``, a ``rewrite`` (module doc)."""

    name: str = "rule"
    ops: frozenset[str] = frozenset()
    domains: frozenset[str | None] = STANDARD_DOMAINS

    def looks_at(self, node: gs.Node) -> bool:
        """The rule's pattern at the first glance: is ``node`` of an op type (and domain) it handles?"""
        return node.op in self.ops and node.domain in self.domains

    def check(self, node: gs.Node, facts: Facts) -> Plan | str:
        """A plan for rewriting ``node``, or the reason it is left as it is. Pure: never modifies the graph."""
        raise NotImplementedError

    def rewrite(self, plan: Plan, ctx: RewriteContext) -> Result:
        """Build the replacement with ``ctx.op``; return one tensor per output of the node (None: edited in place)."""
        raise NotImplementedError

    def reason(self, node: gs.Node, facts: Facts) -> str | None:
        """Why the rule leaves ``node`` (None: it would rewrite it)."""
        if not self.looks_at(node):
            wanted = ", ".join(sorted(self.ops)) or "no op"
            domain = f" of domain {node.domain!r}" if node.domain not in STANDARD_DOMAINS else ""
            return f"node {node.name!r} is {node.op}{domain}, the rule looks at {wanted}"
        plan = self.check(node, facts)
        return plan if isinstance(plan, str) else None

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        """A rule is also the pass that runs it alone: ``RulePass(rule.name, (rule,))``."""
        return RulePass(self.name, (self,))(graph, settings)

    def explain(self, graph: gs.Graph, node_name: str) -> str:
        """Why this rule does (or does not) rewrite the node named ``node_name``."""
        node = _find(graph, node_name)
        if node is None:
            return f"no node named {node_name!r}"
        reason = self.reason(node, Facts(graph))
        if reason is None:
            return f"rule {self.name!r} matches {node_name!r}"
        return f"rule {self.name!r} does not match {node_name!r}: {reason}"


class RulePass:
    """A pass running an explicit tuple of rules: every node (in graph order) gets the first rule that accepts it.

    ``repeat=True`` walks the graph again while a walk rewrote something (a rewrite may create a new match), up
    to ``max_rewrites`` in all. After a walk that rewrote something, unused nodes are removed, and the graph is
    sorted topologically if the rewrites added nodes (edits in place and bypasses keep the order).
    """

    def __init__(
        self,
        name: str,
        rules: tuple[RewriteRule[Any], ...],
        *,
        repeat: bool = False,
        max_rewrites: int = 100_000,
    ) -> None:
        if not isinstance(rules, tuple) or not all(isinstance(r, RewriteRule) for r in rules):
            raise ConversionError(
                f"pass {name!r}: rules must be a tuple of RewriteRule, got {type(rules).__name__}",
                fix="pass the rules as a tuple: RulePass(name, (rule_a, rule_b))",
            )
        self.name = name
        self.rules = rules
        self.repeat = repeat
        self.max_rewrites = max_rewrites

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        total = 0
        while True:
            before = len(graph.nodes)
            count = self._walk(graph, settings)
            total += count
            if count:
                added = len(graph.nodes) > before  # (replaced nodes stay listed until the cleanup)
                remove_unused(graph)
                if added:
                    toposort(graph)
            if not (self.repeat and count):
                break
            if total >= self.max_rewrites:
                raise ConversionError(
                    f"{self.name}: {total} rewrites and still matching; a rule may rewrite into its own pattern",
                    fix="make each rewrite produce something its rule's check declines",
                )
        return PassResult(graph, total > 0)

    def _walk(self, graph: gs.Graph, settings: Settings) -> int:
        return rewrite_nodes(self.rules, list(graph.nodes), Facts(graph), settings, log_as=self.name)

    def reasons(self, graph: gs.Graph, node: gs.Node) -> list[tuple[str, str | None]]:
        """``(rule name, why it declines ``node`` or None if it would rewrite it)`` for every rule of the pass."""
        facts = Facts(graph)
        return [(rule.name, rule.reason(node, facts)) for rule in self.rules]

    def explain(self, graph: gs.Graph, node_name: str) -> str:
        """One line per rule: why it does (or does not) rewrite the node named ``node_name``."""
        node = _find(graph, node_name)
        if node is None:
            return f"no node named {node_name!r}"
        lines = [f"pass {self.name!r} on {node.op} node {node_name!r}:"]
        for rule, reason in self.reasons(graph, node):
            lines.append(f"  rule {rule!r}: " + ("would rewrite it" if reason is None else reason))
        return "\n".join(lines)


def rewrite_nodes(
    rules: Sequence[RewriteRule[Any]], nodes: Sequence[gs.Node], facts: Facts, settings: Settings, log_as: str = ""
) -> int:
    """One walk: each of ``nodes`` still in place gets the first of ``rules`` that accepts it; returns how many
    were rewritten. No cleanup (the caller's, once a run): replaced nodes stay listed, detached."""
    names = _GraphNames(facts.graph)
    count = 0
    for node in nodes:
        if not node.outputs:  # replaced earlier in this walk
            continue
        for rule in rules:
            if not rule.looks_at(node):
                continue
            plan = rule.check(node, facts)
            if isinstance(plan, str):
                logger.debug("%s: rule %s left %s node %r: %s", log_as, rule.name, node.op, node.name, plan)
                continue
            apply(rule, node, plan, facts.graph, settings, names)
            count += 1
            break
    return count


def apply(
    rule: RewriteRule[Any], node: gs.Node, plan: Any, graph: gs.Graph, settings: Settings, names: set[str]
) -> None:
    """Run ``rule``'s rewrite of ``node`` and put the result in its place (or keep the node if edited in place)."""
    ctx = RewriteContext(graph, node, settings, names)
    result = rule.rewrite(plan, ctx)
    if result is None:
        logger.debug("rule %s: edited %s node %r in place", rule.name, node.op, node.name)
        return
    outputs = [result] if isinstance(result, gs.Tensor) else list(result)
    if len(outputs) != len(node.outputs) or not all(isinstance(t, gs.Tensor) for t in outputs):
        raise ConversionError(
            f"rule {rule.name!r} returned {len(outputs)} value(s) for a node with {len(node.outputs)} output(s)",
            node=node.name,
            fix="return one tensor per output of the node it replaces, in order (None: edited in place)",
        )
    for created in ctx.created:
        created.metadata = getattr(node, "metadata", {})
    replace_outputs(graph, node, outputs, ctx)
    logger.debug("rule %s: rewrote %s node %r into %d nodes", rule.name, node.op, node.name, len(ctx.created))


def explain(rule_or_pass: RewriteRule[Any] | RulePass, graph: gs.Graph, node_name: str) -> str:
    """Why a rule, or each rule of a pass, does (or does not) rewrite the node named ``node_name`` of ``graph``.

    >>> print(explain(passes.parser_fixes.parser_fix_passes()[0], graph, "dft"))        # doctest: +SKIP
    pass 'dft_to_matmul' on DFT node 'dft':
      rule 'dft_to_matmul': axis is not static
    """
    if isinstance(rule_or_pass, RewriteRule | RulePass):
        return rule_or_pass.explain(graph, node_name)
    raise ConversionError(
        f"cannot explain {type(rule_or_pass).__name__}: it is not written as rules",
        fix="pass a RewriteRule or a RulePass (passes.rules)",
    )


class _GraphNames(set[str]):
    """The graph's node and tensor names, collected at the first look (a walk of bypasses never names anything,
    and collecting them walks the whole graph)."""

    def __init__(self, graph: gs.Graph) -> None:
        super().__init__()
        self._graph: gs.Graph | None = graph

    def _fill(self) -> None:
        if self._graph is not None:
            graph, self._graph = self._graph, None
            self.update(graph.tensors())
            self.update(n.name for n in graph.nodes)

    def __contains__(self, name: object) -> bool:
        self._fill()
        return super().__contains__(name)

    def add(self, name: str) -> None:
        """Add ``name`` (after collecting the graph's names)."""
        self._fill()
        super().add(name)


def _find(graph: gs.Graph, node_name: str) -> gs.Node | None:
    return next((n for n in graph.nodes if n.name == node_name), None)
