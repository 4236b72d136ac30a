"""Text renderings of a comparison report's data: the Markdown file and the short terminal table.

Both are functions of the report's JSON data (``ComparisonReport.to_dict(directory)``, the content of
``report.json``), so they render a report read back from disk as well, and the report itself does not depend on
how it is shown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_MAX_NODES = 40  # nodes listed under the first divergence; the JSON lists all

Data = Mapping[str, Any]


def render_markdown(data: Data) -> str:
    """``report.md``: verdict, runners, per-output statistics, plots, the per-layer table, the reproducer. ``data``
    is ``report.to_dict(directory)`` (with the directory: it names the files and the Polygraphy commands)."""
    files = {kind: Path(path).name for kind, path in data["files"].items()}
    lines = [
        f"# {data['model']} against PyTorch: {_pass(data['passed'])}",
        "",
        f"- **Inputs**: {data['inputs']['count']} ({data['inputs']['source']})",
        f"- **Reference**: `{data['reference']['runner']}` ({data['reference']['dtype']})",
        f"- **Rule**: {data['rule']}",
        "- **Tolerances**: per output in the tables (settings `tolerances=`, by dtype, output name or module path)",
        *_dropped_markdown(data.get("dropped", [])),
        "",
        "## Runners",
        "",
        "| runner | what | status |",
        "|---|---|---|",
    ]
    lines += [
        f"| `{r['name']}` | {r['description']} | {'skipped: ' + r['skipped'] if r['skipped'] else 'ran'} |"
        for r in data["runners"]
    ]
    lines += [
        "",
        "## Outputs",
        "",
        "| runner | output | dtype | max abs | mean abs | median abs | p99 abs | max rel "
        "| mean rel | median rel | p99 rel | cosine | outside | atol | rtol | verdict |",
        "|" + "---|" * 16,
    ]
    for o in data["outputs"]:
        n = _numbers(o)
        lines.append(
            f"| `{o['runner']}` | `{o['output']}` | {_dtype(o)} | {n['max_abs']:.3g} | {n['mean_abs']:.3g} "
            f"| {n['median_abs']:.3g} | {n['p99_abs']:.3g} | {n['max_rel']:.3g} | {n['mean_rel']:.3g} "
            f"| {n['median_rel']:.3g} | {n['p99_rel']:.3g} | {n['cosine']:.6f} | {o['outside']} / {o['elements']} "
            f"| {_atol(o)} | {o['rtol']:g} | {_verdict(o)} |"
        )
    lines += _notes(data["outputs"])
    if data.get("plots_missing"):
        lines += ["", f"*{data['plots_missing']}*"]
    for output in dict.fromkeys(o["output"] for o in data["outputs"]):
        if "histogram:" + output not in files:
            continue
        lines += ["", f"![absolute error histogram of {output}]({files['histogram:' + output]})"]
    if data["per_layer"] is not None:
        lines += _layers_markdown(data["per_layer"], data["reference"]["runner"], files)
    lines += [
        "",
        "## Reproduce with Polygraphy",
        "",
        "The saved final graph on the saved inputs, compared with the saved PyTorch outputs under the same rule "
        "(TensorRT against ONNX Runtime, then ONNX Runtime against PyTorch):",
        *_shape_only_caveat(data["outputs"]),
        "",
        "```bash",
        data["polygraphy_command"],
        "```",
        "",
        "Without TensorRT (ONNX Runtime against PyTorch):",
        "",
        "```bash",
        data["polygraphy_command_onnxruntime"],
        "```",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()),
        "",
    ]
    return "\n".join(lines)


def _dropped_markdown(dropped: Sequence[Data]) -> list[str]:
    """The header bullet on drawn inputs PyTorch refused (none when every input was compared)."""
    if not dropped:
        return []
    head = f"- **Dropped**: {len(dropped)} drawn input(s) PyTorch itself refused, not compared (JSON `dropped`):"
    return [head, *(f"  - {d['summary']}" for d in dropped)]


def _shape_only_caveat(outputs: Sequence[Data]) -> list[str]:
    """Polygraphy compares every output by value: say which ones this comparison judged by shape only."""
    names = list(dict.fromkeys(f"`{o['output']}`" for o in outputs if o.get("judged_by") == "shape"))
    if not names:
        return []
    return [
        "",
        f"Polygraphy compares {', '.join(names)} by value too: they are uninitialised memory (judged here by shape "
        "and dtype only), so a difference there is expected.",
    ]


def _layers_markdown(layers: Data, reference: str, files: Mapping[str, str]) -> list[str]:
    lines = ["", f"## Per layer ({layers['backend']} on the final graph against `{reference}`)", ""]
    if layers["backend_note"]:
        lines += [f"Intermediates from: {layers['backend_note']}.", ""]
    divergence = layers["first_divergence"]
    if divergence is None:
        lines.append("No module is outside tolerance." if layers["layers"] else "No module could be matched.")
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
    for i, r in enumerate(layers["layers"]):
        n = _numbers(r)
        lines.append(
            f"| {i} | `{r['module']}` | {r['type']} | `{r['tensor']}` | `{r['node']}` ({r['op_type']}) "
            f"| {n['max_abs']:.3g} | {n['max_rel']:.3g} | {n['p99_abs']:.3g} | {n['cosine']:.6f} "
            f"| {r['outside']} / {r['elements']} | {_atol(r)} | {r['rtol']:g} | {_verdict(r)} |"
        )
    unmatched = layers["unmatched"]
    lines += ["", f"### Not matched ({len(unmatched)} modules)", ""]
    if unmatched:
        lines += ["| module | type | why |", "|---|---|---|"]
        lines += [f"| `{u['module']}` | {u['type']} | {u['reason']} |" for u in unmatched]
    else:
        lines.append("Every module that ran was matched.")
    lines += [
        "",
        f"{layers['nodes_without_module']} ONNX node(s) carry no module scope. Matching: each module's output is "
        "compared with the tensor of the last ONNX node (topological order) under its name scope whose dtype "
        "and shape fit; a module run several times is compared at its last call. Intermediates were observed in "
        f"{layers['chunks']} chunk(s) within a budget of {layers['memory_budget_bytes'] / 2**20:.0f} MiB.",
    ]
    return lines


def _divergence_markdown(r: Data) -> list[str]:
    n = _numbers(r)
    return [
        f"**First divergence: `{r['module']}`** ({r['type']}): tensor `{r['tensor']}` from node `{r['node']}` "
        f"({r['op_type']}); max abs {n['max_abs']:.3g}, max rel {n['max_rel']:.3g}, {r['outside']} of "
        f"{r['elements']} elements outside (atol {r['atol']:g}, rtol {r['rtol']:g}).",
        "",
        "Suspect nodes (under it, not under a submodule that matched within tolerance): "
        + _node_list(r["suspect_nodes"]),
        "",
        f"All {len(r['nodes'])} ONNX nodes under it: " + _node_list(r["nodes"]),
    ]


#: The table's one line on the rule; the rule in full is in report.md, report.json and the README.
SHORT_RULE = "per element |x-ref| <= atol or rtol|ref|, else <= 2x/3x PyTorch's own error; full: report.md"


def render_table(data: Data) -> str:
    """The short terminal summary: verdict, rule, one line per output and backend, the first divergence; with
    the report's files in ``data`` (``report.to_dict(directory)``), where they are and the Polygraphy command."""
    lines = [
        f"comparison  {_pass(data['passed'])}  {data['model']} against {data['reference']['runner']} "
        f"({data['reference']['dtype']}) on {data['inputs']['count']} inputs ({data['inputs']['source']})",
        f"rule        {SHORT_RULE}",
        f"  {'runner':<22} {'output':<22} {'max abs':>9} {'p99 abs':>9} {'max rel':>9} {'cosine':>9} "
        f"{'outside':>15}  {'atol/rtol':<14} verdict",
    ]
    for o in data["outputs"]:
        n = _numbers(o)
        outside, tolerance = f"{o['outside']}/{o['elements']}", f"{_atol(o)}/{o['rtol']:g}"
        lines.append(
            f"  {o['runner']:<22} {o['output']:<22} {n['max_abs']:>9.2e} {n['p99_abs']:>9.2e} {n['max_rel']:>9.2e} "
            f"{n['cosine']:>9.6f} {outside:>15}  {tolerance:<14} {_verdict(o)}"
        )
    lines += [f"skipped     {r['name']}: {r['skipped']}" for r in data["runners"] if r["skipped"]]
    lines += [f"dropped     {d['summary']}" for d in data.get("dropped", [])]
    if data["per_layer"] is not None:
        lines += _layers_table(data["per_layer"])
    if "files" in data:
        files = data["files"]
        plots = sum(path.endswith(".png") for path in files.values())
        lines.append(f"report      {files['markdown']}  (report.json, {plots} PNG plots)")
        if data.get("plots_missing"):
            lines.append(f"            {data['plots_missing']}")
        lines.append(f"reproduce   {data['polygraphy_command']}")
    return "\n".join(lines)


