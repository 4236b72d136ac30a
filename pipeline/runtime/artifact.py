"""One artifact file per converted model: the final ONNX, the engine bytes when TensorRT built one, metadata.

The file is a zip archive (members stored, not compressed): ``metadata.json``, ``model.onnx``, optionally
``engine.plan`` (or, for a module of TensorRT segments, ``engine-segment-<i>.plan`` per TensorRT segment, with
the segment plan in the metadata), and ``model.onnx.data``: the graph's weights, written first, every tensor at a
multiple of 4096 bytes of the file (the member's local header is padded to that). ``manifest.json`` holds a SHA-256
of every other member; the metadata holds versions, the I/O spec, the settings and the report; loading checks all
of it. Writing goes to a temporary file in the target directory and is renamed into place, so a crash never leaves a
half-written artifact under the requested name.

Loading maps the file instead of reading it: the graph proto is a few hundred KB, ONNX Runtime maps the weights in
place from a hard link to the artifact in a private directory (the very file that was mapped and checked, whatever
later happens at its path), and meanwhile a thread computes the SHA-256 of the weights member and copies it into that
directory, for the module's graph (``module.onnx``: a plain file, which onnx's own reader accepts; a hard-linked one
it refuses). :meth:`Artifact.verified` waits for the thread; ``pipeline.load`` does before it returns. Format ``/2``
(weights inline in ``model.onnx`` unless external) is still read, by copying its members as before.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
import threading
import warnings
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Generic, TypeVar

import onnx
from onnx.external_data_helper import ExternalDataInfo

from converters.errors import ArtifactError, InputError
from converters.files import write_file_atomically
from passes.model_io.external_data import (
    ALIGNMENT,
    WeightFiles,
    external_tensors,
    set_weights_dir,
    write_compact,
)
from pipeline.runtime.graph_agreement import METADATA, io_disagreement, settings_disagreement
from pipeline.runtime.io_spec import IOSpec
from pipeline.runtime.mapped_zip import DigestThread, MappedZip, aligned_member
from pipeline.runtime.reports.conversion import ConversionReport
from pipeline.settings import DynamicDim, Settings, Tolerance

FORMAT = "torch-trt-pipeline-artifact/3"  # /3: the weights always in model.onnx.data, aligned for mapping
INLINE_FORMAT = "torch-trt-pipeline-artifact/2"  # /2: a manifest covers every member; weights inline when small
READ_FORMATS = (FORMAT, INLINE_FORMAT)
ONNX_MEMBER = "model.onnx"
ENGINE_MEMBER = "engine.plan"
DATA_MEMBER = "model.onnx.data"  # the external weights of model.onnx, when it keeps them outside the graph
SEGMENT_ENGINE_MEMBER = "engine-segment-{}.plan"  # the engine of TensorRT segment i (pipeline.backends.segments)
METADATA_MEMBER = METADATA  # "metadata.json", defined beside the checks against the graph, which name it
MANIFEST_MEMBER = "manifest.json"  # the SHA-256 of every other member
LINK_NAME = "artifact.ptrt"  # the loaded artifact's hard link in the module's private weights directory
#: Initializers of at least this many bytes go to model.onnx.data (onnx.save's own threshold for external data).
EXTERNAL_MIN_BYTES = 1024


log = logging.getLogger(__name__)
T = TypeVar("T")


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
    pending: _PendingChecks | None = None
    #: the same graph reading its weights in place from the artifact (a hard link to it in ``weights``), for an ONNX
    #: Runtime session made before ``pending`` is done (``onnx_model`` reads the copy being written); None for /2
    session_model: onnx.ModelProto | None = None
    #: the metadata's settings, parsed once by ``read_artifact`` (checking a Settings costs 10-30 ms)
    parsed_settings: Settings | None = dataclasses.field(default=None, repr=False)

    def verified(self) -> Artifact:
        """The artifact, once the weights' SHA-256 matches the manifest (an ArtifactError if it does not), and with
        the warning of other library versions given."""
        if self.pending is not None:
            self.pending.check()
        return self

    @property
    def io(self) -> IOSpec:
        """The I/O spec saved with the artifact."""
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
    taken = sorted(set(extra_metadata or {}) & {*REQUIRED_METADATA, "created", "plugins", "segments", "engine"})
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
            members = {ONNX_MEMBER: graph.SerializeToString(), METADATA_MEMBER: json.dumps(metadata, indent=2).encode()}
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


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata of the artifact at ``path``, checked against its manifest (the other members are not read:
    ``pipeline.load`` checks them), for a look at what an artifact holds without loading it."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = _manifest_digests(path, archive, set(archive.namelist()))
            blob = archive.read(METADATA_MEMBER)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        raise ArtifactError(f"{path} is corrupted or not an artifact: {exc}", fix=REWRITE_FIX) from exc
    if hashlib.sha256(blob).hexdigest() != manifest["sha256"][METADATA_MEMBER]:
        raise _digest_error(path, METADATA_MEMBER)
    return _metadata(path, blob)


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


def read_artifact(path: str | Path, *, wait: bool = True) -> Artifact:
    """Read and verify an artifact; anything missing, altered or unreadable is an ArtifactError.

    The manifest must cover exactly the members present, each must match its SHA-256 (the metadata too), the
    metadata must be complete, and its I/O spec must agree with the graph. An artifact written with other library
    versions loads with a warning (the engine, if any, is checked against this machine by ``pipeline.load``).
    The weights member is copied (and checked) in a thread into a private directory that lives as long as the
    returned artifact's ``weights`` handle, beside a hard link to the artifact that ``session_model`` reads in place.
    With ``wait=False`` the thread may still run: call ``.verified()`` before trusting ``onnx_model``'s weights.
    """
    if not isinstance(path, str | Path):
        raise ArtifactError(
            f"cannot load an artifact from a {type(path).__name__}", fix="pass the path of a .ptrt file (str or Path)"
        )
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"no artifact at {path}", fix="check the path")
    here = _InThread(_library_versions)  # 0.05-0.15 s of package metadata, while the rest goes on
    weights = WeightFiles()
    try:
        members = _read_members(path, weights)
    except ArtifactError:
        weights.cleanup()
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        weights.cleanup()
        raise ArtifactError(f"{path} is corrupted or not an artifact: {exc}", fix=REWRITE_FIX) from exc
    data = members.data
    metadata = _metadata(path, data[METADATA_MEMBER])
    try:
        model = onnx.load_model_from_string(data[ONNX_MEMBER])
    except Exception as exc:
        raise ArtifactError(f"{path}: the ONNX graph does not parse: {exc}", fix=REWRITE_FIX) from exc
    _check_io_against_graph(path, metadata, model)
    settings = _check_settings(path, metadata, model)
    session_model = None
    if members.digest is not None:  # format /3: the weights member is being copied into the private directory
        _check_weights_inside(path, model, members.data_size)
        if members.data_offset is not None:  # and linked: a session can read them where they are stored
            session_model = _pointing_into_artifact(model, members.data_offset)
            set_weights_dir(session_model, weights.directory)
    if any(True for _ in external_tensors(model)):
        set_weights_dir(model, weights.directory)
    kept: WeightFiles | None = weights
    if members.digest is None and not (weights.directory / DATA_MEMBER).is_file():
        weights.cleanup()
        kept = None
    segment_engines = {
        int(name.removeprefix("engine-segment-").removesuffix(".plan")): blob
        for name, blob in data.items()
        if name.startswith("engine-segment-") and name.removeprefix("engine-segment-").removesuffix(".plan").isdigit()
    }
    pending = _PendingChecks(path, metadata, here, members.digest)
    artifact = Artifact(
        metadata, model, data.get(ENGINE_MEMBER), kept, segment_engines, pending, session_model, settings
    )
    return artifact.verified() if wait else artifact


REWRITE_FIX = "convert the model again and save a new artifact"
#: What the metadata must hold, and the JSON type of each entry.
REQUIRED_METADATA = {"format": str, "backend": str, "versions": dict, "io": dict, "settings": dict, "report": dict}


@dataclass
class _Members:
    """The members read (all but the weights), and for format /3 where the weights are and their digest to come."""

    data: dict[str, bytes]
    digest: DigestThread | None = None
    data_offset: int | None = None  # where model.onnx.data starts in the file, when the graph reads it through a link
    data_size: int = 0


class _PendingChecks:
    """What is checked while the session is made: the weights member's SHA-256 (computed in a thread) against the
    manifest's, and the library versions (looked up in a thread) against the metadata's."""

    def __init__(
        self, path: Path, metadata: dict[str, Any], here: _InThread[dict[str, str]], digest: DigestThread | None
    ) -> None:
        self.path, self._metadata, self._here, self._digest = path, metadata, here, digest
        self._failure: ArtifactError | None = None
        self._done = False

    def check(self) -> None:
        """Wait for both; an ArtifactError (each time asked) when the digest differs, the version warning once."""
        if not self._done:
            self._done = True
            if self._digest is not None:
                self._failure = _weights_failure(self.path, self._digest)
            if self._failure is None:
                _warn_on_versions(self.path, self._metadata, self._here.result())
        if self._failure is not None:
            raise self._failure


def _weights_failure(path: Path, digest: DigestThread) -> ArtifactError | None:
    try:
        got = digest.result()
    except OSError as exc:  # a read error of the mapped file (an I/O error)
        return ArtifactError(f"{path} could not be read: {exc}", fix=REWRITE_FIX)
    return None if got == digest.expected else _digest_error(path, DATA_MEMBER)


class _InThread(Generic[T]):
    """``function()`` run in a daemon thread; :meth:`result` waits for it (and raises what it raised)."""

    def __init__(self, function: Callable[[], T]) -> None:
        self._function = function
        self._result: list[T] = []
        self._error: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="artifact-check", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result.append(self._function())
        except BaseException as exc:  # noqa: BLE001 - raised by result(), in the thread that asks
            self._error.append(exc)

    def result(self) -> T:
        """The function's result, once it has run."""
        self._thread.join()
        if self._error:
            raise self._error[0]
        return self._result[0]


