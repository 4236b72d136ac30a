"""The segments section of the conversion report: each segment, every node left out of TensorRT and why, and the
share of the graph's compute inside TensorRT."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class LeftOut:
    """A node that runs on ONNX Runtime, and why it is not in a TensorRT segment."""

    node: str
    op: str
    reason: str


@dataclass(frozen=True)
class SegmentSummary:
    """One segment: its runtime, node counts, most frequent ops and how its engine came about (TensorRT)."""

    index: int
    kind: str
    nodes: int
    compute_nodes: int
    ops: dict[str, int]
    inputs: int
    outputs: int
    status: str = ""


@dataclass(frozen=True)
class SegmentsReport:
    """TensorRT where it can, ONNX Runtime where it cannot: what ran where.

    ``tensorrt_flops`` / ``total_flops`` are the MatMul/Gemm/Conv FLOPs (at each dynamic dimension's opt size) in
    TensorRT segments and in the whole graph; ``share`` falls back to node counts for a graph without such ops.
    """

    library: str
    min_segment_size: int
    segments: tuple[SegmentSummary, ...]
    left_out: tuple[LeftOut, ...]
    tensorrt_flops: float
    total_flops: float
    tensorrt_nodes: int
    total_nodes: int

    @property
    def share(self) -> float:
        """The share of the FLOPs (or, without MatMul/Gemm/Conv, of the nodes) inside TensorRT segments."""
        if self.total_flops:
            return self.tensorrt_flops / self.total_flops
        return self.tensorrt_nodes / self.total_nodes if self.total_nodes else 0.0

    @property
    def basis(self) -> str:
        """What :attr:`share` is measured in."""
        return "MatMul/Gemm/Conv FLOPs" if self.total_flops else "nodes (no MatMul/Gemm/Conv)"

    @property
    def engines(self) -> int:
        """How many TensorRT segments (engines) there are."""
        return sum(s.kind == "tensorrt" for s in self.segments)

    def left_out_ops(self) -> str:
        """``NonZero x1, Bernoulli x2``: the op types left out of TensorRT."""
        return ", ".join(f"{op} x{n}" for op, n in Counter(n.op for n in self.left_out).most_common())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (``report.json``, the artifact's metadata)."""
        return {**asdict(self), "share": self.share, "basis": self.basis}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SegmentsReport:
        """A report from :meth:`to_dict` data."""
        return cls(
            library=data["library"],
            min_segment_size=int(data["min_segment_size"]),
            segments=tuple(SegmentSummary(**s) for s in data["segments"]),
            left_out=tuple(LeftOut(**n) for n in data["left_out"]),
            tensorrt_flops=float(data["tensorrt_flops"]),
            total_flops=float(data["total_flops"]),
            tensorrt_nodes=int(data["tensorrt_nodes"]),
            total_nodes=int(data["total_nodes"]),
        )

    def headline(self) -> str:
        """One sentence: how many nodes left TensorRT, which ops, and the share of the compute that stayed."""
        return (
            f"{len(self.left_out)} of {self.total_nodes} node(s) run on ONNX Runtime, not {self.library} "
            f"({self.left_out_ops()}); {self.share:.1%} of the {self.basis} run inside {self.engines} "
            f"{self.library} segment(s)"
        )

    def summary_lines(self, limit: int = 10) -> list[str]:
        """The report's lines for :meth:`ConversionReport.summary`."""
        lines = [f"segments  {self.headline()}"]
        for s in self.segments:
            ops = ", ".join(f"{op} x{n}" for op, n in list(s.ops.items())[:4])
            lines.append(
                f"          #{s.index} {s.kind:<12} {s.nodes:>5} nodes ({s.compute_nodes} compute; {ops})"
                + (f"  {s.status}" if s.status else "")
            )
        for n in self.left_out[:limit]:
            lines.append(f"          left out  {n.op:<16} {n.node}: {n.reason}")
        if len(self.left_out) > limit:
            lines.append(f"          ... and {len(self.left_out) - limit} more (report.segments.left_out)")
        return lines
