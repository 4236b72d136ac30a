"""One artifact file per converted model: the final ONNX, the engine bytes when TensorRT built one, metadata.

The file is a zip archive (members stored, not compressed): ``metadata.json``, ``model.onnx``, optionally
``engine.plan`` (or, for a module of TensorRT segments, ``engine-segment-<i>.plan`` per TensorRT segment, with
the segment plan in the metadata), and ``model.onnx.data``: the graph's weights, written first, every tensor at a
multiple of 4096 bytes of the file (the member's local header is padded to that). An ONNX Runtime artifact may also
hold ``session.onnx``: the graph its session runs, rewritten at save time for ONNX Runtime's kernels, whose tensors
read the same ``model.onnx.data`` (:mod:`pipeline.runtime.ort.stored_graph`; optional: an artifact without it, or
whose fingerprint is not this machine's, is rewritten at load). ``manifest.json`` holds a SHA-256 of every other
member; the metadata holds versions, the I/O spec, the settings and the report; loading checks all
of it but the report, which is read (and checked) when the loaded module's ``report`` is first asked for. Writing
goes to a temporary file in the target directory and is renamed into place, so a crash never leaves a half-written
artifact under the requested name.
Reading it back, checked, is :mod:`pipeline.runtime.artifact_reading`.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import onnx

from converters.files import write_file_atomically
from passes.model_io.external_data import (
    ALIGNMENT,
    WeightFiles,
    write_compact,
)
from pipeline.runtime.graph_agreement import METADATA
from pipeline.runtime.io_spec import IOSpec
from pipeline.runtime.mapped_zip import aligned_member
from pipeline.settings import DynamicDim, Settings, Tolerance

if TYPE_CHECKING:  # the report's classes are the conversion's and a saver's, not a load's
    from pipeline.runtime.reports.conversion import ConversionReport

log = logging.getLogger(__name__)

FORMAT = "torch-trt-pipeline-artifact/3"  # /3: the weights always in model.onnx.data, aligned for mapping
INLINE_FORMAT = "torch-trt-pipeline-artifact/2"  # /2: a manifest covers every member; weights inline when small
READ_FORMATS = (FORMAT, INLINE_FORMAT)
ONNX_MEMBER = "model.onnx"
ENGINE_MEMBER = "engine.plan"
DATA_MEMBER = "model.onnx.data"  # the external weights of model.onnx, when it keeps them outside the graph
SESSION_MEMBER = "session.onnx"  # ONNX Runtime's session graph, made at save time (pipeline.runtime.ort.stored_graph)
SEGMENT_ENGINE_MEMBER = "engine-segment-{}.plan"  # the engine of TensorRT segment i (pipeline.backends.segments)
METADATA_MEMBER = METADATA  # "metadata.json", defined beside the checks against the graph, which name it
MANIFEST_MEMBER = "manifest.json"  # the SHA-256 of every other member
LINK_NAME = "artifact.ptrt"  # the loaded artifact's hard link in the module's private weights directory
#: Initializers of at least this many bytes go to model.onnx.data (onnx.save's own threshold for external data).
EXTERNAL_MIN_BYTES = 1024


class Pending(Protocol):
    """The checks of a read artifact still running (``artifact_reading.PendingChecks``)."""

    def check(self) -> None:
        """Wait for them; raise what they found."""


@dataclass(frozen=True)
class Artifact:
    """A read artifact: its metadata, the final graph, the engine bytes if any, and the private directory of the
    graph's weights. ``pending``: the checks still running (``read_artifact(wait=False)``: the weights' SHA-256, the
    library versions' warning), which :meth:`verified` waits for."""

    metadata: dict[str, Any]
    onnx_model: onnx.ModelProto
    engine: bytes | None
    weights: WeightFiles | None = None  # the weights' private directory (copy, link); keep it alive with the graph
    segment_engines: dict[int, bytes] = dataclasses.field(default_factory=dict)  # segment index -> its engine
    pending: Pending | None = None
    #: the same graph reading its weights in place from the artifact (a hard link to it in ``weights``), for an ONNX
    #: Runtime session made before ``pending`` is done (``onnx_model`` reads the copy being written); None for /2
    session_model: onnx.ModelProto | None = None
    #: the metadata's settings, parsed once by ``read_artifact`` (checking a Settings costs 10-30 ms)
    parsed_settings: Settings | None = dataclasses.field(default=None, repr=False)
    #: ``session.onnx`` reading its weights in place as ``session_model`` does, with the fingerprint it was made
    #: for (``metadata["session_graph"]["key"]``); None when the artifact has none (or is format /2)
    stored_session: tuple[str, onnx.ModelProto] | None = dataclasses.field(default=None, repr=False)
    #: the metadata's I/O spec, parsed once by ``read_artifact`` (it checks it against the graph)
    parsed_io: IOSpec | None = dataclasses.field(default=None, repr=False)

    def verified(self) -> Artifact:
        """The artifact, once the weights' SHA-256 matches the manifest (an ArtifactError if it does not), and with
        the warning of other library versions given."""
        if self.pending is not None:
            self.pending.check()
        return self

    def session_graph(self, settings: Settings) -> onnx.ModelProto | None:
        """The stored ONNX Runtime session graph, if the artifact has one made for ``settings`` (those it is loaded
        with) and this machine's ONNX Runtime and rewriting code; else None (the executor rewrites the graph)."""
        if self.stored_session is None:
            return None
        from pipeline.runtime.ort.stored_graph import session_graph_key

        key, graph = self.stored_session
        if key != session_graph_key(settings):
            log.info("the stored session graph was made elsewhere (other versions or settings): rewriting at load")
            return None
        return graph

    @property
    def io(self) -> IOSpec:
        """The I/O spec saved with the artifact."""
        if self.parsed_io is not None:
            return self.parsed_io
        return IOSpec.from_json(self.metadata["io"])

    @property
    def settings(self) -> Settings:
        """The settings saved with the artifact."""
        if self.parsed_settings is not None:
            return self.parsed_settings
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
    segments: list[dict[str, Any]] | None = None,
    segment_engines: dict[int, bytes] | None = None,
    refit_at_load: bool = False,
    extra_metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write a converted model (what ``ConvertedModule.save`` hands over) as one artifact; external weights are
    streamed into a ``model.onnx.data`` member. :func:`pipeline.load` reads it back. ``segments`` is the plan of a
    module of TensorRT segments and ``segment_engines`` their engines by segment index. ``refit_at_load``: the
    engine holds older weights than the graph (refit where it could not run), so loading refits it from the graph.
    ``extra_metadata``: JSON-ready entries of the caller's (``on_first_call``'s fingerprint of the weights it
    converted), read back by :func:`read_metadata`; they cannot replace the metadata's own entries."""
    own = {*REQUIRED_METADATA, "created", "plugins", "segments", "engine", "session_graph"}
    taken = sorted(set(extra_metadata or {}) & own)
    if taken:
        raise ValueError(f"extra_metadata cannot replace the metadata's own {', '.join(taken)}")
    from converters.plugins.spec import plugin_records
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
    metadata.update(extra_metadata or {})
    plugins = plugin_records(onnx_model)
    if plugins:  # the torch op (and its module) behind each plugin node: pipeline.load re-registers them
        metadata["plugins"] = plugins
    engines = {SEGMENT_ENGINE_MEMBER.format(i): e for i, e in (segment_engines or {}).items()}
    if segments is not None:
        metadata["segments"] = segments
    if engine is not None or engines:
        from pipeline.runtime.tensorrt.identity import build_options, device_identity
        from pipeline.runtime.tensorrt.library import library_for

        # what the engine was built for and with: the same record the engine cache keys on
        identity = device_identity(library_for(backend), settings)
        weights = engine_weights(settings, refit_at_load)
        metadata["engine"] = {**identity, "build": build_options(io, settings), **weights}

    def write_zip(handle: BinaryIO) -> None:
        with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_STORED) as archive:
            digests: dict[str, str] = {}
            # first, its data at an aligned offset; the graph then points at the member, not at this machine's files
            with archive.open(aligned_member(DATA_MEMBER, handle.tell(), ALIGNMENT), "w", force_zip64=True) as out:
                graph, digests[DATA_MEMBER] = write_compact(
                    onnx_model, out, DATA_MEMBER, inline_min_bytes=EXTERNAL_MIN_BYTES
                )
            members = {ONNX_MEMBER: graph.SerializeToString()}
            if backend == "onnxruntime":
                members.update(_session_member(graph, settings, metadata))
            members[METADATA_MEMBER] = json.dumps(metadata, indent=2).encode()
            if engine is not None:
                members[ENGINE_MEMBER] = engine
            members.update(engines)
            for name, data in members.items():
                archive.writestr(name, data)
                digests[name] = hashlib.sha256(data).hexdigest()
            manifest = {"format": FORMAT, "sha256": digests}  # every member, the metadata included
            archive.writestr(MANIFEST_MEMBER, json.dumps(manifest, indent=2).encode())

    write_file_atomically(path, write_zip)
    return path


