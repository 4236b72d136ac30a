"""Weights in external data files: graphs over protobuf's 2 GiB limit, kept out of memory while the pipeline works.

A model whose weights exceed ``settings.external_data_threshold`` is exported straight to a data file, and only its
graph (a few MB) is held as a proto; the weights are read from disk when a pass needs one and by ONNX Runtime or
TensorRT's parser when a session or network is made. So the weights are never held twice, and nothing serialises a
proto of more than 2 GiB.

While a model is inside the pipeline it names the directory of its data files in its own ``metadata_props``
(:data:`WEIGHTS_DIR_KEY`): every stage that needs the bytes (a session, the checker, the artifact writer, a fold that
reads a weight) finds them from the proto alone, and the locations stay relative, as ONNX requires.
:func:`save_onnx` writes a self-contained copy (the graph and one compact data file beside it) without that key.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

if TYPE_CHECKING:  # imported where used: loading an artifact (the runtime) needs none of graph-surgeon (0.1-0.3 s)
    import onnx_graphsurgeon as gs

from converters.errors import ConversionError
from converters.files import write_file_atomically

WEIGHTS_DIR_KEY = "torch_trt_pipeline.weights_dir"
#: The location of a weight held apart from a light graph (passes.model_io.weightless): no file, handed over as an
#: array with the graph.
IN_MEMORY = "in-memory"
#: Protobuf cannot serialise a message of 2 GiB or more.
PROTOBUF_LIMIT = (2 << 30) - 1
#: Offsets of tensors in the data files we write are multiples of this, so a runtime can map them in place.
ALIGNMENT = 4096
_CHUNK = 64 << 20


class WeightFiles:
    """A private directory of external data files that exists as long as some object holds this handle.

    >>> files = WeightFiles()            # doctest: +SKIP
    >>> files.directory.is_dir()         # doctest: +SKIP
    True
    """

    def __init__(self, parent: str | Path | None = None) -> None:
        if parent is not None:
            Path(parent).mkdir(parents=True, exist_ok=True)
        self.directory = Path(tempfile.mkdtemp(prefix="ptrt-weights-", dir=parent))
        self._finalizer = weakref.finalize(self, _remove_directory, str(self.directory))

    def cleanup(self) -> None:
        """Delete the directory now rather than when the last holder goes."""
        self._finalizer()

    def defer(self, location: str, write: Callable[[Path], None]) -> None:
        """Write the file ``location`` of the directory only when a graph reading it first asks for its weights
        directory (:func:`weights_dir`): ``write(path)`` then writes it (and may raise, each time it is asked).

        A loaded artifact's session reads the weights in place; the module's graph reads a copy that most processes
        never need (writing it cost a load 0.1-0.4 s of CPU for 226 MB). ``write`` must not hold this handle (the
        directory goes when the last holder does)."""
        with _DEFERRED_LOCK:
            _DEFERRED.setdefault(str(self.directory), {})[location] = write

    def deferred(self) -> set[str]:
        """The files :meth:`defer` has not written yet."""
        with _DEFERRED_LOCK:
            return set(_DEFERRED.get(str(self.directory), {}))


#: directory -> {location: its writer}: the files of a WeightFiles directory written when first needed
_DEFERRED: dict[str, dict[str, Callable[[Path], None]]] = {}
_DEFERRED_LOCK = threading.RLock()


def _remove_directory(directory: str) -> None:
    with _DEFERRED_LOCK:
        _DEFERRED.pop(directory, None)
    shutil.rmtree(directory, ignore_errors=True)


def _write_deferred(directory: Path, model: onnx.ModelProto) -> None:
    """Write the deferred files of ``directory`` that ``model``'s external tensors read (:meth:`WeightFiles.defer`)."""
    with _DEFERRED_LOCK:
        pending = _DEFERRED.get(str(directory))
        if not pending:
            return
        wanted = {ExternalDataInfo(t).location for t in external_tensors(model)} & set(pending)
        for location in sorted(wanted):
            pending[location](directory / location)  # an error leaves it pending: raised again when asked again
            del pending[location]
        if not pending:
            del _DEFERRED[str(directory)]


def weights_dir(model: onnx.ModelProto) -> Path | None:
    """The directory of the model's external data files, if the pipeline put them in one, with the files the model
    reads written there if they were deferred (:meth:`WeightFiles.defer`)."""
    for prop in model.metadata_props:
        if prop.key == WEIGHTS_DIR_KEY:
            directory = Path(prop.value)
            if _DEFERRED:
                _write_deferred(directory, model)
            return directory
    return None