def _layers_table(layers: Data) -> list[str]:
    rows = layers["layers"]
    lines = [
        f"per layer   on {layers['backend']}: {len(rows)} modules compared, {len(layers['unmatched'])} not matched, "
        f"{layers['chunks']} chunk(s) of <= {layers['memory_budget_bytes'] / 2**20:.0f} MiB"
    ]
    r = layers["first_divergence"]
    if r is None:
        lines.append("            no module outside tolerance")
        return lines
    lines.append(
        f"first divergence  {r['module']} ({r['type']})  tensor {r['tensor']} from {r['node']} ({r['op_type']})"
    )
    lines.append(f"            suspect nodes: {_node_list(r['suspect_nodes'], limit=8, code=False)}")
    index = next(i for i, row in enumerate(rows) if row["module"] == r["module"])
    shown = rows[max(0, index - 2) : index + 3]
    width = max(len(row["module"]) for row in shown)
    for row in shown:
        n = _numbers(row)
        lines.append(
            f"  {'>' if row['module'] == r['module'] else ' '} {row['module']:<{width}}  max abs {n['max_abs']:.2e}  "
            f"max rel {n['max_rel']:.2e}  outside {row['outside']}/{row['elements']}  {_verdict(row)}"
        )
    return lines


def _node_list(nodes: Sequence[Data], limit: int = _MAX_NODES, code: bool = True) -> str:
    if not nodes:
        return "none"
    quote = "`" if code else ""
    shown = ", ".join(f"{quote}{n['name']}{quote} ({n['op_type']})" for n in nodes[:limit])
    return shown + (f", ... ({len(nodes) - limit} more)" if len(nodes) > limit else "")


