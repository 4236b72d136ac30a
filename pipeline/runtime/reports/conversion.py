"""The conversion report: stage timings, passes with node counts, the backend and why, accuracy figures."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from passes.records import PassRecord
from pipeline.runtime.reports.accuracy import AccuracyReport
from pipeline.runtime.reports.precision import PrecisionReport
from pipeline.runtime.reports.quantization import QuantizationReport
from pipeline.runtime.reports.segments import SegmentsReport


@dataclass(frozen=True)
class ConversionReport:
    """The conversion report: stage timings, passes with node counts, the backend and why, accuracy, precision."""

    backend: str
    backend_reason: str
    stages: tuple[tuple[str, float], ...]
    passes: tuple[PassRecord, ...]
    nodes_exported: int
    nodes_final: int
    accuracy: AccuracyReport | None
    versions: dict[str, str] = field(default_factory=dict)
    compatibility: dict[str, Any] | None = None  # pipeline.check's report of the final graph, as a dict
    precision: PrecisionReport | None = None  # the precision stage (fp16/bf16): islands, casts, share, error
    quantization: QuantizationReport | None = None  # the quantize stage (int8/fp8): scales, ops, share, error
    segments: SegmentsReport | None = None  # TensorRT segments with ONNX Runtime for the nodes TensorRT cannot take
    engine_options: dict[str, Any] | None = None  # strip_weights, refittable, ...: pipeline.runtime.tensorrt.weights
    #: op type -> nodes the passes put in place of decomposed subgraphs (RMSNormalization, RotaryEmbedding)
    fused_ops: dict[str, int] = field(default_factory=dict)
    #: outputs of the model the graph does not return (the module returns None there), where they are in the result
    #: (``result.cache``) -> type: transformers cache objects of a plain conversion (pipeline.exporting.cache_outputs)
    dropped_outputs: dict[str, str] = field(default_factory=dict)
    #: the model's Python branches on tensor data exported as the sample takes them: source line -> the value taken
    #: (``modeling_fsmt.py:266 in make_padding_mask `if not padding_mask.any():``` -> ``"False"``)
    traced_branches: dict[str, str] = field(default_factory=dict)

    @property
    def total_seconds(self) -> float:
        """Seconds over all stages."""
        return sum(seconds for _, seconds in self.stages)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``report.json``, the artifact's metadata)."""
        return {
            "backend": self.backend,
            "backend_reason": self.backend_reason,
            "stages": [{"name": n, "seconds": s} for n, s in self.stages],
            "passes": [asdict(p) for p in self.passes],
            "nodes_exported": self.nodes_exported,
            "nodes_final": self.nodes_final,
            "accuracy": self.accuracy.to_dict() if self.accuracy else None,
            "versions": dict(self.versions),
            "compatibility": self.compatibility,
            "precision": self.precision.to_dict() if self.precision else None,
            "quantization": self.quantization.to_dict() if self.quantization else None,
            "segments": self.segments.to_dict() if self.segments else None,
            "engine_options": self.engine_options,
            "fused_ops": dict(self.fused_ops),
            "dropped_outputs": dict(self.dropped_outputs),
            "traced_branches": dict(self.traced_branches),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConversionReport:
        """A report from :meth:`to_dict` data."""
        accuracy = data.get("accuracy")
        return cls(
            backend=data["backend"],
            backend_reason=data["backend_reason"],
            stages=tuple((s["name"], float(s["seconds"])) for s in data["stages"]),
            passes=tuple(PassRecord(**p) for p in data["passes"]),
            nodes_exported=int(data["nodes_exported"]),
            nodes_final=int(data["nodes_final"]),
            accuracy=None if accuracy is None else AccuracyReport.from_dict(accuracy),
            versions=dict(data.get("versions", {})),
            compatibility=data.get("compatibility"),
            precision=PrecisionReport.from_dict(data["precision"]) if data.get("precision") else None,
            quantization=QuantizationReport.from_dict(data["quantization"]) if data.get("quantization") else None,
            segments=SegmentsReport.from_dict(data["segments"]) if data.get("segments") else None,
            engine_options=data.get("engine_options"),
            fused_ops={str(k): int(v) for k, v in data.get("fused_ops", {}).items()},
            dropped_outputs={str(k): str(v) for k, v in data.get("dropped_outputs", {}).items()},
            traced_branches={str(k): str(v) for k, v in data.get("traced_branches", {}).items()},
        )

    def summary(self) -> str:
        """A short human-readable summary, as the CLI prints it."""
        lines = [f"backend   {self.backend}  ({self.backend_reason})"]
        stage_text = "  ".join(f"{name} {seconds:.2f}s" for name, seconds in self.stages)
        lines.append(f"stages    {stage_text}  (total {self.total_seconds:.2f}s)")
        changed = [p for p in self.passes if p.modified]
        lines.append(
            f"graph     {self.nodes_exported} nodes exported -> {self.nodes_final} final; "
            f"{len(self.passes)} pass runs, {len(changed)} changed the graph"
        )
        for p in changed:
            lines.append(f"          {p.name:<20} {p.nodes_before:>6} -> {p.nodes_after:<6} {p.seconds:.3f}s")
        if self.fused_ops:
            fused = ", ".join(f"{count} {op}" for op, count in self.fused_ops.items())
            lines.append(f"fused     {fused} (opset-23 ops in place of the exported subgraphs)")
        if self.dropped_outputs:
            dropped = ", ".join(f"{where} ({kind})" for where, kind in self.dropped_outputs.items())
            lines.append(
                f"dropped   {dropped}: the model's key/value cache, not a graph output (the module returns None "
                "there; generation= converts the cached step)"
            )
        for where, value in self.traced_branches.items():
            lines.append(
                f"branch    {where} -> {value}: a decision on tensor data, exported as the sample takes it (inputs "
                "that take the other branch get this one's result)"
            )
        if self.engine_options is not None:
            options = self.engine_options
            budget = options.get("weight_streaming_budget")
            flags = ", ".join(options.get("flags", [])) or "none"
            lines.append(
                f"engine    flags {flags}; weights in the {options.get('weights')}"
                + ("" if budget is None else f"; weight streaming budget {'automatic' if budget == -1 else budget}")
                + ("; CUDA graphs" if options.get("cuda_graphs") else "")
            )
        if self.precision is not None:
            lines.extend(self.precision.summary_lines())
        if self.quantization is not None:
            lines.extend(self.quantization.summary_lines())
        if self.compatibility is not None:
            problems = self.compatibility["problems"]
            lines.append(
                f"check     {self.compatibility.get('parser') or 'TensorRT ' + self.compatibility['trt_version']}: "
                + ("every node accepted" if not problems else f"{len(problems)} node(s) rejected")
            )
            for p in problems[:10]:
                lines.append(f"          {p['op']:<18} {p['node']}: {p['reason']}")
        if self.segments is not None:
            lines.extend(self.segments.summary_lines())
        if self.accuracy is None:
            lines.append("accuracy  not validated (validate=False)")
        else:
            verdict = "PASS" if self.accuracy.passed else "FAIL"
            # the rule is a paragraph: the report (report.json, accuracy.rule) carries it; the summary points to it
            lines.append(f"accuracy  {verdict} on {self.accuracy.inputs} inputs (the rule: report.accuracy.rule)")
            for o in self.accuracy.outputs:
                lines.append(
                    f"          {o.name:<20} {o.dtype:<8} max abs {o.max_abs:.2e} (atol {o.atol_used or o.atol:.3g})  "
                    f"max rel {o.max_rel:.2e} (rtol {o.rtol:g})  {o.outside}/{o.elements} outside"
                    + (f"  RMS error {o.relative_rms:.2e} x RMS (rms {o.rms:g})" if o.rms else "")
                    + f"  {'ok' if o.passed else 'FAIL'}"
                    + (f"  [{o.note}]" if o.note else "")
                )
            lines.extend(self.accuracy.dropped_lines())
            if self.accuracy.decoding is not None:
                lines.extend(self.accuracy.decoding.summary_lines())
        return "\n".join(lines)