def _library_versions() -> dict[str, str]:
    from pipeline.versions import library_versions

    return library_versions()


def _digest_error(path: Path, name: str) -> ArtifactError:
    return ArtifactError(
        f"{path}: member {name} does not match its SHA-256 in the manifest (corrupted or edited)", fix=REWRITE_FIX
    )


def _read_members(path: Path, weights: WeightFiles) -> _Members:
    """The members of a format /3 artifact read from its mapping (the manifest too: one file, even if another is
    renamed over the path meanwhile), or of a /2 one copied (``_verified_members``)."""
    mapped = MappedZip(path)
    try:
        names = set(mapped.names())
        manifest = _manifest_digests(path, mapped.archive, names)
        if manifest["format"] == FORMAT:
            return _mapped_members(path, weights, mapped, names, manifest["sha256"])  # it closes the mapping
    except BaseException:
        mapped.close()
        raise
    mapped.close()
    return _Members(_verified_members(path, archive_names=names, digests=manifest["sha256"], weights=weights))


def _manifest_digests(path: Path, archive: zipfile.ZipFile, names: set[str]) -> dict[str, Any]:
    """The manifest, checked: a format this version reads, a digest for exactly the members present."""
    if MANIFEST_MEMBER not in names:
        raise ArtifactError(
            f"{path} has no {MANIFEST_MEMBER}: it is not an artifact of this format ({FORMAT})",
            fix="load it with the version that wrote it, or convert the model again",
        )
    manifest = json.loads(archive.read(MANIFEST_MEMBER))
    digests = manifest.get("sha256") if isinstance(manifest, dict) else None
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise ArtifactError(f"{path}: {MANIFEST_MEMBER} is malformed", fix=REWRITE_FIX)
    if manifest.get("format") not in READ_FORMATS:
        raise ArtifactError(
            f"{path} has format {manifest.get('format')!r}; this version reads {' and '.join(map(repr, READ_FORMATS))}",
            fix="load it with the version that wrote it, or convert again",
        )
    present = names - {MANIFEST_MEMBER}
    for name in sorted(present - set(digests)):
        raise ArtifactError(f"{path}: member {name} is not covered by the manifest (added later?)", fix=REWRITE_FIX)
    for name in sorted(set(digests) - present):
        raise ArtifactError(f"{path}: the manifest lists {name}, which the artifact lacks", fix=REWRITE_FIX)
    for member in (METADATA_MEMBER, ONNX_MEMBER):
        if member not in digests:
            raise ArtifactError(f"{path} has no {member}; it is incomplete or not an artifact", fix=REWRITE_FIX)
    if manifest["format"] == FORMAT and DATA_MEMBER not in digests:
        raise ArtifactError(f"{path} has no {DATA_MEMBER}; it is incomplete or not an artifact", fix=REWRITE_FIX)
    return manifest