def _numbers(stats: Data) -> dict[str, float]:
    """The error statistics as floats (JSON writes inf and NaN as strings)."""
    keys = ("max_abs", "mean_abs", "median_abs", "p99_abs", "max_rel", "mean_rel", "median_rel", "p99_rel", "cosine")
    # a random output is judged by distribution: no element figures (NaN, printed "nan")
    return {k: float(stats.get(k, "nan")) for k in keys}


def _pass(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


def _atol(row: Data) -> str:
    """The atol used: for a magnitude-relative tolerance, the largest ``max(atol, rms_atol x RMS)`` over inputs."""
    if row.get("rms_atol"):
        return f"{float(row['atol_used']):.3g} ({row['rms_atol']:g} x RMS)"
    return f"{row['atol']:g}"


def _verdict(row: Data) -> str:
    shape = row.get("judged_by") == "shape"
    mismatch = row.get("mismatch" if shape else "shape_mismatch")
    verdict = "ok" if row["passed"] else ("FAIL (" + mismatch + ")" if mismatch else "FAIL")
    if row.get("rms_failed"):  # elements may all be inside while the tensor's RMS error is not
        verdict += f" (RMS error {float(row['relative_rms']):.3g} x RMS > {row['rms']:g})"
    if shape:
        return verdict + " (uninitialised: by shape and dtype)"
    return verdict + (" (random: by distribution)" if row.get("judged_by") == "distribution" else "")


def _dtype(row: Data) -> str:
    computed = row.get("computed_in")
    return row["dtype"] if not computed or computed == row["dtype"] else f"{row['dtype']} (as {computed})"


def _notes(outputs: list[Data]) -> list[str]:
    """One line per output comparison with a note (random outputs, types computed in another type)."""
    notes = [f"- `{o['runner']}` `{o['output']}`: {o['note']}" for o in outputs if o.get("note")]
    return ["", *notes] if notes else []
