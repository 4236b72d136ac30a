"""The 4-bit formats of the quantize stage (``precision="int4"`` or ``"nvfp4"``): every MatMul/Gemm constant
weight becomes a block-quantized 4-bit initializer read through ``DequantizeLinear``
(:mod:`passes.quantize.weight_only`), the activations stay in ``quantize_fallback``: W4A16, the form TensorRT-RTX
builds (INT4 for compute capability 8.0 and later, NVFP4 for 12.0 and 12.1) and NVIDIA's Edge-LLM and ModelOpt ship
for language models.

Scales: ``calibration_method="max"`` (the default) takes each block's largest weight; ``"awq"`` runs the
activation-aware search of :mod:`pipeline.quantize.awq` on the float32 graph's activations over the calibration
inputs. ``keep_head`` leaves the output head (a MatMul/Gemm whose output reaches a graph output through element-wise
ops only) in the fallback type; ``keep_fp32`` leaves any node out. Gather embedding tables stay in the fallback
type unless ``quantize_embeddings`` (:mod:`passes.quantize.embeddings`: a tied head then reads the same 4-bit
table). ``nvfp4_activations`` quantizes the 4-bit MatMuls' activations to NVFP4 at run time too (W4A4,
:mod:`passes.quantize.dynamic_fp4`), each with the per-tensor scale of its calibrated largest magnitude.

Targets follow the precision: NVFP4 with no ``trt_compute_capabilities`` targets 12.0; a target the format cannot
run on (INT4 on 7.5, NVFP4 before 12.0) is an :class:`~converters.errors.InputError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from converters.errors import InputError
from passes import to_graph, to_model
from passes.quantize.blockwise import BlockFormat
from passes.quantize.dynamic_fp4 import activation_scale, quantizable, quantize_activations
from passes.quantize.embeddings import Table, find_tables, quantize_tables
from passes.quantize.placement import Target, plan_targets
from passes.quantize.weight_only import blockable, quantize_weights, weight_matrix
from passes.records import QuantizedOp, Skipped
from pipeline.precision.measure import Feed, observe
from pipeline.quantize.awq import awq, sample_tokens
from pipeline.quantize.format_step import QUANT_OPSET, FormatResult, StageInputs, quantization_report
from pipeline.quantize.search import measure_errors
from pipeline.quantize.tolerance import ENVELOPE_MARGIN
from pipeline.settings import Settings

#: Ops a head's output may pass through on its way to a graph output.
_HEAD_PATH = ("Add", "Cast", "Reshape", "Identity", "Squeeze", "Unsqueeze", "Transpose")


def target_settings(settings: Settings, fmt: BlockFormat) -> Settings:
    """TensorRT targets chosen from the precision: NVFP4 targets compute capability 12.0 when none is given; a given
    target the format cannot run on is an InputError."""
    low = [cc for cc in settings.trt_compute_capabilities if _capability(cc) < fmt.min_compute_capability]
    if low:
        major, minor = fmt.min_compute_capability
        raise InputError(
            f"precision={fmt.name!r} cannot run on compute capability {', '.join(low)}: TensorRT builds "
            f"{fmt.dtype_name} weights for compute capability {major}.{minor} and later"
            + (" (12.0 and 12.1, Blackwell RTX)" if fmt.name == "nvfp4" else ""),
            fix=f"drop {', '.join(low)} from trt_compute_capabilities, or use precision='int8' / 'fp16' there",
        )
    if fmt.name == "nvfp4" and not settings.trt_compute_capabilities:
        return dataclasses.replace(settings, trt_compute_capabilities=("12.0",))
    return settings


def _capability(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        raise InputError(f"trt_compute_capabilities entry {text!r} is not 'major.minor'", fix="e.g. ('8.9',)") from None


def quantize_four_bit(inputs: StageInputs, base: onnx.ModelProto, fmt: BlockFormat, method: str) -> FormatResult:
    """``base`` (the graph after the fallback's precision stage) with 4-bit MatMul/Gemm weights (and tables, and
    NVFP4 activations, when asked), their scales by ``method`` ("max" or "awq")."""
    settings, fp32_model, fp32_graph, feeds = inputs.settings, inputs.fp32_model, inputs.fp32_graph, inputs.feeds
    assert settings.block_size is not None  # Settings normalises it: the format's block (NVFP4: 16)
    block = fmt.block_size(settings.block_size)
    planned, skipped = plan_targets(fp32_graph, settings.keep_fp32)
    weighted = {t.node: t for t in planned}  # tied heads included: they read the 4-bit table
    planned, unblockable = blockable(planned, fp32_graph, block)
    planned, heads = _without_heads(fp32_graph, planned) if settings.keep_head else (planned, [])
    tables, untabled = find_tables(fp32_graph, block) if settings.quantize_embeddings else ([], [])
    tied = {name for table in tables for name in table.tied}
    planned = [t for t in planned if t.node not in tied]  # a tied head reads the 4-bit table: stored once
    skipped = [s for s in [*skipped, *unblockable, *heads, *untabled] if s.node not in tied]
    nodes = {n.name: n for n in fp32_graph.nodes}
    weights = {t.node: np.asarray(nodes[t.node].inputs[t.weight].values, np.float32) for t in planned if t.weight}
    scales: dict[str, np.ndarray] = {}
    notes = _notes(fmt, block, settings)
    if method == "awq":
        weights, scales, note = _awq(fp32_model, fp32_graph, planned, weights, feeds, fmt, block, settings)
        notes.append(note)
    graph, metadata = to_graph(base)
    raised = QUANT_OPSET <= int(graph.opset or 0) < fmt.min_opset
    if raised:
        graph.opset = fmt.min_opset  # FLOAT4E2M1 (see QUANT_OPSET)
    present = {n.name for n in graph.nodes}
    chosen = [t for t in planned if t.node in present]
    done = quantize_weights(graph, fmt, chosen, weights, block, scales)
    if tables:
        done += quantize_tables(graph, fmt, tables, _table_values(fp32_graph, tables), block)
        notes.append(_tables_note(tables, done))
    if settings.nvfp4_activations:
        targets = [weighted[op.node] for op in done if op.op != "Gather" and op.node in weighted]
        notes.append(_quantize_activations(fp32_model, fp32_graph, graph, targets, feeds, scales, settings))
    final = to_model(graph, base, {**inputs.exported.node_metadata, **metadata})
    if raised:
        for entry in final.opset_import:
            if entry.domain in ("", "ai.onnx"):
                entry.version = fmt.min_opset
    error, largest = measure_errors(final, settings, feeds, inputs.references)
    report = quantization_report(inputs, final, fmt, method, done, skipped, error, notes)
    record = f"quantize_{fmt.name}"
    count = len(graph.nodes)
    return FormatResult(final, report, _envelope_tolerances, settings, settings.backend, record, count, largest)


def _envelope_tolerances(largest: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """(atol, 0): :data:`~pipeline.quantize.tolerance.ENVELOPE_MARGIN` x each output's largest error."""
    return {name: (max(ENVELOPE_MARGIN * value, 1e-6), 0.0) for name, value in largest.items()}


