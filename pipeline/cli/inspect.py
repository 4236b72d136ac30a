"""``pipeline inspect model.ptrt``: what an artifact holds, read from its metadata without loading the model.

Inputs and their dims (dynamic ones with their ranges), the settings that differ from the defaults, library
versions, the passes that changed the graph, precision islands, accuracy, and whether an engine is inside (for which
library, version and GPU targets). A generation module saved as a directory (an encoder-decoder's graphs, a
vision-language model's, a recurrent model's step and prompt graph) is each of its artifacts in turn.
"""

from __future__ import annotations

import argparse
import json
import zipfile
from pathlib import Path
from typing import Any

from converters.errors import ArtifactError
from pipeline.settings import Settings


def add_inspect_command(commands: Any) -> None:
    """Add the ``inspect`` subcommand to ``pipeline``'s subparsers."""
    parser = commands.add_parser("inspect", help="show what an artifact (.ptrt) holds, without loading it")
    parser.add_argument(
        "artifact", type=Path, help="a .ptrt written by convert or module.save (a file, or a directory of them)"
    )
    parser.add_argument("--json", action="store_true", help="print the metadata as JSON")
    parser.set_defaults(run=_inspect)


def read_metadata(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """The artifact's metadata and its members' sizes (bytes); an unreadable file is an ArtifactError."""
    from pipeline.runtime.artifact import METADATA_MEMBER

    fix = "pass a .ptrt file written by `pipeline convert` or `module.save`"
    if not path.is_file():
        raise ArtifactError(f"no artifact at {path}", fix="check the path")
    try:
        with zipfile.ZipFile(path) as archive:
            sizes = {info.filename: info.file_size for info in archive.infolist()}
            metadata = json.loads(archive.read(METADATA_MEMBER))
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        raise ArtifactError(f"{path} is not a readable artifact: {exc}", fix=fix) from exc
    if not isinstance(metadata, dict):
        raise ArtifactError(f"{path}: its metadata is not a JSON object", fix=fix)
    return metadata, sizes


def describe(metadata: dict[str, Any], sizes: dict[str, int]) -> list[str]:
    """The lines ``pipeline inspect`` prints."""
    from pipeline.runtime.artifact import ENGINE_MEMBER, ONNX_MEMBER

    lines = [f"format    {metadata.get('format', '?')}, created {metadata.get('created', '?')}"]
    lines.append(f"backend   {metadata.get('backend', '?')}")
    lines += _io_lines(metadata.get("io", {}), metadata.get("settings", {}))
    lines.append(f"graph     {ONNX_MEMBER} {sizes.get(ONNX_MEMBER, 0) / 1e6:.2f} MB" + _data_size(sizes))
    engine = metadata.get("engine")
    if ENGINE_MEMBER in sizes:
        built = ", ".join(f"{k} {v}" for k, v in (engine or {}).items() if k != "build")
        lines.append(f"engine    {ENGINE_MEMBER} {sizes[ENGINE_MEMBER] / 1e6:.2f} MB, built for {built or '?'}")
    elif any(name.startswith("engine-segment-") for name in sizes):  # TensorRT segments, ONNX Runtime between
        plans = [size for name, size in sizes.items() if name.startswith("engine-segment-")]
        built = ", ".join(f"{k} {v}" for k, v in (engine or {}).items() if k != "build")
        kinds = [s.get("kind") for s in metadata.get("segments", [])]
        lines.append(
            f"engines   {len(plans)} TensorRT segment engine(s), {sum(plans) / 1e6:.2f} MB, built for {built or '?'}; "
            f"{kinds.count('onnxruntime')} ONNX Runtime segment(s) between them"
        )
    else:
        lines.append("engine    none (the graph runs on ONNX Runtime, or an engine is built at load)")
    lines += _settings_lines(metadata.get("settings", {}))
    report = metadata.get("report", {})
    lines += _report_lines(report)
    versions = metadata.get("versions", {})
    lines.append("versions  " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    return lines


def _io_lines(io: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    from pipeline.runtime.io_spec import IOSpec

    spec = IOSpec.from_json(io)
    ranges = {(d["input"], d["axis"]): d for d in settings.get("dynamic", []) if isinstance(d, dict)}
    lines = []
    for kind, tensors in (("input", spec.inputs), ("output", spec.outputs)):
        for tensor in tensors:
            dims = []
            for axis, size in enumerate(tensor.shape):
                d = ranges.get((tensor.name, axis))
                dims.append(f"{d['name']}[{d['min']}..{d['max']}, opt {d['opt']}]" if d else str(size))
            lines.append(f"{kind:<9} {tensor.name}: {tensor.dtype} [{', '.join(dims)}]")
    return lines


def _data_size(sizes: dict[str, int]) -> str:
    from pipeline.runtime.artifact import DATA_MEMBER

    return f", external weights {sizes[DATA_MEMBER] / 1e6:.2f} MB" if DATA_MEMBER in sizes else ""


def _settings_lines(saved: dict[str, Any]) -> list[str]:
    defaults = Settings()
    skipped = ("dynamic", "cache_dir", "weights_dir")  # shown with the inputs, or machine paths
    changed = {
        k: v
        for k, v in saved.items()
        if k not in skipped and hasattr(defaults, k) and _differs(getattr(defaults, k), v)
    }
    text = ", ".join(f"{k}={v!r}" for k, v in sorted(changed.items())) or "all defaults"
    return [f"settings  {text}"]


def _differs(default: Any, value: Any) -> bool:
    if isinstance(default, tuple):
        return list(default) != list(value)
    if isinstance(default, dict) or hasattr(default, "items"):
        return bool(value)
    return bool(default != value)


def _report_lines(report: dict[str, Any]) -> list[str]:
    lines = [f"why       {report.get('backend_reason', '?')}"]
    changed = [p["name"] for p in report.get("passes", []) if p.get("modified")]
    lines.append(
        f"passes    {report.get('nodes_exported', '?')} nodes exported -> {report.get('nodes_final', '?')} final; "
        f"changed by: {', '.join(dict.fromkeys(changed)) or 'none'}"
    )
    precision = report.get("precision")
    if precision:
        islands = precision.get("islands", [])
        lines.append(
            f"precision {precision.get('precision')}: {precision.get('share', 0):.1%} of the compute in "
            f"{precision.get('dtype')}, {len(islands)} float32 islands"
        )
        lines += [f"          {i['source']:<8} {i['op']:<18} {i['node']}: {i['reason']}" for i in islands[:12]]
    accuracy = report.get("accuracy")
    if accuracy:
        for out in accuracy.get("outputs", []):
            verdict = "PASS" if out.get("passed") else "FAIL"
            lines.append(
                f"accuracy  {out['name']}: {verdict} max abs {out['max_abs']:.3g} (atol {out['atol']:g}), "
                f"max rel {out['max_rel']:.3g} (rtol {out['rtol']:g}) on {accuracy.get('inputs')} inputs"
            )
    else:
        lines.append("accuracy  not validated")
    return lines


def artifact_files(path: Path) -> list[Path]:
    """The artifact files at ``path``: itself, or those of a directory a generation module's save wrote (each
    ``.ptrt`` file in it and in its directories, in order); a directory holding none is an ArtifactError."""
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.rglob("*.ptrt") if p.is_file())
    if not files:
        raise ArtifactError(
            f"{path} is a directory holding no .ptrt artifact",
            fix="pass a .ptrt file, or a directory a generation module's save wrote",
        )
    return files


def _inspect(args: argparse.Namespace) -> int:
    path: Path = args.artifact
    files = artifact_files(path)
    read = {file: read_metadata(file) for file in files}
    if args.json:
        described = {str(f.relative_to(path)) if f != path else str(f): m for f, m in read.items()}
        body = {name: {"metadata": m, "members": s} for name, (m, s) in described.items()}
        print(json.dumps(body[str(path)] if files == [path] else body, indent=2))
        return 0
    for file, (metadata, sizes) in read.items():
        if file != path:
            print(f"== {file.relative_to(path)} ==")
        print("\n".join(describe(metadata, sizes)))
    return 0