def _mapped_members(
    path: Path, weights: WeightFiles, mapped: MappedZip, names: set[str], digests: dict[str, str]
) -> _Members:
    """Format /3: the small members copied out of the mapping and checked; the weights linked (or copied, where no
    link can be made) into ``weights`` and hashed in a thread, which closes ``mapped`` when done."""
    try:
        data = {name: bytes(mapped.view(name)) for name in names - {MANIFEST_MEMBER, DATA_MEMBER}}
        for name, blob in data.items():
            if hashlib.sha256(blob).hexdigest() != digests[name]:
                raise _digest_error(path, name)
        offset = mapped.data_offset(DATA_MEMBER)
        weights_view = mapped.view(DATA_MEMBER)
        linked = _link(path, mapped, weights.directory / LINK_NAME)
    except BaseException:
        mapped.close()
        raise
    size = len(weights_view)
    copy = weights.directory / DATA_MEMBER  # the module's own copy, made while the session maps the artifact
    digest = DigestThread(weights_view, digests[DATA_MEMBER], done=mapped, copy_to=copy)
    return _Members(data, digest, offset if linked else None, size)


def _link(path: Path, mapped: MappedZip, link: Path) -> bool:
    """Hard-link the artifact at ``link`` (the very file mapped: an ArtifactError if the path now names another);
    False, logged, where the file system refuses (another file system than the temporary directory's, a file of
    another user under protected hard links): the session then waits for the copy of the weights (slower)."""
    try:
        os.link(path, link)
    except OSError as exc:
        log.info(
            "%s: cannot hard-link it into %s (%s); the session waits for the copy of its weights",
            path,
            link.parent,
            exc,
        )
        return False
    linked = os.stat(link)
    if (linked.st_dev, linked.st_ino) != (mapped.stat.st_dev, mapped.stat.st_ino):
        raise ArtifactError(f"{path} was replaced while it was being read", fix="load it again")
    return True


