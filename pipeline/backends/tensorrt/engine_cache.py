"""The engine cache: one serialized TensorRT engine per final graph, TensorRT version, GPU and build settings.

An entry is two files in the cache directory: ``<key>.plan`` (the engine) and ``<key>.plan.sha256`` (its
SHA-256), both written atomically while the entry's lock file ``<key>.plan.lock`` is held, so two processes
converting the same model build its engine once: the second waits for the lock, then finds the entry. Reads
take the lock too, so a reader never sees an engine without its digest. An entry whose bytes do not match
the digest (a crash between the two writes, a disk error, a hand edit) is reported, removed and built again.
The directory also keeps TensorRT's tactic timing caches, one per TensorRT version and GPU, so later builds
of any model reuse earlier timings; Polygraphy merges and saves those under its own lock.

The engines may be bounded (``max_bytes``, the ``trt_engine_cache_size`` setting): after an entry is stored, the
least recently used entries are removed until the engines fit, the new entry never. A hit is a use: it sets the
engine file's modification time, which orders the entries (access times are not kept on most mounts). Each
removal takes the entry's lock without waiting and skips an entry another process holds; it removes the engine
first and its digest second, and a digest left without its engine (a process killed in between) reads as a miss,
not as a corrupted entry. Timing caches and lock files are not counted and never removed.

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
import importlib.util
import json
import logging
import os
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
    """Engines on disk, keyed by :func:`cache_key`; see the module docstring for the layout and guarantees.

    ``max_bytes`` bounds the engines kept (engine and digest files; None or 0: no bound).
    """

    def __init__(self, directory: str | Path, max_bytes: int | None = None) -> None:
        self.directory = Path(directory).expanduser()
        self.max_bytes = max_bytes or None

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
        with exclusive_lock(_lock_path(path)):
            engine, problem = self._read(path)
            if engine is not None:
                logger.info("engine cache hit: %s", path)
                with contextlib.suppress(OSError):  # a read-only cache still serves hits
                    os.utime(path)  # the hit is a use: the entry is now the most recently used
                return CacheResult(engine, "hit", path)
            if problem is not None:
                logger.warning("engine cache entry %s is corrupted (%s); removing it and building again", path, problem)
            self._remove(path)  # a corrupted entry, or a digest whose engine was evicted
            engine = build()
            write_file_atomically(path, engine)
            write_file_atomically(_digest_path(path), hashlib.sha256(engine).hexdigest().encode())
            logger.info("engine cache: stored %s (%d bytes)", path, len(engine))
            status = "built" if problem is None else f"rebuilt (the cached entry was corrupted: {problem})"
        if self.max_bytes is not None:
            self.evict(keep=path)
        return CacheResult(engine, status, path)

    def evict(self, keep: Path | None = None) -> int:
        """Remove least recently used entries until the engines fit ``max_bytes``; returns the bytes removed.

        ``keep`` (the entry just stored) is never removed; if it alone is over the bound a WARNING says so. An
        entry whose lock another process holds is skipped. Logs at INFO what was removed, nothing otherwise.
        """
        if self.max_bytes is None:
            return 0
        if importlib.util.find_spec("fcntl") is None:  # Windows: no lock can be tried without waiting
            logger.warning(
                "engine cache: trt_engine_cache_size is not enforced on this platform (no fcntl to skip entries "
                "another process holds); remove old *.plan files from %s by hand, or pass trt_engine_cache_size=None",
                self.directory,
            )
            return 0
        entries = sorted(_entries(self.directory))  # oldest first
        total = sum(size for _, size, _ in entries)
        removed, freed, busy = 0, 0, 0
        for used, size, plan in entries:
            if total <= self.max_bytes:
                break
            if plan == keep:
                continue
            outcome = self._remove_if_free(plan, used)
            if outcome is None:
                busy += 1
                continue
            removed, freed, total = removed + (outcome > 0), freed + outcome, total - size
        self._report(removed, freed, busy, total, keep)
        return freed

    def _remove_if_free(self, plan: Path, used: float) -> int | None:
        """Remove one entry if no process holds its lock and none used it since it was listed (last use ``used``):
        the bytes freed (0 if another process removed it), or None if it stays (in use, used meanwhile)."""
        try:
            with try_exclusive_lock(_lock_path(plan)) as locked:
                if not locked:
                    return None
                try:
                    if plan.stat().st_mtime != used:  # a hit or a rebuild since the listing: it is recent now
                        return None
                except FileNotFoundError:
                    return 0
                size = _entry_size(plan)
                self._remove(plan)
                return size
        except OSError as exc:
            logger.warning("engine cache: could not remove %s (%s); the cache may stay over its bound", plan, exc)
            return None

    def _report(self, removed: int, freed: int, busy: int, total: int, keep: Path | None) -> None:
        bound = self.max_bytes or 0
        if removed:
            logger.info(
                "engine cache: evicted %d least recently used engine(s), %d bytes (%s), to keep %s within %d bytes",
                removed,
                freed,
                _human(freed),
                self.directory,
                bound,
            )
        if total <= bound:
            return
        own = _entry_size(keep) if keep is not None else 0
        if own > bound:
            logger.warning(
                "engine cache: the engine just stored (%d bytes, %s) is larger than the bound "
                "trt_engine_cache_size=%d bytes (%s), so the cache is bounded by less than one engine; it is kept. "
                "Set trt_engine_cache_size to at least %d (or None for no bound)",
                own,
                _human(own),
                bound,
                _human(bound),
                own,
            )
        elif busy:
            logger.info(
                "engine cache: %s holds %d bytes, over its bound of %d, because %d entry(ies) are in use by another "
                "process; they are removed by a later store",
                self.directory,
                total,
                bound,
                busy,
            )

    @staticmethod
    def _read(path: Path) -> tuple[bytes | None, str | None]:
        """(engine, None) for a sound entry, (None, None) for no entry, (None, why) for a corrupted one.

        No engine file is no entry, even with its digest still there: eviction removes the engine first.
        """
        digest_path = _digest_path(path)
        if not path.exists():
            return None, None
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


@contextlib.contextmanager
def try_exclusive_lock(path: Path) -> Iterator[bool]:
    """Take the exclusive lock of :func:`exclusive_lock` without waiting: yields True while it is held, False if
    another process holds it (or on a platform without ``fcntl``, where it cannot be tried)."""
    try:
        import fcntl
    except ImportError:
        yield False
        return
    with path.open("a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _entries(directory: Path) -> Iterator[tuple[float, int, Path]]:
    """(last use, bytes, engine path) of every entry in ``directory``; one removed meanwhile is left out."""
    for plan in directory.glob("*.plan"):
        try:
            mtime = plan.stat().st_mtime
        except FileNotFoundError:
            continue
        yield mtime, _entry_size(plan), plan


def _entry_size(plan: Path) -> int:
    """Bytes of an entry's engine and digest files (0 for those missing)."""
    size = 0
    for path in (plan, _digest_path(plan)):
        with contextlib.suppress(FileNotFoundError):
            size += path.stat().st_size
    return size


def _human(size: int) -> str:
    return f"{size / (1 << 30):.2f} GiB" if size >= 1 << 30 else f"{size / (1 << 20):.1f} MiB"


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")