def has_weights_dir(model: onnx.ModelProto) -> bool:
    """Does the model name a directory of external data files (its metadata alone: no deferred file is written)?"""
    return any(prop.key == WEIGHTS_DIR_KEY for prop in model.metadata_props)


def set_weights_dir(model: onnx.ModelProto, directory: Path | None) -> None:
    """Name ``directory`` as the model's external data directory in its metadata (None removes the key)."""
    kept = [p for p in model.metadata_props if p.key != WEIGHTS_DIR_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    if directory is not None:
        model.metadata_props.add(key=WEIGHTS_DIR_KEY, value=str(directory))


def without_weights_dir(model: onnx.ModelProto, *, always_copy: bool = False) -> onnx.ModelProto:
    """``model`` without the weights-directory key (a path of this machine): a copy when it has the key, or when
    ``always_copy``; the model itself otherwise."""
    if not has_weights_dir(model) and not always_copy:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    set_weights_dir(copy, None)
    return copy


def external_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of the model (initializers and Constant attributes, subgraphs too) whose data is external."""
    for tensor in _tensors(model.graph):
        if uses_external_data(tensor):
            yield tensor


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def has_external_data(model: onnx.ModelProto) -> bool:
    """Does any initializer or Constant of ``model`` keep its bytes in an external file?"""
    return next(external_tensors(model), None) is not None


def base_dir_of(model: onnx.ModelProto) -> Path | None:
    """Where the model's external data files are; an error naming the tensor when it has some but no directory."""
    directory = weights_dir(model)
    if directory is None:
        tensor = next((t for t in external_tensors(model) if ExternalDataInfo(t).location != IN_MEMORY), None)
        if tensor is not None:
            raise ConversionError(
                f"tensor {tensor.name!r} keeps its data in the external file {ExternalDataInfo(tensor).location!r}, "
                "but the model does not say which directory holds it",
                fix="load the model from its path (pipeline.check(path), onnx.load(path)) so the files are found",
            )
    return directory


def ort_session_bytes(model: onnx.ModelProto, options: object, prepack: bool | None = None) -> bytes:
    """The serialised model for ``ort.InferenceSession(bytes, options)``.

    When the model has external weights, ``options`` (an ``ort.SessionOptions``) is told where they are, and, unless
    ``prepack`` is True, ONNX Runtime is told not to prepack weights: it then maps the data file into memory instead
    of copying every weight (twice, while the session is made). Measured on a 2.5 GiB two-Linear model: session
    0.0 s instead of 1.8 s, peak memory 2.6 GiB instead of 5.1 GiB (the mapped file, shared and reclaimable), and
    a batch-2 call 295 ms instead of 220 ms. ``prepack=False`` asks for that on any model.
    """
    directory = base_dir_of(model)
    if directory is not None:
        options.add_session_config_entry(  # type: ignore[attr-defined]
            "session.model_external_initializers_file_folder_path", str(directory)
        )
    if prepack is False or (prepack is None and directory is not None):
        options.add_session_config_entry("session.disable_prepacking", "1")  # type: ignore[attr-defined]
    return model.SerializeToString()


def check_model(model: onnx.ModelProto, *, full_check: bool = False) -> None:
    """``onnx.checker.check_model``; a model with external data is checked from a file beside its data, since the
    checker looks for the data files relative to the model's own path."""
    directory = base_dir_of(model) if has_external_data(model) else None
    if directory is None:
        onnx.checker.check_model(model, full_check=full_check)
        return
    handle, name = tempfile.mkstemp(prefix=".check-", suffix=".onnx", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(model.SerializeToString())
        onnx.checker.check_model(name, full_check=full_check)
    finally:
        os.unlink(name)


def __getattr__(name: str) -> Any:
    if name == "ExternalValues":  # a subclass of graph-surgeon's LazyValues: made when first asked for
        return external_values_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def external_values_class() -> Any:
    """``ExternalValues``: graph-surgeon's lazy constant values for a tensor in an external data file."""
    from onnx_graphsurgeon.ir.tensor import LazyValues

    class ExternalValues(LazyValues):
        """graph-surgeon's lazy constant values for a tensor in an external data file under ``base_dir``.

        graph-surgeon's own ``LazyValues.load`` reads external data relative to the working directory; this reads it
        from the weights directory, without storing the bytes in the proto (which graph-surgeon exports as it is).
        """

        def __init__(self, tensor: onnx.TensorProto, base_dir: Path) -> None:
            super().__init__(tensor)
            self.base_dir = base_dir

        def load(self) -> np.ndarray:
            """Read the tensor's values from its data file (one copy, straight into the array)."""
            info = ExternalDataInfo(self.tensor)
            dtype = _NUMPY_TYPES.get(self.tensor.data_type)
            if dtype is not None:  # read straight into the array: one copy of the weight, not three
                count = int(np.prod(self.tensor.dims, dtype=np.int64))
                path = self.base_dir / info.location
                array = np.fromfile(path, dtype=dtype, count=count, offset=info.offset or 0)
                if array.size != count:
                    raise ConversionError(
                        f"tensor {self.tensor.name!r}: {path} holds {array.size} of its {count} elements",
                        fix="the weights file is truncated: convert the model again",
                    )
                return array.reshape(tuple(self.tensor.dims))
            copy = onnx.TensorProto()
            copy.CopyFrom(self.tensor)  # to_array writes the bytes into the proto it is given: not into ours
            return np.array(onnx.numpy_helper.to_array(copy, base_dir=str(self.base_dir)))

    return ExternalValues


#: ONNX element types stored little-endian in external data exactly as numpy holds them.
_NUMPY_TYPES: dict[int, np.dtype[Any]] = {
    onnx.TensorProto.FLOAT: np.dtype("<f4"),
    onnx.TensorProto.FLOAT16: np.dtype("<f2"),
    onnx.TensorProto.DOUBLE: np.dtype("<f8"),
    onnx.TensorProto.INT64: np.dtype("<i8"),
    onnx.TensorProto.INT32: np.dtype("<i4"),
    onnx.TensorProto.INT16: np.dtype("<i2"),
    onnx.TensorProto.INT8: np.dtype("i1"),
    onnx.TensorProto.UINT8: np.dtype("u1"),
    onnx.TensorProto.BOOL: np.dtype("?"),
}


def constant_values(constant: gs.Constant) -> np.ndarray:
    """A constant's values, read without graph-surgeon storing the loaded array on the graph (``.values`` does): a
    pass that only looks at a weight must not leave a copy of it in memory, nor make it inline again."""
    from onnx_graphsurgeon.ir.tensor import LazyValues

    raw = constant._values
    return np.asarray(raw.load() if isinstance(raw, LazyValues) else raw)


def attach_weights(graph: gs.Graph, model: onnx.ModelProto) -> None:
    """Point the graph's external constants at the model's weights directory (after ``gs.import_onnx``)."""
    import onnx_graphsurgeon as gs
    from onnx_graphsurgeon.ir.tensor import LazyValues

    directory = weights_dir(model)
    if directory is None:
        return
    external_values = external_values_class()
    for tensor in graph.tensors().values():
        if isinstance(tensor, gs.Constant):
            values = tensor._values  # graph-surgeon keeps the lazy values here until they are read
            if type(values) is LazyValues and uses_external_data(values.tensor):
                tensor._values = external_values(values.tensor, directory)


def spill_constants(graph: gs.Graph, files: Path, min_bytes: int = 1 << 20) -> int:
    """Write every in-memory constant of at least ``min_bytes`` (made by a pass: folded, converted to fp16) into a
    new data file in ``files`` and let the graph refer to it, so the exported proto stays small. Returns the count.

    A constant whose values a pass replaced keeps graph-surgeon's ``data_location`` of the tensor it was imported
    from; a small one is written inline, so that mark is cleared.
    """
    import onnx_graphsurgeon as gs
    from onnx_graphsurgeon.ir.tensor import LazyValues

    constants = []
    for tensor in graph.tensors().values():
        if not isinstance(tensor, gs.Constant) or isinstance(tensor._values, LazyValues):
            continue
        if tensor.values.nbytes >= min_bytes:
            constants.append(tensor)
        elif tensor.data_location == onnx.TensorProto.EXTERNAL:
            tensor.data_location = None
    if not constants:
        return 0
    path = _fresh_path(files, "passes")
    with open(path, "wb") as out:
        for tensor in constants:
            tensor.data_location = None
            offset = _pad(out)
            proto = _written(tensor, out)
            _set_external(proto, path.name, offset, out.tell() - offset)
            # the in-memory array is released with the old values
            tensor._values = external_values_class()(proto, files)
    return len(constants)


def _written(tensor: gs.Constant, out: IO[bytes]) -> onnx.TensorProto:
    """Write the constant's bytes to ``out`` and return its proto without them. The array's own buffer is written, so
    a large weight is not copied (graph-surgeon's export would copy it three times: bytes, proto, ``raw_data``)."""
    values = np.ascontiguousarray(tensor.values)
    if tensor.export_dtype == values.dtype and values.dtype.isnative and values.dtype.kind in "biuf":
        proto = onnx.TensorProto()
        proto.name = tensor.name
        proto.dims.extend(values.shape)
        proto.data_type = onnx.helper.np_dtype_to_tensor_dtype(values.dtype)
        out.write(memoryview(values).cast("B"))  # type: ignore[arg-type]
        return proto
    from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

    proto = OnnxExporter.export_tensor_proto(tensor)  # other types: graph-surgeon's way
    out.write(proto.raw_data)
    return proto


def remove_unused_files(directory: Path, models: list[onnx.ModelProto]) -> list[Path]:
    """Delete the data files in ``directory`` that none of ``models`` refers to (left by intermediate graphs: the
    precision search's candidates, debug-mode snapshots). Returns the files removed."""
    used = {ExternalDataInfo(t).location for model in models for t in external_tensors(model)}
    removed = [path for path in directory.glob("*.data") if path.name not in used]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def _fresh_path(directory: Path, stem: str) -> Path:
    i = 0
    while (directory / f"{stem}_{i}.data").exists():
        i += 1
    return directory / f"{stem}_{i}.data"


def _pad(out: IO[bytes]) -> int:
    offset = out.tell()
    gap = -offset % ALIGNMENT
    if gap:
        out.write(b"\0" * gap)
    return offset + gap


def _set_external(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    tensor.ClearField("raw_data")
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)


def write_compact(
    model: onnx.ModelProto, out: IO[bytes], location: str, *, inline_min_bytes: int | None = None
) -> tuple[onnx.ModelProto, str]:
    """Copy every external tensor's bytes into ``out`` (one file, aligned) and return the graph pointing at
    ``location`` for them, without the weights-directory key, and the SHA-256 of what was written.
    ``inline_min_bytes``: move the inline initializers of at least that many bytes (``raw_data``) there too, so
    that every weight of the result can be mapped from ``out`` (the artifact's format, ``pipeline.runtime.artifact``).

    Only one chunk of one tensor is in memory at a time (an inline tensor is written from the proto's own bytes).
    """
    source_dir = base_dir_of(model)
    copy = without_weights_dir(model, always_copy=True)  # small when the weights stay in the files
    digest = hashlib.sha256()
    written = 0

    def write(chunk: bytes) -> None:
        nonlocal written
        out.write(chunk)
        digest.update(chunk)
        written += len(chunk)

    inline = len(copy.graph.initializer)  # the main graph's initializers come first: the inline ones that move
    for index, tensor in enumerate(_tensors(copy.graph)):
        if uses_external_data(tensor):
            assert source_dir is not None  # base_dir_of raises when external tensors have no directory
            chunks: Iterator[bytes] = _read_external(source_dir, tensor, ExternalDataInfo(tensor))
        elif inline_min_bytes is not None and index < inline and len(tensor.raw_data) >= max(inline_min_bytes, 1):
            chunks = iter((tensor.raw_data,))
        else:
            continue
        if gap := -written % ALIGNMENT:
            write(b"\0" * gap)
        start = written
        for chunk in chunks:
            write(chunk)
        _set_external(tensor, location, start, written - start)
    return copy, digest.hexdigest()


def external_bytes(model: onnx.ModelProto) -> int:
    """How many bytes of the model's tensors are in external data files (their ``length`` entries)."""
    return sum(ExternalDataInfo(t).length or 0 for t in external_tensors(model))


def _read_external(directory: Path, tensor: onnx.TensorProto, info: ExternalDataInfo) -> Iterator[bytes]:
    path = directory / info.location
    try:
        offset = info.offset or 0
        length = info.length or path.stat().st_size - offset
        with open(path, "rb") as source:
            source.seek(offset)
            left = length
            while left > 0:
                chunk = source.read(min(left, _CHUNK))
                if not chunk:
                    raise OSError(f"file ends {left} bytes early")
                left -= len(chunk)
                yield chunk
    except OSError as exc:
        raise ConversionError(
            f"the weights of tensor {tensor.name!r} cannot be read from {path}: {exc}",
            fix="keep the external data files beside the model (or the converted module alive while it is used)",
        ) from exc


def save_onnx(model: onnx.ModelProto, path: str | Path) -> list[Path]:
    """Write ``model`` to ``path`` atomically; external weights go to one compact ``<name>.data`` beside it.

    Returns the files written. Each is written under a temporary name and renamed into place, the data file first,
    so a crash never leaves a graph pointing at a missing or half-written data file.
    """
    path = Path(path)
    if not has_external_data(model):
        write_file_atomically(path, without_weights_dir(model).SerializeToString())
        return [path]
    data_path = path.with_name(path.name + ".data")
    graphs: list[onnx.ModelProto] = []
    write_file_atomically(data_path, lambda out: graphs.append(write_compact(model, out, data_path.name)[0]))
    write_file_atomically(path, graphs[0].SerializeToString())
    return [path, data_path]
