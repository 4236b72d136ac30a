"""Reading an artifact (:mod:`pipeline.runtime.artifact`, its format) back, every member checked against the
manifest and the metadata against the graph.

Loading maps the file instead of reading it: the graph proto is a few hundred KB, ONNX Runtime maps the weights in
place from a hard link to the artifact in a private directory (the very file that was mapped and checked, whatever
later happens at its path), and meanwhile a thread computes the SHA-256 of the weights member. The module's graph
(``module.onnx``) reads a plain copy of that member in the same directory (onnx's own reader refuses a hard-linked
file), written, and checked again, only when something first asks for that graph's weights
(:meth:`~passes.model_io.external_data.WeightFiles.defer`): a deployment that loads and runs never does.
:meth:`Artifact.verified` waits for the thread; ``pipeline.load`` does before it returns. Format ``/2`` (weights
inline in ``model.onnx`` unless external) is still read, by copying its members as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import onnx
from onnx.external_data_helper import ExternalDataInfo

from converters.errors import ArtifactError, InputError
from passes.model_io.external_data import (
    WeightFiles,
    external_tensors,
    set_weights_dir,
)
from pipeline.runtime.artifact import (
    DATA_MEMBER,
    ENGINE_MEMBER,
    FORMAT,
    LINK_NAME,
    MANIFEST_MEMBER,
    METADATA_MEMBER,
    ONNX_MEMBER,
    READ_FORMATS,
    REQUIRED_METADATA,
    REWRITE_FIX,
    SESSION_MEMBER,
    Artifact,
    settings_from_json,
)
from pipeline.runtime.graph_agreement import io_disagreement, settings_disagreement
from pipeline.runtime.io_spec import IOSpec
from pipeline.runtime.mapped_zip import DigestThread, MappedZip, MemberCopy
from pipeline.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


def read_artifact(path: str | Path, *, wait: bool = True) -> Artifact:
    """Read and verify an artifact; anything missing, altered or unreadable is an ArtifactError.

    The manifest must cover exactly the members present, each must match its SHA-256 (the metadata too), the
    metadata must be complete, and its I/O spec must agree with the graph. An artifact written with other library
    versions loads with a warning (the engine, if any, is checked against this machine by ``pipeline.load``).
    The weights member is checked in a thread; ``session_model`` reads it in place through a hard link to the
    artifact in a private directory that lives as long as the returned artifact's ``weights`` handle, and
    ``onnx_model`` reads a copy in that directory, written when first asked for (or now, where no link can be made).
    With ``wait=False`` the thread may still run: call ``.verified()`` before trusting the weights.
    """
    return open_artifact(path).read(wait=wait)


def open_artifact(path: str | Path) -> OpenedArtifact:
    """The first half of :func:`read_artifact`: the members read and checked against the manifest, the metadata and
    its settings parsed, and the stored session graph, if any, checked and pointing into the artifact: what an ONNX
    Runtime session needs, which ``pipeline.load`` starts making before :meth:`OpenedArtifact.read` does the rest
    (the module's graph parsed and checked against the metadata)."""
    if not isinstance(path, str | Path):
        raise ArtifactError(
            f"cannot load an artifact from a {type(path).__name__}", fix="pass the path of a .ptrt file (str or Path)"
        )
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"no artifact at {path}", fix="check the path")
    weights = WeightFiles()
    try:
        members = _read_members(path, weights)
    except ArtifactError:
        weights.cleanup()
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        weights.cleanup()
        raise ArtifactError(f"{path} is corrupted or not an artifact: {exc}", fix=REWRITE_FIX) from exc
    metadata = _metadata(path, members.data[METADATA_MEMBER])
    settings = _saved_settings(path, metadata)
    stored_session = None
    if members.digest is not None and members.data_offset is not None:  # format /3, linked: read in place
        stored_session = _stored_session(path, metadata, members.data, members, weights)
    return OpenedArtifact(path, weights, members, metadata, settings, stored_session)


@dataclass
class OpenedArtifact:
    """An artifact read up to its graph (:func:`open_artifact`); :meth:`read` reads the rest."""

    path: Path
    weights: WeightFiles
    members: _Members
    metadata: dict[str, Any]
    settings: Settings  # the metadata's, valid (read checks that they describe the graph)
    #: the stored session graph reading the artifact in place, with its fingerprint (``Artifact.stored_session``)
    stored_session: tuple[str, onnx.ModelProto] | None

    def read(self, *, wait: bool = True) -> Artifact:
        """The artifact: the graph parsed and checked against the metadata (see :func:`read_artifact`)."""
        path, weights, members, metadata = self.path, self.weights, self.members, self.metadata
        here = InThread(_library_versions)  # 0.05-0.15 s of package metadata, while the rest goes on
        data = members.data
        try:
            model = onnx.load_model_from_string(data[ONNX_MEMBER])
        except Exception as exc:
            raise ArtifactError(f"{path}: the ONNX graph does not parse: {exc}", fix=REWRITE_FIX) from exc
        io = _check_io_against_graph(path, metadata, model)
        reason = settings_disagreement(self.settings, model)
        if reason is not None:
            raise ArtifactError(f"{path}: {reason}", fix=REWRITE_FIX)
        session_model = None
        if members.digest is not None:  # format /3: the weights member is being hashed
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
            if name.startswith("engine-segment-")
            and name.removeprefix("engine-segment-").removesuffix(".plan").isdigit()
        }
        pending = PendingChecks(path, metadata, here, members.digest)
        artifact = Artifact(
            metadata,
            model,
            data.get(ENGINE_MEMBER),
            kept,
            segment_engines,
            pending,
            session_model,
            self.settings,
            self.stored_session,
            io,
        )
        return artifact.verified() if wait else artifact


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


