"""Text renderings of a comparison report: the Markdown file and the short terminal table."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.compare.layers import Divergence

if TYPE_CHECKING:
    from pipeline.compare.report import ComparisonReport

_MAX_NODES = 40  # nodes listed under the first divergence; the JSON lists all


def render_markdown(report: ComparisonReport, directory: Path) -> str:
    verdict = "PASS" if report.passed else "FAIL"
    lines = [
        f"# {report.model} against PyTorch: {verdict}",
        "",
        f"- **Inputs**: {report.inputs} ({report.input_source})",
        f"- **Reference**: `{report.reference}` ({report.reference_dtype})",
        f"- **Rule**: {report.rule}",
        "- **Tolerances**: per output in the tables (settings `tolerances=`, by dtype, output name or module path)",
        "",
        "## Runners",
        "",
        "| runner | what | status |",
        "|---|---|---|",
    ]
    lines += [
        f"| `{r.name}` | {r.description} | {'skipped: ' + r.skipped if r.skipped else 'ran'} |" for r in report.runners
    ]
    lines += [
        "",
        "## Outputs",
        "",
        "| runner | output | dtype | max abs | mean abs | median abs | p99 abs | max rel "
        "| mean rel | median rel | p99 rel | cosine | outside | atol | rtol | verdict |",
        "|" + "---|" * 16,
    ]
    for o in report.outputs:
        s = o.stats
        lines.append(
            f"| `{o.runner}` | `{o.output}` | {o.dtype} | {s.max_abs:.3g} | {s.mean_abs:.3g} | {s.median_abs:.3g} "
            f"| {s.p99_abs:.3g} | {s.max_rel:.3g} | {s.mean_rel:.3g} | {s.median_rel:.3g} | {s.p99_rel:.3g} "
            f"| {s.cosine:.6f} | {s.outside} / {s.elements} | {o.atol:g} | {o.rtol:g} | {_verdict(o.passed, s)} |"
        )
    files = report.files()
    for output in dict.fromkeys(o.output for o in report.outputs):
        lines += ["", f"![absolute error histogram of {output}]({files['histogram:' + output]})"]
    if report.layers is not None:
        lines += _layers_markdown(report, files)
    lines += [
        "",
        "## Reproduce with Polygraphy",
        "",
        "The saved final graph on the saved inputs, compared with the saved PyTorch outputs under the same rule "
        "(TensorRT against ONNX Runtime, then ONNX Runtime against PyTorch):",
        "",
        "```bash",
        shlex.join(report.polygraphy_command(directory)),
        "```",
        "",
        "Without TensorRT (ONNX Runtime against PyTorch):",
        "",
        "```bash",
        shlex.join(report.polygraphy_command(directory, tensorrt=False)),
        "```",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in report.versions.items()),
        "",
    ]
    return "\n".join(lines)


def _layers_markdown(report: ComparisonReport, files: dict[str, str]) -> list[str]:
    layers = report.layers
    assert layers is not None
    lines = ["", f"## Per layer ({layers.backend} on the final graph against `{report.reference}`)", ""]
    if layers.note:
        lines += [f"Intermediates from: {layers.note}.", ""]
    divergence = layers.first_divergence
    if divergence is None:
        lines.append("No module is outside tolerance." if layers.layers else "No module could be matched.")
    else:
        lines += _divergence_markdown(divergence)
    if "layers_plot" in files:
        lines += ["", f"![max absolute error along depth]({files['layers_plot']})"]
    lines += [
        "",
        "| # | module | type | tensor | node | max abs | max rel | p99 abs | cosine | outside | atol | rtol "
        "| verdict |",
        "|" + "---|" * 13,
    ]
    for i, r in enumerate(layers.layers):
        s = r.stats
        lines.append(
            f"| {i} | `{r.module}` | {r.type_name} | `{r.tensor}` | `{r.node}` ({r.op_type}) | {s.max_abs:.3g} "
            f"| {s.max_rel:.3g} | {s.p99_abs:.3g} | {s.cosine:.6f} | {s.outside} / {s.elements} | {r.atol:g} "
            f"| {r.rtol:g} | {_verdict(r.passed, s)} |"
        )
    lines += ["", f"### Not matched ({len(layers.unmatched)} modules)", ""]
    if layers.unmatched:
        lines += ["| module | type | why |", "|---|---|---|"]
        lines += [f"| `{m}` | {t} | {why} |" for m, t, why in layers.unmatched]
    else:
        lines.append("Every module that ran was matched.")
    lines += [
        "",
        f"{layers.nodes_without_module} ONNX node(s) carry no module scope. Matching: each module's output is "
        "compared with the tensor of the last ONNX node (topological order) under its name scope whose dtype "
        "and shape fit; a module run several times is compared at its last call. Intermediates were observed in "
        f"{layers.chunks} chunk(s) within a budget of {layers.memory_budget / 2**20:.0f} MiB.",
    ]
    return lines


def _divergence_markdown(divergence: Divergence) -> list[str]:
    r, s = divergence.layer, divergence.layer.stats
    lines = [
        f"**First divergence: `{r.module}`** ({r.type_name}): tensor `{r.tensor}` from node `{r.node}` "
        f"({r.op_type}); max abs {s.max_abs:.3g}, max rel {s.max_rel:.3g}, {s.outside} of {s.elements} elements "
        f"outside (atol {r.atol:g}, rtol {r.rtol:g}).",
        "",
        "Suspect nodes (under it, not under a submodule that matched within tolerance): "
        + _node_list(divergence.suspects),
        "",
        f"All {len(divergence.nodes)} ONNX nodes under it: " + _node_list(divergence.nodes),
    ]
    return lines


def render_table(report: ComparisonReport, directory: Path | None) -> str:
    """The short terminal summary: verdict, rule, one line per output and backend, the first divergence."""
    verdict = "PASS" if report.passed else "FAIL"
    lines = [
        f"comparison  {verdict}  {report.model} against {report.reference} ({report.reference_dtype}) on "
        f"{report.inputs} inputs ({report.input_source})",
        f"rule        {report.rule}",
        f"  {'runner':<22} {'output':<22} {'max abs':>9} {'p99 abs':>9} {'max rel':>9} {'cosine':>9} "
        f"{'outside':>15}  {'atol/rtol':<14} verdict",
    ]
    for o in report.outputs:
        s = o.stats
        lines.append(
            f"  {o.runner:<22} {o.output:<22} {s.max_abs:>9.2e} {s.p99_abs:>9.2e} {s.max_rel:>9.2e} "
            f"{s.cosine:>9.6f} {f'{s.outside}/{s.elements}':>15}  {f'{o.atol:g}/{o.rtol:g}':<14} "
            f"{_verdict(o.passed, s)}"
        )
    skipped = [f"{r.name}: {r.skipped}" for r in report.runners if r.skipped]
    lines += [f"skipped     {text}" for text in skipped]
    if report.layers is not None:
        lines += _layers_table(report)
    if directory is not None:
        plots = sum(name.endswith(".png") for name in report.files().values())
        lines.append(f"report      {directory / 'report.md'}  (report.json, {plots} PNG plots)")
        lines.append(f"reproduce   {shlex.join(report.polygraphy_command(directory))}")
    return "\n".join(lines)


def _layers_table(report: ComparisonReport) -> list[str]:
    layers = report.layers
    assert layers is not None
    lines = [
        f"per layer   on {layers.backend}: {len(layers.layers)} modules compared, {len(layers.unmatched)} not matched, "
        f"{layers.chunks} chunk(s) of <= {layers.memory_budget / 2**20:.0f} MiB"
    ]
    divergence = layers.first_divergence
    if divergence is None:
        lines.append("            no module outside tolerance")
        return lines
    r = divergence.layer
    lines.append(f"first divergence  {r.module} ({r.type_name})  tensor {r.tensor} from {r.node} ({r.op_type})")
    lines.append(f"            suspect nodes: {_node_list(divergence.suspects, limit=8, code=False)}")
    index = layers.layers.index(r)
    shown = layers.layers[max(0, index - 2) : index + 3]
    width = max(len(row.module) for row in shown)
    for row in shown:
        s = row.stats
        lines.append(
            f"  {'>' if row is r else ' '} {row.module:<{width}}  max abs {s.max_abs:.2e}  max rel {s.max_rel:.2e}  "
            f"outside {s.outside}/{s.elements}  {_verdict(row.passed, s)}"
        )
    return lines


def _node_list(nodes: Sequence[tuple[str, str]], limit: int = _MAX_NODES, code: bool = True) -> str:
    if not nodes:
        return "none"
    quote = "`" if code else ""
    shown = ", ".join(f"{quote}{name}{quote} ({op})" for name, op in nodes[:limit])
    return shown + (f", ... ({len(nodes) - limit} more)" if len(nodes) > limit else "")


def _verdict(passed: bool, stats: object) -> str:
    mismatch = getattr(stats, "shape_mismatch", None)
    return "ok" if passed else ("FAIL (" + mismatch + ")" if mismatch else "FAIL")
