"""Static check: will TensorRT's ONNX parser accept this graph, and if not, which node and why.

No TensorRT needed: the answer comes from the parser's published operator matrix (``pipeline/compatibility/data``) and
rules from the parser's behaviour. Dispatch follows the parser: a node with a ``plugin_namespace`` attribute is a
plugin; otherwise the op_type alone (the domain is ignored) picks a built-in importer; otherwise a model-local function
is inlined; otherwise the parser looks for a plugin named after the op.

>>> report = check("model.onnx", trt_version="10.16")     # doctest: +SKIP
>>> print(report.summary())                               # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import onnx

from converters.errors import InputError
from passes.model_io.weightless import weightless
from passes.parser_fixes import declined_fixes
from pipeline.compatibility.ops import DEFAULT_TRT_VERSION, custom_ops, min_version, parse_version, support_table
from pipeline.compatibility.rules import GraphFacts, node_problems

SUPPORTED, UNSUPPORTED, RESTRICTED, PLUGIN = "supported", "unsupported", "restriction violated", "plugin"
BUILD_FAILED = "build failed"  # the real builder's verdict (pipeline.compatibility.real), not the table's


@dataclass(frozen=True)
class NodeCheck:
    """One node's verdict: its status, the reason and the fix, and the parser fixes that declined it."""

    node: str
    op: str
    domain: str
    status: str
    reason: str = ""
    fix: str = ""
    #: For a node the parser rejects (unsupported, restriction violated): each parser fix that looked at it, and why
    #: it left the node.
    declined: tuple[str, ...] = ()


def static_parser_name(trt_version: str) -> str:
    """How the static table names itself as the judge of a report."""
    return f"static table (TensorRT {trt_version} operator matrix)"


@dataclass(frozen=True)
class CompatibilityReport:
    """Every node's verdict; ``parser`` names the judge (a real parser and its version, or the static table)."""

    trt_version: str
    nodes: tuple[NodeCheck, ...]
    parser: str = ""

    def __post_init__(self) -> None:
        if not self.parser:
            object.__setattr__(self, "parser", static_parser_name(self.trt_version))

    @property
    def problems(self) -> tuple[NodeCheck, ...]:
        """The nodes the parser rejects (or the builder, with a real parser and build=True)."""
        return tuple(n for n in self.nodes if n.status in (UNSUPPORTED, RESTRICTED, BUILD_FAILED))

    @property
    def ok(self) -> bool:
        """No node rejected."""
        return not self.problems

    def counts(self) -> dict[str, int]:
        """How many nodes have each status."""
        return dict(Counter(n.status for n in self.nodes))

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "trt_version": self.trt_version,
            "parser": self.parser,
            "counts": self.counts(),
            "problems": [asdict(n) for n in self.problems],
            "plugins": [asdict(n) for n in self.nodes if n.status == PLUGIN],
        }

    def summary(self) -> str:
        """The report for people: the judge, the counts, and each rejected node with its reason and fix."""
        counts = ", ".join(f"{v} {k}" for k, v in sorted(self.counts().items()))
        lines = [f"{self.parser} check: {len(self.nodes)} nodes ({counts or 'none'})"]
        for n in self.problems:
            lines.append(f"  {n.status:<20} {n.op:<18} {n.node}: {n.reason}")
            if n.fix:
                lines.append(f"  {'':<20} fix: {n.fix}")
            lines += [f"  {'':<20} {line}" for line in n.declined]
        return "\n".join(lines)


def check(model: onnx.ModelProto | str | Path, trt_version: str = DEFAULT_TRT_VERSION) -> CompatibilityReport:
    """Check every node of ``model`` (a ModelProto or a path) against the static table of TensorRT ``trt_version``'s
    ONNX parser (no TensorRT needed; ``pipeline.check`` asks a real parser first, see ``pipeline.compatibility.judge``).
    """
    proto = load_model(model)
    try:
        parse_version(trt_version)
    except ValueError:
        raise InputError(
            f"cannot read TensorRT version {trt_version!r}", fix="write it like '10.16' or '11.4'"
        ) from None
    # the rules read types, ranks and small constants, never a weight's values: the light graph (weights held apart,
    # unread) is inferred and judged, as a model with external data is
    light, _ = weightless(proto)
    try:
        inferred = onnx.shape_inference.infer_shapes(light)
    except Exception:  # inference is best effort: unknown types just skip the type rules
        inferred = light
    facts = GraphFacts.of(inferred, parse_version(trt_version))
    functions = {(f.domain, f.name): f for f in proto.functions}
    results = [_check(node, facts, functions, trt_version, scope="") for node in inferred.graph.node]
    nodes = [r for group in results for r in group]
    problems = {n.node for n in nodes if n.status in (UNSUPPORTED, RESTRICTED)}
    declined = declined_fixes(_with_weights(inferred, proto), problems) if problems else {}
    nodes = [replace(n, declined=tuple(declined[n.node])) if n.node in declined else n for n in nodes]
    return CompatibilityReport(trt_version, tuple(nodes))


