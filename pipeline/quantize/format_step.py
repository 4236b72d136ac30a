"""What each format's quantization takes and gives, and the report they share.

The quantize stage (:mod:`pipeline.quantize.stage`) runs one flow for every format: it draws the calibration inputs
and PyTorch's outputs on them (:class:`StageInputs`), converts the unquantized part to ``quantize_fallback``, hands
the graph to the format's quantization (:mod:`pipeline.quantize.eight_bit`: INT8/FP8 Q/DQ pairs;
:mod:`pipeline.quantize.four_bit`: INT4/NVFP4 weights) and judges what that gives back (:class:`FormatResult`):
the envelope of its error, the tolerances validation holds the backend to, the quantized share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from passes.precision.types import LOW_TYPES
from passes.quantize.blockwise import BlockFormat
from passes.quantize.formats import QuantFormat
from passes.records import QuantizedOp, Skipped
from pipeline.exporting.stage import ExportedGraph
from pipeline.precision.measure import Feed
from pipeline.precision.share import compute_share
from pipeline.runtime.reports.quantization import QuantizationReport
from pipeline.settings import Settings

#: The opset quantized graphs export at (unless ``opset`` is given): float8 and float16 scales need 19, blocked
#: DequantizeLinear 21, and TensorRT-RTX's INT8/FP8 Q/DQ support was verified at 21. NVFP4's FLOAT4E2M1 needs 23,
#: but at 23 the exporter writes scaled_dot_product_attention as one ``Attention`` node, which TensorRT-RTX 1.7's
#: builder fails on for shapes without a dedicated kernel ("Attention operation was not supported by a dedicated
#: kernel"): the graph is exported at 21 and its opset raised to 23 by the 4-bit rewrite (opsets 22 and 23 only added
#: types and new ops).
QUANT_OPSET = 21
#: The ops whose constant weight (input 1) the report counts.
_HEAVY_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")

Format = QuantFormat | BlockFormat
#: Per float output: (atol, rtol), from each output's largest absolute error as ONNX Runtime runs the final graph.
Tolerances = Callable[[Mapping[str, float]], dict[str, tuple[float, float]]]


@dataclass(frozen=True)
class StageInputs:
    """The float32 graph after the passes (as a model and as a graph), its export, the calibration inputs PyTorch
    takes and PyTorch's outputs on them, and the settings."""

    fp32_model: onnx.ModelProto
    fp32_graph: gs.Graph
    exported: ExportedGraph
    feeds: Sequence[Feed]
    references: Sequence[dict[str, np.ndarray]]
    settings: Settings


@dataclass(frozen=True)
class FormatResult:
    """A format's quantized graph, its report (the tolerances still to come), how to derive those from the measured
    envelope, the settings and backend the graph is measured for, and the name of its pass record."""

    model: onnx.ModelProto
    report: QuantizationReport
    tolerances: Tolerances
    measured: Settings
    backend: str
    record: str
    nodes_before: int
    #: each float output's largest absolute error on the calibration inputs, when the format measured it already
    feed_errors: Mapping[str, float] | None = None


def quantization_report(
    inputs: StageInputs,
    final: onnx.ModelProto,
    fmt: Format,
    method: str,
    quantized: Sequence[QuantizedOp],
    skipped: Sequence[Skipped],
    error: float,
    notes: Sequence[str],
    **extra: Any,
) -> QuantizationReport:
    """The report of any format: what was quantized, its share of the MatMul/Gemm/Conv FLOPs and weight elements of
    the float32 graph, and the format's own fields (``extra``)."""
    settings = inputs.settings
    # every heavy node of the float32 graph counts as "not fp16" there: its FLOPs by node, from the shared counter
    flops = compute_share(inputs.fp32_model, LOW_TYPES["fp16"], {d.name: d.opt for d in settings.dynamic}).fp32_flops
    weights = _weight_elements(inputs.fp32_model)
    nodes = {op.node for op in quantized}
    return QuantizationReport(
        precision=fmt.name,
        dtype=fmt.dtype_name,
        fallback=settings.quantize_fallback,
        method=method,
        opset=next((o.version for o in final.opset_import if o.domain in ("", "ai.onnx")), 0),
        quantized=tuple(quantized),
        skipped=tuple(skipped),
        quantized_flops=sum(f for n, f in flops.items() if n in nodes),
        total_flops=sum(flops.values()),
        quantized_weights=sum(w for n, w in weights.items() if n in nodes),
        total_weights=sum(weights.values()),
        calibration_inputs=len(inputs.feeds),
        relative_error=error,
        notes=tuple(notes),
        **extra,
    )


def _weight_elements(model: onnx.ModelProto) -> dict[str, int]:
    """Node -> elements of its constant weight (input 1), for every MatMul/Gemm/Conv/ConvTranspose that has one."""
    sizes = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    weighted = [n for n in model.graph.node if n.op_type in _HEAVY_OPS and len(n.input) > 1 and n.input[1] in sizes]
    return {n.name: sizes[n.input[1]] for n in weighted}
