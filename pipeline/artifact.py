"""One artifact file per converted model: the final ONNX, the engine bytes when TensorRT built one, metadata.

The file is a zip archive (members stored, not compressed): ``metadata.json``, ``model.onnx`` and optionally
``engine.plan``. The metadata holds versions, the I/O spec, the settings, the report and a SHA-256 of every
other member; loading checks all of it. Writing goes to a temporary file in the target directory and is renamed
into place, so a crash never leaves a half-written artifact under the requested name.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import onnx

from converters.errors import ArtifactError
from converters.plugins import plugin_records
from converters.settings import DynamicDim, Settings, Tolerance
from pipeline.io_spec import IOSpec

if TYPE_CHECKING:
    from pipeline.runtime import ConvertedModule

FORMAT = "torch-trt-pipeline-artifact/1"
ONNX_MEMBER = "model.onnx"
ENGINE_MEMBER = "engine.plan"
METADATA_MEMBER = "metadata.json"


@dataclass(frozen=True)
class Artifact:
    metadata: dict[str, Any]
    onnx_model: onnx.ModelProto
    engine: bytes | None

    @property
    def io(self) -> IOSpec:
        return IOSpec.from_json(self.metadata["io"])

    @property
    def settings(self) -> Settings:
        return settings_from_json(self.metadata["settings"])


def save_artifact(module: ConvertedModule, path: Path) -> Path:
    from pipeline.versions import library_versions

    members = {ONNX_MEMBER: module.onnx.SerializeToString()}
    engine = module.engine_bytes
    metadata: dict[str, Any] = {
        "format": FORMAT,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "backend": module.backend,
        "versions": library_versions(),
        "io": module.io.to_json(),
        "settings": settings_to_json(module.settings),
        "report": module.report.to_dict(),
    }
    plugins = plugin_records(module.onnx)
    if plugins:  # the torch op (and its module) behind each plugin node: pipeline.load re-registers them
        metadata["plugins"] = plugins
    if engine is not None:
        from pipeline.backends.tensorrt import device_identity

        members[ENGINE_MEMBER] = engine
        metadata["engine"] = device_identity()
    metadata["sha256"] = {name: hashlib.sha256(data).hexdigest() for name, data in members.items()}
    members[METADATA_MEMBER] = json.dumps(metadata, indent=2).encode()
    _write_atomically(path, members)
    return path


def read_artifact(path: Path) -> Artifact:
    """Read and verify an artifact; anything missing, altered or unreadable is an ArtifactError."""
    fix = "convert the model again and save a new artifact"
    if not path.is_file():
        raise ArtifactError(f"no artifact at {path}", fix="check the path")
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            for member in (METADATA_MEMBER, ONNX_MEMBER):
                if member not in names:
                    raise ArtifactError(f"{path} has no {member}; it is incomplete or not an artifact", fix=fix)
            metadata = json.loads(archive.read(METADATA_MEMBER))
            data = {name: archive.read(name) for name in metadata.get("sha256", {})}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, json.JSONDecodeError, KeyError, OSError) as exc:
        raise ArtifactError(f"{path} is corrupted or not an artifact: {exc}", fix=fix) from exc
    if metadata.get("format") != FORMAT:
        raise ArtifactError(
            f"{path} has format {metadata.get('format')!r}; this version reads {FORMAT!r}",
            fix="load it with the version that wrote it, or convert again",
        )
    for name, digest in metadata["sha256"].items():
        if hashlib.sha256(data[name]).hexdigest() != digest:
            raise ArtifactError(f"{path}: member {name} does not match its recorded SHA-256 (corrupted)", fix=fix)
    try:
        model = onnx.load_model_from_string(data[ONNX_MEMBER])
    except Exception as exc:
        raise ArtifactError(f"{path}: the ONNX graph does not parse: {exc}", fix=fix) from exc
    return Artifact(metadata, model, data.get(ENGINE_MEMBER))


def settings_to_json(settings: Settings) -> dict[str, Any]:
    data = dataclasses.asdict(settings)
    data["tolerances"] = {k: dataclasses.asdict(v) for k, v in settings.tolerances.items()}
    for machine_path in ("cache_dir", "trt_timing_cache"):  # paths on the machine that converted: not carried along
        data.pop(machine_path, None)
    return data


def settings_from_json(data: dict[str, Any]) -> Settings:
    values = dict(data)
    values["dynamic"] = tuple(DynamicDim(**d) for d in values.get("dynamic", ()))
    values["tolerances"] = {k: Tolerance(**v) for k, v in values.get("tolerances", {}).items()}
    values["ort_providers"] = tuple(values.get("ort_providers", ("CPUExecutionProvider",)))
    known = {f.name for f in dataclasses.fields(Settings)}
    return Settings(**{k: v for k, v in values.items() if k in known})


def _write_atomically(path: Path, members: dict[str, bytes]) -> None:
    def write_zip(handle: BinaryIO) -> None:
        with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_STORED) as archive:
            for name, data in members.items():
                archive.writestr(name, data)

    write_file_atomically(path, write_zip)


def write_file_atomically(path: Path, write: Callable[[BinaryIO], None] | bytes) -> Path:
    """Write to a temporary file beside ``path``, fsync, then rename: readers see the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp_name, 0o666 & ~_umask())  # mkstemp makes 0600; the result should look like any new file
        with os.fdopen(fd, "wb") as handle:
            if isinstance(write, bytes):
                handle.write(write)
            else:
                write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