def _with_weights(inferred: onnx.ModelProto, proto: onnx.ModelProto) -> onnx.ModelProto:
    """The inferred graph with ``proto``'s initializers (a parser fix may read a weight's values)."""
    if inferred is proto:
        return inferred
    full = onnx.ModelProto()
    full.CopyFrom(inferred)
    del full.graph.initializer[:]
    full.graph.initializer.extend(proto.graph.initializer)
    return full


def _check(
    node: onnx.NodeProto,
    facts: GraphFacts,
    functions: dict[tuple[str, str], onnx.FunctionProto],
    version: str,
    scope: str,
) -> list[NodeCheck]:
    name = scope + (node.name or f"<unnamed {node.op_type}>")
    attrs = {a.name for a in node.attribute}
    if "plugin_namespace" in attrs:
        return [
            NodeCheck(
                name,
                node.op_type,
                node.domain,
                PLUGIN,
                "imported as a plugin (plugin_namespace set)",
                "register the plugin before parsing (converters.register_plugin)",
            )
        ]
    table = support_table(version)
    support = table.get(node.op_type)
    if node.op_type in custom_ops() or (support is not None and support.supported):
        problems = node_problems(node, facts, support)
        if problems:
            reason, fix = problems[0]
            return [NodeCheck(name, node.op_type, node.domain, RESTRICTED, reason, fix)]
        return [NodeCheck(name, node.op_type, node.domain, SUPPORTED)]
    function = functions.get((node.domain, node.op_type))
    if function is not None:  # the parser inlines a model-local function: check its body
        return [r for inner in function.node for r in _check(inner, facts, functions, version, f"{name}/")]
    if support is not None:
        since = min_version(node.op_type)
        reason = f"not supported by the TensorRT {version} ONNX parser" + (
            f" (supported from {since})" if since else ""
        )
        return [NodeCheck(name, node.op_type, node.domain, UNSUPPORTED, reason, _fix_for(node.op_type, since))]
    return [
        NodeCheck(
            name,
            node.op_type,
            node.domain,
            UNSUPPORTED,
            f"no built-in importer: the parser looks for a plugin named {node.op_type!r}"
            + (f" (namespace {node.domain!r})" if node.domain else ""),
            f"register a converter for {node.op_type!r} (@converters.register("
            f"{(node.domain + '::') if node.domain else ''}{node.op_type!r})), or a plugin",
        )
    ]


_SEQUENCE_FIX = "avoid Python lists of tensors built at run time inside forward() (torch.stack/cat a fixed list)"
_REWRITTEN = {
    "DFT",
    "BitShift",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "BitwiseNot",
    "CenterCropPad",
    "Col2Im",
    "AffineGrid",
    "MaxUnpool",
    "Compress",
}


def _fix_for(op: str, since: str | None) -> str:
    upgrade = f"use TensorRT >= {since}, or " if since else ""
    if op in _REWRITTEN:
        return (
            f"{upgrade}keep the default pass list: it rewrites {op} into supported ops where shapes and "
            "operands are static; otherwise register a converter for it"
        )
    if op.startswith(("Sequence", "Optional")) or op in ("ConcatFromSequence", "SplitToSequence"):
        return upgrade + _SEQUENCE_FIX
    return f"{upgrade}register a converter for {op!r} that builds it from supported ops, or a plugin"


def load_model(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    """A ModelProto as given, or read from a path (without external weights); an InputError if unreadable."""
    if isinstance(model, onnx.ModelProto):
        return model
    path = Path(model)
    if not path.is_file():
        raise InputError(f"no ONNX model at {path}", fix="check the path")
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise InputError(f"{path} is not a readable ONNX model: {exc}", fix="check the file") from exc