def _table_values(graph: gs.Graph, tables: Sequence[Table]) -> dict[str, np.ndarray]:
    """Gather node -> its float32 table in the float32 graph."""
    nodes = {n.name: n for n in graph.nodes}
    return {t.node: np.asarray(nodes[t.node].inputs[0].values, np.float32) for t in tables}


def _tables_note(tables: Sequence[Table], done: Sequence[QuantizedOp]) -> str:
    stored = [op for op in done if op.op == "Gather"]
    tied = [f"{name} (tied to {table.node})" for table in tables for name in table.tied]
    return (
        f"quantize_embeddings: {len(stored)} embedding tables in 4 bits ({sum(op.weight_elements for op in stored)} "
        "values), DequantizeLinear before the Gather"
        + (f"; tied heads reading the same 4-bit table: {', '.join(tied)}" if tied else "")
    )


def _quantize_activations(
    fp32_model: onnx.ModelProto,
    fp32_graph: gs.Graph,
    graph: gs.Graph,
    targets: Sequence[Target],
    feeds: Sequence[Feed],
    scales: dict[str, np.ndarray],
    settings: Settings,
) -> str:
    """NVFP4 activations (W4A4) at the inputs of the 4-bit MatMuls TensorRT's dynamic quantization takes, each
    with the per-tensor scale of its largest magnitude on the calibration inputs (after AWQ's ``1 / s``); the note."""
    fp32_nodes = {n.name: n for n in fp32_graph.nodes}
    position = {t.node: t.activation for t in targets}
    inputs = {t.node: fp32_nodes[t.node].inputs[t.activation] for t in targets}
    reasons = {name: quantizable(tensor) for name, tensor in inputs.items()}
    chosen = [name for name, reason in reasons.items() if reason is None]
    sources = {name: inputs[name].name for name in chosen}
    amax: dict[str, float] = dict.fromkeys(sources.values(), 0.0)
    inverse = {sources[n]: 1.0 / scales[n] for n in chosen if n in scales}

    def visit(name: str, _: int, value: np.ndarray) -> None:
        wide = np.abs(value.astype(np.float32)) * inverse.get(name, 1.0)
        amax[name] = max(amax[name], float(wide.max(initial=0.0)))

    observe(fp32_model, feeds, list(amax), visit, settings.ort_providers)
    scale2 = {n: activation_scale(amax[sources[n]]) for n in chosen}
    quantized = quantize_activations(graph, [(n, position[n]) for n in chosen], scale2)
    kept = [f"{name} ({reason})" for name, reason in reasons.items() if reason is not None]
    return (
        f"W4A4: {quantized} activation tensors of {len(chosen)} MatMuls quantized to NVFP4 at run time "
        "(trt::TRT_FP4DynamicQuantize, blocks of 16, FP8 scales, a per-tensor scale of the calibrated amax / "
        "(6 * 448)); ONNX Runtime runs its exact emulation (float32 ops), TensorRT the real op (compute capability "
        "12.x)" + (f"; float activations kept at {', '.join(kept)}" if kept else "")
    )


