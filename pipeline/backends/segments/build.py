"""Build a segmented executor: which nodes leave TensorRT, the segments, their profiles, parsers and engines.

1. The nodes left out: those the check stage's parser rejected, the ``fallback_ops`` op types, and (TensorRT-RTX)
   plugin nodes, which only NVIDIA TensorRT loads.
2. Partition (:mod:`.partition`), then each TensorRT segment is parsed by the real parser on its own: a parser that
   stops at its first error names one node at a time, so the nodes it rejects leave TensorRT and the graph is
   partitioned again until every TensorRT segment parses.
3. The values between segments get their types and profiles from runs of the final graph on ONNX Runtime
   (:mod:`.shapes`); each TensorRT segment is built through the backend's own build path (engine cache included),
   each ONNX Runtime segment gets a session. A segment whose build fails runs on ONNX Runtime, said in the report.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from converters.errors import BuildError
from converters.plugins.spec import plugin_nodes
from pipeline.backends import build_executor
from pipeline.compatibility.static import CompatibilityReport
from pipeline.runtime.executors import Executor
from pipeline.runtime.io_spec import IOSpec
from pipeline.runtime.reports.segments import LeftOut, SegmentsReport, SegmentSummary
from pipeline.runtime.segments.executor import PlannedSegment, SegmentedExecutor
from pipeline.runtime.segments.partition import (
    ORT_SEGMENT,
    TENSORRT_SEGMENT,
    Segment,
    compute_nodes,
    partition,
    top_level_names,
)
from pipeline.runtime.segments.shapes import Observed, boundary_specs, observe
from pipeline.runtime.tensorrt.library import TrtLibrary, library_for
from pipeline.settings import Settings

logger = logging.getLogger(__name__)

#: Partition-and-parse rounds before giving up (each round moves at least one node out of TensorRT).
MAX_ROUNDS = 64
Feed = Mapping[str, np.ndarray]


class SegmentFallbackWarning(UserWarning):
    """Nodes of the final graph run on ONNX Runtime because TensorRT cannot take them (``fallback="onnxruntime"``)."""


def needs_segments(
    backend: str, final: onnx.ModelProto, compatibility: CompatibilityReport, settings: Settings
) -> bool:
    """A TensorRT backend, ``fallback="onnxruntime"``, and nodes TensorRT cannot (or must not) take."""
    if backend not in ("tensorrt", "tensorrt-rtx") or settings.fallback != "onnxruntime":
        return False
    plugins = backend == "tensorrt-rtx" and bool(plugin_nodes(final))
    return bool(compatibility.problems) or bool(settings.fallback_ops) or plugins


def left_out_nodes(
    final: onnx.ModelProto, compatibility: CompatibilityReport, settings: Settings, library: TrtLibrary
) -> dict[int, LeftOut]:
    """The top-level nodes that start on ONNX Runtime, by index, with the reason."""
    graph = final.graph
    names = top_level_names(graph)
    left: dict[int, LeftOut] = {}
    for problem in compatibility.problems:
        index = names.get(problem.node, names.get(problem.node.split("/")[0]))
        if index is not None and index not in left:
            node = graph.node[index]
            left[index] = LeftOut(node.name, node.op_type, f"{compatibility.parser}: {problem.reason}")
    if library.rtx:
        for node in plugin_nodes(final):
            index = names[node.name]
            left.setdefault(index, LeftOut(node.name, node.op_type, f"a plugin node; {library.title} loads no plugins"))
    ops = set(settings.fallback_ops)
    missing = ops - {n.op_type for n in graph.node}
    if missing:
        warnings.warn(
            f"fallback_ops names {sorted(missing)}, which the final graph does not have (its ops: "
            f"{', '.join(sorted({n.op_type for n in graph.node}))}); fallback_ops takes ONNX op types",
            SegmentFallbackWarning,
            stacklevel=5,
        )
    for index, node in enumerate(graph.node):
        if node.op_type in ops:
            left.setdefault(index, LeftOut(node.name, node.op_type, "fallback_ops"))
    return left


def build_segmented(
    backend: str,
    final: onnx.ModelProto,
    io: IOSpec,
    settings: Settings,
    compatibility: CompatibilityReport,
    feeds: Sequence[Feed],
) -> tuple[SegmentedExecutor, SegmentsReport]:
    """The segmented executor of ``final`` on ``backend`` and its report; ``feeds`` (the validation inputs) give the
    shapes of the values between segments. Issues a :class:`SegmentFallbackWarning` naming what left TensorRT."""
    library = library_for(backend)
    left = left_out_nodes(final, compatibility, settings, library)
    observed: dict[str, Observed] = {}
    for _ in range(MAX_ROUNDS):
        segments = partition(final, left, settings.min_segment_size)
        plan = _plan(final, segments, settings, feeds, observed)
        rejected = _parse_segments(final, plan, library)
        if not rejected:
            break
        left.update(rejected)
    else:
        raise BuildError(
            f"{library.title}'s parser still rejected segments after {MAX_ROUNDS} partition rounds",
            fix="convert with fallback_ops= naming the rejected op types, or backend='onnxruntime'",
        )
    parts, statuses = _build_parts(backend, final, plan, settings, left)
    _record_small(final, plan, left, settings.min_segment_size)
    plan = [replace_kind(p, status) for p, status in zip(plan, statuses, strict=True)]
    report = segments_report(final, plan, left, statuses, settings, library)
    warnings.warn(
        f"{report.headline()}. report.segments names each node left out and why; fallback='error' refuses instead",
        SegmentFallbackWarning,
        stacklevel=4,
    )
    return SegmentedExecutor(backend, plan, parts, io), report


def replace_kind(segment: PlannedSegment, status: str) -> PlannedSegment:
    """A TensorRT segment whose build failed runs on ONNX Runtime."""
    import dataclasses

    failed = segment.kind == TENSORRT_SEGMENT and status.startswith("build failed")
    return dataclasses.replace(segment, kind=ORT_SEGMENT) if failed else segment


def _plan(
    final: onnx.ModelProto,
    segments: Sequence[Segment],
    settings: Settings,
    feeds: Sequence[Feed],
    observed: dict[str, Observed],
) -> list[PlannedSegment]:
    """Specs and profiles for every segment; boundary values not seen before are observed on ONNX Runtime."""
    names = [n for s in segments for n in (*s.inputs, *s.outputs)]
    unseen = [n for n in dict.fromkeys(names) if n not in observed]
    if unseen:
        observed.update(observe(final, unseen, feeds, settings))
    specs, dims = boundary_specs(final, names, observed, settings)
    every_dim = (*settings.dynamic, *dims)
    return [
        PlannedSegment(
            s.kind,
            s.nodes,
            tuple(specs[n] for n in s.inputs),
            tuple(specs[n] for n in s.outputs),
            tuple(d for d in every_dim if d.input in s.inputs),
        )
        for s in segments
    ]


def _parse_segments(final: onnx.ModelProto, plan: Sequence[PlannedSegment], library: TrtLibrary) -> dict[int, LeftOut]:
    """The nodes the real parser rejects in each TensorRT segment parsed on its own (every node of a segment it
    rejects without naming one)."""
    from pipeline.backends.tensorrt.build import parse_onnx

    names = top_level_names(final.graph)
    rejected: dict[int, LeftOut] = {}
    for segment in plan:
        if segment.kind != TENSORRT_SEGMENT:
            continue
        _, failures = parse_onnx(segment.model(final), library=library, for_build=False)
        for failure in failures:
            index = names.get(failure.node)
            hit = [index] if index is not None and index in segment.nodes else list(segment.nodes)
            inner = index is not None and final.graph.node[index].name != failure.node
            where = f"in its subgraph, {failure.op} {failure.node!r}: " if inner else ""
            reason = f"{library.title} {library.version()} ONNX parser: {where}{failure.message} [{failure.code}]"
            for i in hit:
                node = final.graph.node[i]
                rejected.setdefault(i, LeftOut(node.name, node.op_type, reason))
    return rejected


def _build_parts(
    backend: str, final: onnx.ModelProto, plan: Sequence[PlannedSegment], settings: Settings, left: dict[int, LeftOut]
) -> tuple[list[Executor], list[str]]:
    """One executor per segment and, for TensorRT ones, how the engine came about (or why the build failed)."""
    from pipeline.runtime.ort.executor import OnnxRuntimeExecutor

    parts: list[Executor] = []
    statuses: list[str] = []
    for index, segment in enumerate(plan):
        model = segment.model(final)
        if segment.kind == ORT_SEGMENT:
            parts.append(OnnxRuntimeExecutor(model, segment.io, settings))
            statuses.append("")
            continue
        try:
            part = build_executor(backend, model, segment.io, segment.settings(settings))
        except BuildError as exc:
            logger.warning("segment #%d: the build failed, it runs on ONNX Runtime: %s", index, exc)
            reason = f"the build of its TensorRT segment #{index} failed: {str(exc).splitlines()[0]}"
            for i in segment.nodes:
                node = final.graph.node[i]
                left.setdefault(i, LeftOut(node.name, node.op_type, reason))
            parts.append(OnnxRuntimeExecutor(model, segment.io, settings))
            statuses.append(f"build failed: {str(exc).splitlines()[0]}")
            continue
        parts.append(part)
        statuses.append(_engine_status(part))
    return parts, statuses


def _engine_status(part: Executor) -> str:
    cache = getattr(part, "cache_status", "")
    if getattr(part, "runs_on", "") == "onnxruntime":
        return f"engine {cache}; runs on its ONNX Runtime stand-in here"
    return f"engine {cache}"


def _record_small(
    final: onnx.ModelProto, plan: Sequence[PlannedSegment], left: dict[int, LeftOut], minimum: int
) -> None:
    """Nodes on ONNX Runtime for no reason of their own: they were in a TensorRT run below ``min_segment_size``."""
    for segment in plan:
        if segment.kind != ORT_SEGMENT:
            continue
        for i in segment.nodes:
            if i not in left:
                node = final.graph.node[i]
                reason = f"its TensorRT run had fewer than min_segment_size={minimum} compute nodes"
                left[i] = LeftOut(node.name, node.op_type, reason)


def segments_report(
    final: onnx.ModelProto,
    plan: Sequence[PlannedSegment],
    left: Mapping[int, LeftOut],
    statuses: Sequence[str],
    settings: Settings,
    library: TrtLibrary,
) -> SegmentsReport:
    """The report of a segmented build: segments, nodes left out (graph order), FLOPs inside TensorRT."""
    from pipeline.precision.share import node_flops

    flops = node_flops(final, {d.name: d.opt for d in settings.dynamic})
    on_trt = {i for s in plan if s.kind == TENSORRT_SEGMENT for i in s.nodes}
    summaries = tuple(
        SegmentSummary(
            index,
            s.kind,
            len(s.nodes),
            compute_nodes(final, s.nodes),
            dict(Counter(final.graph.node[i].op_type for i in s.nodes).most_common()),
            len(s.inputs),
            len(s.outputs),
            status,
        )
        for index, (s, status) in enumerate(zip(plan, statuses, strict=True))
    )
    return SegmentsReport(
        library=library.title,
        min_segment_size=settings.min_segment_size,
        segments=summaries,
        left_out=tuple(left[i] for i in sorted(left) if i not in on_trt),
        tensorrt_flops=sum(f for i, f in flops.items() if i in on_trt),
        total_flops=sum(flops.values()),
        tensorrt_nodes=len(on_trt),
        total_nodes=len(final.graph.node),
    )


__all__ = ["SegmentFallbackWarning", "build_segmented", "left_out_nodes"]
