"""The exporter's optimizer in time linear in the graph, not quadratic: a guard on onnxscript's multi-output matcher.

``torch.onnx.export`` optimizes every graph with onnxscript's default rewrite rules. One of them (``SlicesSplit``:
two Slices of one tensor become a Split) is a pattern with two output nodes, and onnxscript 0.7's
``SimplePatternMatcher.match`` for such a pattern indexes every node of the graph by op type *before* it looks at
the node it was asked about. It is asked about every node, in each of the optimizer's rounds, so that rule alone
costs (nodes)^2 steps: 13 million for timm's 1,092-node HaloNet, 45 of its 154 seconds of export under a profiler,
and minutes for graphs of several thousand nodes. (It never fires on the exporter's graphs, whose Slices carry a
``steps`` input the pattern does not allow: the cost buys nothing.)

:func:`linear_multi_output_matching` patches the matcher for the duration of the ``with`` block (as
:mod:`pipeline.exporting.translation_table` patches the exporter's registry): a node whose op type or domain is not
that of the pattern's first output node, or that has more inputs than that node takes (every Slice the exporter
writes: its ``steps``), fails at once, as the original fails on those same first checks of every combination it
tries. The optimizer makes the same rewrites, so the graph is the same. On an onnxscript without that
class or method, nothing is patched and the export runs as before (slower, same graph).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pipeline.exporting.patching import SharedPatch


def _matcher_class() -> Any:
    try:
        matcher = importlib.import_module("onnxscript.rewriter._matcher")
        basics = importlib.import_module("onnxscript.rewriter._basics")
    except ImportError:
        return None
    cls = getattr(matcher, "SimplePatternMatcher", None)
    if cls is None or not callable(cls.__dict__.get("match")) or not hasattr(basics, "MatchResult"):
        return None
    return cls


def _first_output_rejects(pattern: Any, node: Any) -> bool:
    """The pattern has several output nodes and ``node`` cannot be the first one: not of its op type and domain, or
    with more inputs than it takes (the exporter's Slices carry ``steps``; the pattern's do not). Those are the first
    checks the matcher makes of ``node`` in every combination it tries, with nothing before them that could succeed."""
    if pattern is None or getattr(pattern, "has_single_output_node", True):
        return False
    try:
        first = pattern.output_nodes[0]
        if not (first.op.matches(node.op_type) and first.domain.matches(node.domain)):
            return True
        return len(node.inputs) > len(first.inputs) and not first.allow_other_inputs
    except (AttributeError, IndexError, TypeError):  # another onnxscript's pattern classes: let the matcher decide
        return False


@contextmanager
def linear_multi_output_matching() -> Iterator[None]:
    """Within the block, onnxscript's matcher rejects a node that cannot be a multi-output pattern's first output
    node before indexing the whole graph (module doc)."""
    patch = _patch()
    if patch is None:
        yield
        return
    with patch.held():
        yield


@functools.cache
def _patch() -> SharedPatch | None:
    cls = _matcher_class()
    if cls is None:
        return None
    from onnxscript.rewriter._basics import MatchResult

    return SharedPatch(cls, "match", lambda original: _guarded(original, MatchResult))


def _guarded(original: Any, result: Any) -> Any:
    def match(self: Any, model: Any, graph_or_function: Any, node: Any, *args: Any, **options: Any) -> Any:
        if _first_output_rejects(getattr(self, "pattern", None), node):
            return result().fail(f"{node.op_type} with {len(node.inputs)} inputs cannot be the first output node", node)
        return original(self, model, graph_or_function, node, *args, **options)

    return match
