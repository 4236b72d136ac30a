"""The engine cache: one serialized TensorRT engine per final graph, TensorRT version, GPU and build settings.

An entry is two files in the cache directory: ``<key>.plan`` (the engine) and ``<key>.plan.sha256`` (its
SHA-256), both written atomically while the entry's lock file ``<key>.plan.lock`` is held, so two processes
converting the same model build its engine once: the second waits for the lock, then finds the entry. Reads
take the lock too, so a reader never sees an engine without its digest. An entry whose bytes do not match
the digest (a crash between the two writes, a disk error, a hand edit) is reported, removed and built again.
The directory also keeps TensorRT's tactic timing caches, one per TensorRT version and GPU, so later builds
of any model reuse earlier timings; Polygraphy merges and saves those under its own lock.

Nothing here imports TensorRT: the cache stores bytes, and all of it is tested on the CPU with real files.

>>> cache = EngineCache("/tmp/engines")                                                  # doctest: +SKIP
>>> key = cache_key(graph_digest(model), {"tensorrt": "10.16.1.11", "compute_capability": "8.9"}, {})  # doctest: +SKIP
>>> result = cache.get_or_build(key, lambda: build_the_engine())                         # doctest: +SKIP
>>> result.status                                                                         # doctest: +SKIP
'hit'
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from onnx.external_data_helper import ExternalDataInfo

from converters.errors import BuildError
from converters.files import write_file_atomically
from passes.model_io.external_data import external_tensors, weights_dir, without_weights_dir

logger = logging.getLogger(__name__)

#: Part of every key: bump it when the key's contents or the entry layout change, so old entries are not read.
CACHE_FORMAT = 1


def graph_digest(model: onnx.ModelProto, base_dir: str | Path | None = None) -> str:
    """SHA-256 of the serialized graph and of every external-data file its tensors point to (under ``base_dir``,
    by default the pipeline's weights directory of the model).

    Two graphs that differ only in external weights get different digests, since the weights are part of it.
    """
    if base_dir is None:
        base_dir = weights_dir(model)
    model = without_weights_dir(model)  # the key names a private directory that changes from run to run
    digest = hashlib.sha256(model.SerializeToString(deterministic=True))
    locations = sorted({ExternalDataInfo(t).location for t in external_tensors(model)})
    for location in locations:
        if base_dir is None:
            raise BuildError(
                f"the graph keeps weights in the external file {location!r} but no directory was given to find it",
                fix="pass the directory of the .onnx file (base_dir), or load the model with its external data",
            )
        path = Path(base_dir) / location
        digest.update(location.encode())
        try:
            with path.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
        except OSError as exc:
            raise BuildError(
                f"the graph's external weights file {path} cannot be read: {exc}",
                fix="keep the external data file beside the .onnx file it belongs to",
            ) from exc
    return digest.hexdigest()


def cache_key(graph: str, device: Mapping[str, str], build_settings: Mapping[str, Any]) -> str:
    """The entry name: a hash of the graph digest, the device identity (TensorRT version, GPU compute
    capability) and every setting that changes the engine. JSON with sorted keys, so it is the same in every
    process and on every machine."""
    payload = {"format": CACHE_FORMAT, "graph": graph, "device": dict(device), "build": dict(build_settings)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class CacheResult:
    """The engine, how it was obtained (``hit``, ``built``, or ``rebuilt (...)`` after a corrupted entry)."""

    engine: bytes
    status: str
    path: Path


class EngineCache:
    """Engines on disk, keyed by :func:`cache_key`; see the module docstring for the layout and guarantees."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).expanduser()

    def entry_path(self, key: str) -> Path:
        """The engine file of ``key``."""
        return self.directory / f"{key}.plan"

    def timing_cache_path(self, device: Mapping[str, str]) -> Path:
        """Where the timing cache for this TensorRT version and GPU is kept (timings are per device)."""
        return self.directory / f"timing-trt{device['tensorrt']}-sm{device['compute_capability']}.cache"

    def get_or_build(self, key: str, build: Callable[[], bytes]) -> CacheResult:
        """The cached engine for ``key``, or ``build()``'s, stored before it is returned.

        Holds the entry's lock throughout, so a concurrent caller with the same key waits and then hits. If
        ``build`` raises, nothing is stored and the lock is released.
        """
        path = self.entry_path(key)
        with exclusive_lock(path.with_name(path.name + ".lock")):
            engine, problem = self._read(path)
            if engine is not None:
                logger.info("engine cache hit: %s", path)
                return CacheResult(engine, "hit", path)
            if problem is not None:
                logger.warning("engine cache entry %s is corrupted (%s); removing it and building again", path, problem)
                self._remove(path)
            engine = build()
            write_file_atomically(path, engine)
            write_file_atomically(_digest_path(path), hashlib.sha256(engine).hexdigest().encode())
            logger.info("engine cache: stored %s (%d bytes)", path, len(engine))
            status = "built" if problem is None else f"rebuilt (the cached entry was corrupted: {problem})"
            return CacheResult(engine, status, path)

    @staticmethod
    def _read(path: Path) -> tuple[bytes | None, str | None]:
        """(engine, None) for a sound entry, (None, None) for no entry, (None, why) for a corrupted one."""
        digest_path = _digest_path(path)
        if not path.exists():
            return None, ("the engine file is missing but its digest is there" if digest_path.exists() else None)
        if not digest_path.exists():
            return None, "its SHA-256 file is missing"
        engine = path.read_bytes()
        recorded = digest_path.read_text(errors="replace").strip()
        if hashlib.sha256(engine).hexdigest() != recorded:
            return None, "the engine bytes do not match the recorded SHA-256"
        return engine, None

    @staticmethod
    def _remove(path: Path) -> None:
        path.unlink(missing_ok=True)
        _digest_path(path).unlink(missing_ok=True)


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created if missing); blocks until it is free.

    ``flock`` locks belong to the open file, so threads of one process exclude each other as processes do. The
    lock file is never deleted: another process may be waiting on it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: Polygraphy's msvcrt lock (it locks ``<name>.lock``, so give it the stem)
        from polygraphy.util import LockFile

        with LockFile(str(path.with_suffix(""))):
            yield
        return
    with path.open("a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")
