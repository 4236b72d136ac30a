"""One artifact file per converted model: the final ONNX, the engine bytes when TensorRT built one, metadata.

The file is a zip archive (members stored, not compressed): ``metadata.json``, ``model.onnx``, optionally
``engine.plan``, and ``model.onnx.data`` when the graph keeps its weights in external data (large models; streamed
in and out, never held whole in memory). The metadata holds versions, the I/O spec, the settings, the report and a
SHA-256 of every other member; loading checks all of it. Writing goes to a temporary file in the target directory
and is renamed into place, so a crash never leaves a half-written artifact under the requested name.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import onnx

from converters.errors import ArtifactError
from converters.files import write_file_atomically
from converters.plugins.spec import plugin_records
from converters.settings import DynamicDim, Settings, Tolerance
from passes.model_io.external_data import (
    WeightFiles,
    has_external_data,
    set_weights_dir,
    without_weights_dir,
    write_compact,
)
from pipeline.module.io_spec import IOSpec
from pipeline.module.report import ConversionReport

FORMAT = "torch-trt-pipeline-artifact/1"
ONNX_MEMBER = "model.onnx"
ENGINE_MEMBER = "engine.plan"
DATA_MEMBER = "model.onnx.data"  # the external weights of model.onnx, when it keeps them outside the graph
METADATA_MEMBER = "metadata.json"


@dataclass(frozen=True)
class Artifact:
    """A verified artifact: its metadata, the final graph, the engine bytes if any, and the unpacked weights."""
    metadata: dict[str, Any]
    onnx_model: onnx.ModelProto
    engine: bytes | None
    weights: WeightFiles | None = None  # where the graph's external weights were unpacked; keep it alive with it

    @property
    def io(self) -> IOSpec:
        """The I/O spec saved with the artifact."""
        return IOSpec.from_json(self.metadata["io"])

    @property
    def settings(self) -> Settings:
        """The settings saved with the artifact."""
        return settings_from_json(self.metadata["settings"])


def save_artifact(
    path: Path,
    *,
    onnx_model: onnx.ModelProto,
    engine: bytes | None,
    backend: str,
    io: IOSpec,
    settings: Settings,
    report: ConversionReport,
) -> Path:
    """Write a converted model (what ``ConvertedModule.save`` hands over) as one artifact; external weights are
    streamed into a ``model.onnx.data`` member. :func:`pipeline.load` reads it back."""
    from pipeline.versions import library_versions

    metadata: dict[str, Any] = {
        "format": FORMAT,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "backend": backend,
        "versions": library_versions(),
        "io": io.to_json(),
        "settings": settings_to_json(settings),
        "report": report.to_dict(),
    }
    plugins = plugin_records(onnx_model)
    if plugins:  # the torch op (and its module) behind each plugin node: pipeline.load re-registers them
        metadata["plugins"] = plugins
    if engine is not None:
        from pipeline.backends.tensorrt.build import build_options, device_identity
        from pipeline.backends.tensorrt.library import library_for

        # what the engine was built for and with: the same record the engine cache keys on
        identity = device_identity(library_for(backend), settings)
        metadata["engine"] = {**identity, "build": build_options(io, settings)}

    def write_zip(handle: BinaryIO) -> None:
        with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_STORED) as archive:
            digests: dict[str, str] = {}
            graph = without_weights_dir(onnx_model)
            if has_external_data(graph):  # write_compact's graph points at the member, not at this machine's files
                with archive.open(DATA_MEMBER, "w", force_zip64=True) as out:
                    graph, digests[DATA_MEMBER] = write_compact(onnx_model, out, DATA_MEMBER)
            members = {ONNX_MEMBER: graph.SerializeToString()}
            if engine is not None:
                members[ENGINE_MEMBER] = engine
            digests.update((name, hashlib.sha256(data).hexdigest()) for name, data in members.items())
            metadata["sha256"] = digests
            for name, data in members.items():
                archive.writestr(name, data)
            archive.writestr(METADATA_MEMBER, json.dumps(metadata, indent=2).encode())

    write_file_atomically(path, write_zip)
    return path


def read_artifact(path: Path) -> Artifact:
    """Read and verify an artifact; anything missing, altered or unreadable is an ArtifactError.

    External weights are unpacked (streamed, and checked against their SHA-256 on the way) into a private directory
    that lives as long as the returned artifact's ``weights`` handle.
    """
    fix = "convert the model again and save a new artifact"
    if not path.is_file():
        raise ArtifactError(f"no artifact at {path}", fix="check the path")
    weights = None
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            for member in (METADATA_MEMBER, ONNX_MEMBER):
                if member not in names:
                    raise ArtifactError(f"{path} has no {member}; it is incomplete or not an artifact", fix=fix)
            metadata = json.loads(archive.read(METADATA_MEMBER))
            _check_format(path, metadata)
            digests: dict[str, str] = dict(metadata["sha256"])
            data = {name: archive.read(name) for name in digests if name != DATA_MEMBER}
            if DATA_MEMBER in digests:
                weights = WeightFiles()
                digest = _unpack(archive, DATA_MEMBER, weights.directory / DATA_MEMBER)
                if digest != digests[DATA_MEMBER]:
                    weights.cleanup()
                    raise ArtifactError(f"{path}: member {DATA_MEMBER} does not match its recorded SHA-256", fix=fix)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, json.JSONDecodeError, KeyError, OSError) as exc:
        if weights is not None:
            weights.cleanup()
        raise ArtifactError(f"{path} is corrupted or not an artifact: {exc}", fix=fix) from exc
    for name, blob in data.items():
        if hashlib.sha256(blob).hexdigest() != digests[name]:
            raise ArtifactError(f"{path}: member {name} does not match its recorded SHA-256 (corrupted)", fix=fix)
    try:
        model = onnx.load_model_from_string(data[ONNX_MEMBER])
    except Exception as exc:
        raise ArtifactError(f"{path}: the ONNX graph does not parse: {exc}", fix=fix) from exc
    if weights is not None:
        set_weights_dir(model, weights.directory)
    return Artifact(metadata, model, data.get(ENGINE_MEMBER), weights)


def _check_format(path: Path, metadata: dict[str, Any]) -> None:
    if metadata.get("format") != FORMAT:
        raise ArtifactError(
            f"{path} has format {metadata.get('format')!r}; this version reads {FORMAT!r}",
            fix="load it with the version that wrote it, or convert again",
        )


def _unpack(archive: zipfile.ZipFile, member: str, target: Path) -> str:
    """Copy one member to ``target`` in chunks; its SHA-256."""
    digest = hashlib.sha256()
    with archive.open(member) as source, open(target, "wb") as out:
        while chunk := source.read(64 << 20):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def settings_to_json(settings: Settings) -> dict[str, Any]:
    """Settings as JSON-ready data, without machine paths."""
    data = dataclasses.asdict(settings)
    data["tolerances"] = {k: dataclasses.asdict(v) for k, v in settings.tolerances.items()}
    for machine_path in (
        "cache_dir",
        "trt_timing_cache",
        "weights_dir",
    ):  # paths on the machine that converted: not carried along
        data.pop(machine_path, None)
    return data


def settings_from_json(data: dict[str, Any]) -> Settings:
    """Settings from :func:`settings_to_json` data (unknown names from other versions ignored)."""
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}  # JSON lists
    values["dynamic"] = tuple(DynamicDim(**d) for d in values.get("dynamic", ()))
    values["tolerances"] = {k: Tolerance(**v) for k, v in values.get("tolerances", {}).items()}
    values["ort_providers"] = tuple(values.get("ort_providers", ("CPUExecutionProvider",)))
    known = {f.name for f in dataclasses.fields(Settings)}
    return Settings(**{k: v for k, v in values.items() if k in known})