def _check_weights_inside(path: Path, model: onnx.ModelProto, size: int) -> None:
    """Every external tensor must lie inside the weights member (``size`` bytes)."""
    for tensor in external_tensors(model):
        info = ExternalDataInfo(tensor)
        offset, length = info.offset or 0, info.length
        if info.location != DATA_MEMBER or length is None or offset < 0 or length < 0 or offset + length > size:
            raise ArtifactError(
                f"{path}: tensor {tensor.name!r} points outside {DATA_MEMBER} (location {info.location!r}, offset "
                f"{offset}, length {length}; the member holds {size} bytes)",
                fix=REWRITE_FIX,
            )


def _pointing_into_artifact(model: onnx.ModelProto, start: int) -> onnx.ModelProto:
    """A copy of ``model`` whose external tensors read the linked artifact at their bytes' offset in the file."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in external_tensors(copy):
        offset = ExternalDataInfo(tensor).offset or 0
        kept = [e for e in tensor.external_data if e.key not in ("location", "offset")]
        del tensor.external_data[:]
        tensor.external_data.add(key="location", value=LINK_NAME)
        tensor.external_data.add(key="offset", value=str(start + offset))
        tensor.external_data.extend(kept)
    return copy


def _verified_members(
    path: Path, *, archive_names: set[str], digests: dict[str, str], weights: WeightFiles
) -> dict[str, bytes]:
    """Format /2: every member but the weights (unpacked into ``weights``), each checked against the manifest."""
    present = archive_names - {MANIFEST_MEMBER}
    with zipfile.ZipFile(path) as archive:
        if set(archive.namelist()) != archive_names:
            raise ArtifactError(f"{path} changed while it was being read", fix="load it again")
        data = {name: archive.read(name) for name in present if name != DATA_MEMBER}
        got = {name: hashlib.sha256(blob).hexdigest() for name, blob in data.items()}
        if DATA_MEMBER in present:
            got[DATA_MEMBER] = _unpack(archive, DATA_MEMBER, weights.directory / DATA_MEMBER)
    for name in sorted(present):
        if got[name] != digests[name]:
            raise _digest_error(path, name)
    return data


def _metadata(path: Path, blob: bytes) -> dict[str, Any]:
    try:
        metadata = json.loads(blob)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: {METADATA_MEMBER} is not JSON: {exc}", fix=REWRITE_FIX) from exc
    if not isinstance(metadata, dict):
        raise ArtifactError(f"{path}: {METADATA_MEMBER} is not a JSON object", fix=REWRITE_FIX)
    for key, kind in REQUIRED_METADATA.items():
        if not isinstance(metadata.get(key), kind):
            raise ArtifactError(
                f"{path}: {METADATA_MEMBER} lacks {key!r} (or it is not a {kind.__name__})", fix=REWRITE_FIX
            )
    return metadata


def _check_io_against_graph(path: Path, metadata: dict[str, Any], model: onnx.ModelProto) -> None:
    """The I/O spec the module calls with must be the graph's (:func:`io_disagreement`)."""
    try:
        io = IOSpec.from_json(metadata["io"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{path}: the I/O spec in {METADATA_MEMBER} is malformed: {exc}", fix=REWRITE_FIX) from exc
    reason = io_disagreement(io, model)
    if reason is not None:
        raise ArtifactError(f"{path}: {reason}", fix=REWRITE_FIX)


def _check_settings(path: Path, metadata: dict[str, Any], model: onnx.ModelProto) -> Settings:
    """The saved settings, which must be valid and describe the graph (:func:`settings_disagreement`): they are the
    artifact's (a broken artifact, not the caller's input), so every error here is an ArtifactError."""
    try:
        settings = settings_from_json(metadata["settings"])
    except (InputError, TypeError, ValueError) as exc:
        cause = exc.message if isinstance(exc, InputError) else str(exc)
        raise ArtifactError(
            f"{path}: the settings in {METADATA_MEMBER} are not valid: {cause}", fix=REWRITE_FIX
        ) from exc
    reason = settings_disagreement(settings, model)
    if reason is not None:
        raise ArtifactError(f"{path}: {reason}", fix=REWRITE_FIX)
    return settings


def _warn_on_versions(path: Path, metadata: dict[str, Any], here: dict[str, str]) -> None:
    """Other library versions than the ones that wrote the artifact: a warning (the graph is ONNX, it still runs;
    accuracy was validated with the writer's versions)."""
    differ = [
        f"{name} {saved} (here {here[name]})"
        for name, saved in sorted(metadata["versions"].items())
        if name in here and here[name] != saved and name != "tensorrt"  # the engine check covers TensorRT
    ]
    if differ:
        warnings.warn(
            f"{path} was written with {', '.join(differ)}; it loads, but its validation was with those versions: "
            "run pipeline.compare(model, inputs, module=module) to check it here, or convert again",
            ArtifactVersionWarning,
            stacklevel=5,  # pipeline.load's caller: _PendingChecks.check, Artifact.verified, the loader, pipeline.load
        )


class ArtifactVersionWarning(UserWarning):
    """An artifact written with other library versions than this machine's."""


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
    if values.get("precision") == "nvfp4":
        values.pop("block_size", None)  # written as 128 (the unused default) before NVFP4's fixed 16 was recorded
    known = {f.name for f in dataclasses.fields(Settings)}
    return Settings(**{k: v for k, v in values.items() if k in known})