def _session_member(graph: onnx.ModelProto, settings: Settings, metadata: dict[str, Any]) -> dict[str, bytes]:
    """``session.onnx`` for ``graph`` (the artifact's graph, its weights in ``model.onnx.data``), made with the
    settings as the artifact gives them back, its fingerprint put in ``metadata``; nothing when the session runs
    ``graph`` as it is or must rewrite it at load (:func:`pipeline.runtime.ort.stored_graph.storable_session_graph`)."""
    from pipeline.runtime.ort.stored_graph import session_graph_key, storable_session_graph

    loaded = settings_from_json(settings_to_json(settings))  # what a load sees (paths of this machine dropped)
    key = session_graph_key(loaded)
    session = storable_session_graph(graph, loaded) if key is not None else None
    if key is None or session is None:
        return {}
    metadata["session_graph"] = {"member": SESSION_MEMBER, "key": key}
    return {SESSION_MEMBER: session.SerializeToString()}


def engine_weights(settings: Settings, refit_at_load: bool = False) -> dict[str, Any]:
    """Where the saved engine's weights are: ``"graph"`` for a weight-stripped plan (refit from ``model.onnx`` at
    load, the artifact keeps them once), else ``"plan"``; ``refit_at_load`` when the plan's are older than the
    graph's."""
    record: dict[str, Any] = {"weights": "graph" if settings.strip_weights else "plan"}
    if refit_at_load and not settings.strip_weights:
        record["refit_at_load"] = True
    return record


def runtime_cache_beside(artifact: Path) -> Path:
    """TensorRT-RTX's runtime cache of an artifact's engine: a file beside the artifact (``model.ptrt`` ->
    ``model.ptrt.rtx-runtime-cache``), written by ``module.save`` when the module has one and filled by the loaded
    module's runs, so the next process that loads the artifact skips the JIT compilation."""
    return artifact.with_name(artifact.name + ".rtx-runtime-cache")


REWRITE_FIX = "convert the model again and save a new artifact"
#: What the metadata must hold, and the JSON type of each entry.
REQUIRED_METADATA = {"format": str, "backend": str, "versions": dict, "io": dict, "settings": dict, "report": dict}


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
    if values.get("precision") == "nvfp4":
        values.pop("block_size", None)  # written as 128 (the unused default) before NVFP4's fixed 16 was recorded
    known = {f.name for f in dataclasses.fields(Settings)}
    return Settings(**{k: v for k, v in values.items() if k in known})