@dataclass
class _Members:
    """The members read (all but the weights), and for format /3 where the weights are and their digest to come."""

    data: dict[str, bytes]
    digest: DigestThread | None = None
    data_offset: int | None = None  # where model.onnx.data starts in the file, when the graph reads it through a link
    data_size: int = 0


class PendingChecks:
    """What is checked while the session is made: the weights member's SHA-256 (computed in a thread) against the
    manifest's, and the library versions (looked up in a thread) against the metadata's."""

    def __init__(
        self, path: Path, metadata: dict[str, Any], here: InThread[dict[str, str]], digest: DigestThread | None
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


class InThread(Generic[T]):
    """``function()`` run in a daemon thread; :meth:`result` waits for it (and raises what it raised)."""

    def __init__(self, function: Callable[[], T], name: str = "artifact-check") -> None:
        self._function = function
        self._result: list[T] = []
        self._error: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Wait for the function to return or raise (what it raised is dropped)."""
        self._thread.join()

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
    if not linked:  # the session reads the module's own copy of the weights: made now, while they are hashed
        digest = DigestThread(weights_view, digests[DATA_MEMBER], done=mapped, copy_to=weights.directory / DATA_MEMBER)
        return _Members(data, digest, None, size)
    # the session reads the artifact in place through the link; the module's graph reads a copy made when first
    # asked for (weights_dir), which most processes never are
    weights.defer(DATA_MEMBER, MemberCopy(path, weights.directory / LINK_NAME, offset, size, digests[DATA_MEMBER]))
    return _Members(data, DigestThread(weights_view, digests[DATA_MEMBER], done=mapped), offset, size)


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


def _stored_session(
    path: Path, metadata: dict[str, Any], data: dict[str, bytes], members: _Members, weights: WeightFiles
) -> tuple[str, onnx.ModelProto] | None:
    """The stored session graph (``session.onnx``, :mod:`pipeline.runtime.ort.stored_graph`) reading the linked
    artifact in place, with the fingerprint it was made for; None when the artifact has none."""
    record = metadata.get("session_graph")
    blob = data.get(SESSION_MEMBER)
    if blob is None or not isinstance(record, dict) or not isinstance(record.get("key"), str):
        return None  # an artifact written before session graphs were stored (or by a version without them)
    try:
        graph = onnx.load_model_from_string(blob)
    except Exception as exc:
        raise ArtifactError(f"{path}: {SESSION_MEMBER} does not parse: {exc}", fix=REWRITE_FIX) from exc
    _check_weights_inside(path, graph, members.data_size)
    assert members.data_offset is not None  # the caller's condition: the graph reads the artifact through a link
    graph = _pointing_into_artifact(graph, members.data_offset, copy=False)
    set_weights_dir(graph, weights.directory)
    return record["key"], graph


def _pointing_into_artifact(model: onnx.ModelProto, start: int, *, copy: bool = True) -> onnx.ModelProto:
    """``model`` (a copy, unless ``copy`` is False) whose external tensors read the linked artifact at their bytes'
    offset in the file."""
    if copy:
        model, original = onnx.ModelProto(), model
        model.CopyFrom(original)
    for tensor in external_tensors(model):
        offset = ExternalDataInfo(tensor).offset or 0
        kept = [e for e in tensor.external_data if e.key not in ("location", "offset")]
        del tensor.external_data[:]
        tensor.external_data.add(key="location", value=LINK_NAME)
        tensor.external_data.add(key="offset", value=str(start + offset))
        tensor.external_data.extend(kept)
    return model


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


def _check_io_against_graph(path: Path, metadata: dict[str, Any], model: onnx.ModelProto) -> IOSpec:
    """The I/O spec the module calls with, which must be the graph's (:func:`io_disagreement`)."""
    try:
        io = IOSpec.from_json(metadata["io"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{path}: the I/O spec in {METADATA_MEMBER} is malformed: {exc}", fix=REWRITE_FIX) from exc
    reason = io_disagreement(io, model)
    if reason is not None:
        raise ArtifactError(f"{path}: {reason}", fix=REWRITE_FIX)
    return io


def _saved_settings(path: Path, metadata: dict[str, Any]) -> Settings:
    """The saved settings, which must be valid (:meth:`OpenedArtifact.read` checks that they describe the graph,
    :func:`settings_disagreement`): they are the artifact's (a broken artifact, not the caller's input), so every
    error here is an ArtifactError."""
    try:
        return settings_from_json(metadata["settings"])
    except (InputError, TypeError, ValueError) as exc:
        cause = exc.message if isinstance(exc, InputError) else str(exc)
        raise ArtifactError(
            f"{path}: the settings in {METADATA_MEMBER} are not valid: {cause}", fix=REWRITE_FIX
        ) from exc


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
            stacklevel=5,  # pipeline.load's caller: PendingChecks.check, Artifact.verified, the loader, pipeline.load
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