def _without_heads(graph: gs.Graph, targets: Sequence[Target]) -> tuple[list[Target], list[Skipped]]:
    """The targets that are not output heads, and the heads (``keep_head``)."""
    outputs = {t.name for t in graph.outputs}
    nodes = {n.name: n for n in graph.nodes}
    kept, heads = [], []
    for target in targets:
        tensor = nodes[target.node].outputs[0]
        while tensor.name not in outputs and len(tensor.outputs) == 1 and tensor.outputs[0].op in _HEAD_PATH:
            tensor = tensor.outputs[0].outputs[0]
        if tensor.name in outputs:
            reason = f"keep_head: computes graph output {tensor.name!r} (keep_head=False quantizes it)"
            heads.append(Skipped(target.node, target.op, reason))
        else:
            kept.append(target)
    return kept, heads


def _awq(
    fp32_model: onnx.ModelProto,
    fp32_graph: gs.Graph,
    targets: Sequence[Target],
    weights: dict[str, np.ndarray],
    feeds: Sequence[Feed],
    fmt: BlockFormat,
    block: int,
    settings: Settings,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], str]:
    """AWQ's scales and clipped weights (in each node's own layout) from the float32 graph's activations."""
    nodes = {n.name: n for n in fp32_graph.nodes}
    groups: dict[str, list[str]] = {}
    for target in targets:
        groups.setdefault(nodes[target.node].inputs[target.activation].name, []).append(target.node)
    seen: dict[str, list[np.ndarray]] = {name: [] for name in groups}
    observe(fp32_model, feeds, list(groups), lambda name, _, value: seen[name].append(value), settings.ort_providers)
    activations = {name: sample_tokens(values, settings.seed) for name, values in seen.items()}
    matrices = {t.node: weight_matrix(t, weights[t.node]) for t in targets}
    scale_type = np.float16 if settings.quantize_fallback == "fp16" else np.float32
    scales, clipped, choices = awq(fmt, groups, activations, matrices, block, scale_type)
    by_node = {t.node: t for t in targets}
    layouts = {n: (m if by_node[n].axis == 0 else m.T) for n, m in clipped.items()}
    gain = sum(c.error_max for c in choices) / max(sum(c.error_awq for c in choices), 1e-30)
    alphas = ", ".join(f"{c.alpha:.2f}" for c in choices)
    note = (
        f"awq (Lin et al., MLSys 2024): {len(choices)} activation tensors, alphas {alphas}; summed layer output "
        f"error {gain:.2f}x lower than max scales on up to {max(len(a) for a in activations.values())} calibration "
        "tokens per tensor"
    )
    return {**weights, **layouts}, scales, note


def _notes(fmt: BlockFormat, block: int, settings: Settings) -> list[str]:
    if fmt.name == "int4":
        form = f"INT4 weights, symmetric, one scale per {block} input channels (zero points 0)"
        runs = (
            "ONNX Runtime fuses them into MatMulNBits at accuracy level "
            f"{settings.ort_int4_accuracy_level} (ort_int4_accuracy_level; 1: float32, exact)"
        )
    else:
        form = "NVFP4 weights: FP4 E2M1 values, FP8 E4M3 scales per block of 16, one float32 scale per tensor"
        runs = "ONNX Runtime has no FP4 kernel: it runs the exact emulation (the weights dequantized ahead of time)"
    major, minor = fmt.min_compute_capability
    return [
        f"{form}; activations in {settings.quantize_fallback} (weight-only)",
        runs,
        f"TensorRT builds {fmt.dtype_name} for compute capability {major}.{minor} and later"
        + (" (12.x)" if fmt.name == "nvfp4" else ""),
        "validation: rtol 0, atol = 2 x the largest error of the graph on ONNX Runtime on the calibration and "
        "validation inputs (report.quantization.tolerances), unless tolerances= names the output or 'float32'",
    ]
