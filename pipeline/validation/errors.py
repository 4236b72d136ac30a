"""The validation stage's error: which outputs failed, by how much, and which PyTorch op in which module computes
each (from the exporter's node metadata), so that an AccuracyError points at the model's code."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

import onnx

from converters.errors import AccuracyError
from pipeline.accuracy.anchor import NO_ANCHOR
from pipeline.accuracy.stats import ALL_NAN_NOTE

if TYPE_CHECKING:
    from pipeline.runtime.reports.accuracy import AccuracyReport


def output_origins(model: onnx.ModelProto) -> dict[str, str]:
    """Graph output name -> the PyTorch op that computes it and where, from the exporter's node metadata
    (``pkg.torch.onnx.class_hierarchy`` and ``name_scopes``, kept by the passes on the nodes they make), e.g.
    ``"aten._linalg_svd.default in module 'block' (__main__.B)"``; outputs without it are left out. A producer
    without metadata (a Cast the precision stage added) is looked through to its first input, a few nodes deep."""
    producers = {name: node for node in model.graph.node for name in node.output}
    origins = {}
    for output in model.graph.output:
        node = producers.get(output.name)
        for _ in range(8):
            if node is None:
                break
            origin = _origin(node)
            if origin:
                origins[output.name] = origin
                break
            node = producers.get(node.input[0]) if node.input else None
    return origins


def _origin(node: onnx.NodeProto) -> str:
    meta = {p.key: p.value for p in node.metadata_props}
    try:
        classes = ast.literal_eval(meta.get("pkg.torch.onnx.class_hierarchy", "[]"))
        scopes = ast.literal_eval(meta.get("pkg.torch.onnx.name_scopes", "[]"))
    except (ValueError, SyntaxError):
        return ""
    if not classes or not isinstance(classes, list):
        return ""
    where = ".".join(str(s) for s in scopes[1:-1]) if isinstance(scopes, list) else ""
    owner = f" ({classes[-2]})" if len(classes) > 1 else ""
    return f"{classes[-1]} in module {where!r}{owner}" if where else f"{classes[-1]} in the model's forward{owner}"


def raise_accuracy_error(report: AccuracyReport, origins: dict[str, str], cause: str | None = None) -> None:
    """The AccuracyError for a failed ``report``: each failing output's summary and the PyTorch op that computes it;
    ``cause``, when validation found why (:mod:`pipeline.validation.attention_paths`), leads the message and the
    fix."""
    dropped = f" ({len(report.dropped)} drawn input(s) dropped: PyTorch refused them)" if report.dropped else ""
    failing = [
        o.summary() + (f" [computed by {origins[o.name]}]" if o.name in origins else "")
        for o in report.outputs
        if not o.passed
    ]
    fix = (
        "if the difference is expected, loosen it with tolerances={'<output or dtype>': (atol, rtol)}; "
        "otherwise inspect module.onnx, or convert with validate=False to get the module anyway"
    )
    if any(NO_ANCHOR in o.note for o in report.outputs if not o.passed):
        fix = (
            "PyTorch's own half precision overflows on this model (the note says where): convert with "
            "precision='bf16' (float32's range), or keep_fp32= the modules whose values leave float16's range "
            "(pipeline compare --per-layer shows them); " + fix
        )
    if any(ALL_NAN_NOTE in o.note for o in report.outputs if not o.passed):
        fix = (
            "the model itself computes NaN at every element of an output (PyTorch too: nothing could be compared): "
            "check its weights for NaN or inf (a diverged or badly loaded checkpoint) and give a sample it computes "
            "finite values on; " + fix
        )
    if cause is not None:
        fix = (
            "call model.set_attn_implementation('eager') before converting: PyTorch then applies the causal mask on "
            "every input, as the graph does (report the model to transformers: its 'sdpa' path attends "
            "bidirectionally only when nothing is padded); " + fix
        )
    because = f" ({cause})" if cause is not None else ""
    raise AccuracyError(
        f"outputs differ from PyTorch beyond tolerance on {report.inputs} input(s){dropped}{because}: "
        + "; ".join(failing),
        per_output={
            o.name: {
                "max_abs": o.max_abs,
                "max_rel": o.max_rel,
                "atol": o.atol,
                "rtol": o.rtol,
                "relative_rms": o.relative_rms,
                "rms": o.rms,
            }
            for o in report.outputs
        },
        fix=fix,
    )
