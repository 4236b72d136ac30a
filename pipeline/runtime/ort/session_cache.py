"""ONNX Runtime's optimized graph of a loaded artifact, kept per machine: later loads skip ONNX Runtime's graph
optimizations.

Making a session costs three things: reading and optimizing the graph (fusions, constant folding, layout changes),
laying out the weights for the CPU kernels (``MatMul`` prepacking), and the rest of the set-up. Only the first can be
cached. For the 226 MB generation step of a Llama (hidden 512, 8 layers) in a fresh process, a session costs 0.29-0.35
s of CPU, 0.25-0.3 s of it prepacking, and the cache saves 0.03-0.05 s of CPU (0.1 s of wall time on this loaded
2-core machine; ``benchmarks/bench_load.py``). ONNX Runtime 1.32 can save the prepacked weights
(``session.save_external_prepacked_constant_initializers``), but a session that loads them packs every weight again:
it finds the saved copy by the hash of the freshly packed bytes, so the saved copy saves memory, not time. Measured:
the log's time from "Done saving initialized tensors" to "Session successfully initialized" is the same with and
without it, the packing loop is as hot under ``perf``, and a session loaded from such a model whose plain weights were
zeroed computes with zeros (a test keeps checking that). So the cache keeps the optimized graph, never packed weights.

**What an entry holds.** The graph ONNX Runtime optimized for this machine (``optimized_model_filepath``), in which
every weight that is, byte for byte, a weight of the artifact points back at the artifact's bytes (the very bytes the
session maps); a weight ONNX Runtime made (a folded constant) is kept inline. That is 47 KB for the Llama step, in
``<cache_dir>/onnxruntime-sessions/<key>.onnx``, after a header holding the SHA-256 of the rest.

**The key.** The SHA-256 of the graph the session runs (``runnable_model``'s output, serialised without the machine
path of its weights), which names its weights by their SHA-256 (the artifact manifest's, recorded in the graph by
:func:`pipeline.runtime.artifact.read_artifact`); every session option; the execution providers and disabled
optimizers; the ONNX Runtime version and build; this CPU (model and instruction set: the optimized graph may hold
layouts chosen for it); :data:`CACHE_FORMAT`. Only a graph whose external weights are all named that way, and whose
inline weights are small, is cached: hashing the weights at every load would cost more than the cache saves. Nor is
a model over ``external_data_threshold`` (the executor's choice): building its entry would write and read its weights
again, twice the model in memory and on disk, to save a tenth of a second.

**A hit.** The session is made from the entry with ONNX Runtime's graph optimizations off: the graph it runs is the
one the uncached session optimizes to, so the outputs are the same, bit for bit (the tests compare them), and so is
the speed. An entry that does not read back (a bad header or digest, a graph that points outside the artifact's
weights, a graph ONNX Runtime refuses) is reported (:class:`SessionCacheWarning`), removed and built again; the session
is then made as if there were no cache. The weights' own check (``pipeline.load``'s) is the same on a hit.

**A miss.** The session is made as before, then a thread at low priority builds the entry: a second session that only
optimizes and saves (no prepacking, one thread: neither changes the saved graph), reading the weights through a hard
link in its scratch directory (the module's private one may go first), then the weights compared with the artifact's
(whose SHA-256 is checked on the way: an entry is never built from weights other than the recorded ones), then an
atomic write. A build still running when the interpreter exits is cancelled; a scratch directory left by a killed one
is removed by a later build. :func:`wait_for_builds` waits for them (tests, benchmarks). At most :data:`MAX_ENTRIES`
entries are kept, the least recently used removed first. A cache directory that cannot be used is said once (a
WARNING) and the loads stay as they were.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import json
import logging
import mmap
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnxruntime as ort
from onnx.external_data_helper import ExternalDataInfo

from converters.files import write_file_atomically
from passes.model_io.external_data import external_tensors, set_weights_dir, weights_dir, without_weights_dir
from pipeline.runtime.artifact import RecordedWeights, recorded_weights

log = logging.getLogger(__name__)

#: Part of every key: bump it when the key's contents or the entry's layout change, so that old entries go unread.
CACHE_FORMAT = 1
#: The cache's directory under ``Settings.cache_dir`` (the engine cache's directory).
SUBDIRECTORY = "onnxruntime-sessions"
#: The first line of an entry; the second is the SHA-256 of the rest (the serialised graph).
MAGIC = b"torch-trt-pipeline onnxruntime optimized graph\n"
#: Entries kept; past it the least recently used (by modification time, set on every hit) are removed.
MAX_ENTRIES = 256
#: Bytes of weights ONNX Runtime made (not in the artifact) an entry keeps inline; a graph with more is not cached.
MAX_INLINE_BYTES = 64 << 20
FOLDER_KEY = "session.model_external_initializers_file_folder_path"
PREPACKING_KEY = "session.disable_prepacking"
#: Session options that do not change the session (logging, profiling, the path of a saved graph): not in the key.
UNKEYED_OPTIONS = frozenset(
    {"log_severity_level", "log_verbosity_level", "logid", "enable_profiling", "profile_file_prefix"}
    | {"optimized_model_filepath"}
)
_SAVED_GRAPH = "optimized.onnx"
_BUILD_NICENESS = 10  # the builder thread yields the cores to the loaded module's own work
_STALE_BUILD_SECONDS = 3600
#: An entry's header: the magic line, then the SHA-256 of the rest in hex and a newline.
HEADER_BYTES = len(MAGIC) + 65


class SessionCacheWarning(UserWarning):
    """A session cache entry that could not be used (corrupted, half written, refused by ONNX Runtime)."""


class RecordingOptions(ort.SessionOptions):
    """``ort.SessionOptions`` that remember their config entries (ONNX Runtime cannot list them), for the key."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: dict[str, str] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        """ONNX Runtime's method, recorded."""
        self.entries[key] = value
        super().add_session_config_entry(key, value)

    def described(self) -> dict[str, str]:
        """Every option that can change the session: the config entries (but the folder of the weights, a private
        directory of this load) and the attributes (but logging and profiling)."""
        described = {f"entry:{k}": v for k, v in self.entries.items() if k != FOLDER_KEY}
        for name in dir(self):
            if name.startswith("_") or name in UNKEYED_OPTIONS or name == "entries":
                continue
            value = getattr(self, name)
            if not callable(value):
                described[f"attribute:{name}"] = str(value)
        return described

    def for_saving(self, graph_path: Path, folder: Path) -> RecordingOptions:
        """Options that optimize as these do and save the result at ``graph_path``, the weights read from
        ``folder``: no prepacking and one thread (neither changes the optimized graph, and the builder should cost
        little), weights of 1 KB and more in a data file beside the saved graph."""
        options = RecordingOptions()
        options.log_severity_level = 3
        for key, value in self.entries.items():
            if key not in (PREPACKING_KEY, FOLDER_KEY):
                options.add_session_config_entry(key, value)
        options.add_session_config_entry(FOLDER_KEY, str(folder))
        options.add_session_config_entry(PREPACKING_KEY, "1")
        options.intra_op_num_threads = 1
        options.graph_optimization_level = self.graph_optimization_level
        options.optimized_model_filepath = str(graph_path)
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", graph_path.name + ".data"
        )
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        return options


def open_session(
    model: onnx.ModelProto,
    graph: bytes,
    options: RecordingOptions,
    providers: Sequence[str],
    disabled_optimizers: Sequence[str],
    cache_dir: str | Path | None,
) -> ort.InferenceSession:
    """``ort.InferenceSession(graph, options, ...)`` for ``model`` (``graph`` is its serialisation), made from the
    cache entry when there is one; on a miss, the entry is built in the background. ``cache_dir`` None: no cache."""
    plan = _plan(model, options, providers, disabled_optimizers, cache_dir)
    if plan is not None:
        entry = plan.cache.read(plan.key, plan.weights)
        if entry is not None:
            session = _session_from_entry(plan, entry, options, providers, disabled_optimizers)
            if session is not None:
                return session
    session = ort.InferenceSession(
        graph, sess_options=options, providers=list(providers), disabled_optimizers=list(disabled_optimizers)
    )
    if plan is not None:
        _Build.start(plan, graph, options, providers, disabled_optimizers)
    return session


def wait_for_builds() -> None:
    """Wait until every entry being built in the background is written (or given up)."""
    for build in list(_Build.running):
        build.join()


def session_key(
    model: onnx.ModelProto, options: RecordingOptions, providers: Sequence[str], disabled_optimizers: Sequence[str]
) -> str:
    """The entry name of a session of ``model`` with these options, on this machine (see the module docstring)."""
    graph = without_weights_dir(model).SerializeToString(deterministic=True)
    payload = {
        "format": CACHE_FORMAT,
        "graph": hashlib.sha256(graph).hexdigest(),
        "options": options.described(),
        "providers": list(providers),
        "disabled_optimizers": sorted(disabled_optimizers),
        "onnxruntime": ort.__version__,
        "build": ort.get_build_info(),
        "cpu": cpu_identity(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@functools.cache
def cpu_identity() -> str:
    """This CPU: vendor, family, model and instruction-set flags (Linux), else what ``platform`` knows."""
    with contextlib.suppress(OSError):
        fields: dict[str, str] = {}
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():
                    break  # the first processor's block
                name, _, value = line.partition(":")
                fields[name.strip()] = value.strip()
        wanted = ("vendor_id", "cpu family", "model", "model name", "flags", "Features", "CPU implementer", "CPU part")
        described = {k: fields[k] for k in wanted if k in fields}
        if described:
            return json.dumps(described, sort_keys=True)
    return f"{platform.machine()} {platform.processor()}"


class SessionCache:
    """Entries in ``directory``, one file each (see the module docstring)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).expanduser()

    def entry_path(self, key: str) -> Path:
        """The file of ``key``'s entry."""
        return self.directory / f"{key}.onnx"

    def read(self, key: str, weights: RecordedWeights) -> bytes | None:
        """The entry's graph, checked (digest, weights inside the recorded ones); None on a miss. A broken entry is
        reported (:class:`SessionCacheWarning`), removed, and reads as a miss."""
        path = self.entry_path(key)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.info("session cache: cannot read %s (%s); making the session without it", path, exc)
            return None
        problem = _entry_problem(blob, weights)
        if problem is not None:
            self.discard(key, problem)
            return None
        with contextlib.suppress(OSError):  # a read-only cache still serves hits
            os.utime(path)  # the hit is a use: the entry is now the most recently used
        return blob[HEADER_BYTES:]

    def write(self, key: str, graph: bytes) -> Path:
        """Store ``graph`` as ``key``'s entry, atomically; then keep the :data:`MAX_ENTRIES` most recently used."""
        path = write_file_atomically(
            self.entry_path(key), MAGIC + hashlib.sha256(graph).hexdigest().encode() + b"\n" + graph
        )
        self.evict(keep=path)
        return path

    def discard(self, key: str, problem: str) -> None:
        """Report and remove a broken entry (it is built again after this load)."""
        path = self.entry_path(key)
        warnings.warn(
            f"the ONNX Runtime session cache entry {path} {problem}; it is removed, the session is made without it "
            "and the entry built again",
            SessionCacheWarning,
            stacklevel=2,
        )
        with contextlib.suppress(OSError):
            path.unlink()

    def evict(self, keep: Path) -> None:
        """Remove the least recently used entries past :data:`MAX_ENTRIES` (never ``keep``)."""
        try:
            entries = sorted((p.stat().st_mtime, p) for p in self.directory.glob("*.onnx") if p != keep)
        except OSError:
            return
        for _, path in entries[: max(0, len(entries) + 1 - MAX_ENTRIES)]:
            with contextlib.suppress(OSError):
                path.unlink()


@dataclass(frozen=True)
class _Plan:
    """What a cached session needs: the cache, the key, the weights the graph reads and where they are."""

    cache: SessionCache
    key: str
    weights: RecordedWeights
    folder: Path
    model: onnx.ModelProto


def _plan(
    model: onnx.ModelProto,
    options: RecordingOptions,
    providers: Sequence[str],
    disabled_optimizers: Sequence[str],
    cache_dir: str | Path | None,
) -> _Plan | None:
    """The plan for ``model``'s session, or None when it is not cached: no cache directory, or weights the graph
    does not name by their SHA-256 (every external tensor must read inside the recorded bytes)."""
    weights = recorded_weights(model)
    folder = weights_dir(model)
    if cache_dir is None or weights is None or folder is None:
        return None
    if sum(len(t.raw_data) for t in model.graph.initializer) > MAX_INLINE_BYTES:
        return None  # weights read in (a rewritten graph): the key would hash them at every load
    for tensor in external_tensors(model):
        info = ExternalDataInfo(tensor)
        if not weights.holds(info.location, info.offset or 0, info.length):
            return None
    cache = SessionCache(Path(cache_dir).expanduser() / SUBDIRECTORY)
    return _Plan(cache, session_key(model, options, providers, disabled_optimizers), weights, folder, model)


def _session_from_entry(
    plan: _Plan,
    entry: bytes,
    options: RecordingOptions,
    providers: Sequence[str],
    disabled_optimizers: Sequence[str],
) -> ort.InferenceSession | None:
    """The session of the cached graph, with ONNX Runtime's optimizations off (already applied); None, with the
    entry reported and removed, when ONNX Runtime refuses it."""
    level = options.graph_optimization_level
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(
            entry, sess_options=options, providers=list(providers), disabled_optimizers=list(disabled_optimizers)
        )
    except Exception as exc:  # noqa: BLE001 - any refusal means: not this entry; the session is made without it
        plan.cache.discard(plan.key, f"is refused by ONNX Runtime ({exc})")
        options.graph_optimization_level = level
        return None
    log.info("session cache hit: %s", plan.cache.entry_path(plan.key))
    return session


def _entry_problem(blob: bytes, weights: RecordedWeights) -> str | None:
    """Why ``blob`` is not a usable entry for a graph reading ``weights``; None when it is."""
    if not blob.startswith(MAGIC) or len(blob) < HEADER_BYTES or blob[HEADER_BYTES - 1 : HEADER_BYTES] != b"\n":
        return "has no valid header (written by something else, or cut short)"
    graph = blob[HEADER_BYTES:]
    if hashlib.sha256(graph).hexdigest().encode() != blob[len(MAGIC) : HEADER_BYTES - 1]:
        return "does not match its SHA-256 (corrupted, or half written)"
    try:
        model = onnx.load_model_from_string(graph)
    except Exception as exc:  # noqa: BLE001 - a graph that does not parse is a broken entry
        return f"does not parse as an ONNX graph ({exc})"
    for tensor in external_tensors(model):
        info = ExternalDataInfo(tensor)
        if not weights.holds(info.location, info.offset or 0, info.length):
            return f"has tensor {tensor.name!r} outside the artifact's weights"
    return None


class _Build:
    """One entry being built in a daemon thread (see the module docstring); cancelled at interpreter exit.

    Its scratch directory, in the cache directory, holds a hard link to the artifact, so that the build does not
    depend on the module's private directory (which goes with the module); where no link can be made (another file
    system), it reads the module's, and a module dropped at once leaves no entry."""

    running: set[_Build] = set()
    failed: set[Path] = set()  # cache directories a build failed in: said once at WARNING, then at INFO
    _lock = threading.Lock()

    def __init__(self, plan: _Plan, graph: bytes, options: RecordingOptions, providers: list[str], disabled: list[str]):
        self.plan, self.graph, self.options, self.providers, self.disabled = plan, graph, options, providers, disabled
        self.cancelled = threading.Event()
        self.saving: RecordingOptions | None = None
        plan.cache.directory.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=plan.cache.directory))
        try:
            self.folder = self.scratch
            try:
                os.link(plan.folder / plan.weights.location, self.scratch / plan.weights.location)
            except OSError:
                self.folder = plan.folder
            self.weights_file = open(self.folder / plan.weights.location, "rb")  # noqa: SIM115 - the thread closes it
        except BaseException:
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        self.thread = threading.Thread(target=self._run, name="onnxruntime-session-cache", daemon=True)

    @classmethod
    def start(
        cls,
        plan: _Plan,
        graph: bytes,
        options: RecordingOptions,
        providers: Sequence[str],
        disabled: Sequence[str],
    ) -> None:
        """Build ``plan``'s entry in the background (nothing, said once, when the cache directory cannot be used)."""
        try:
            build = cls(plan, graph, options, list(providers), list(disabled))
        except OSError as exc:
            _failed(plan.cache.directory, exc)
            return
        with cls._lock:
            cls.running.add(build)
        build.thread.start()

    def join(self) -> None:
        """Wait for the build."""
        self.thread.join()

    def cancel(self) -> None:
        """Stop the build as soon as it can (ONNX Runtime's load cancellation where it has it)."""
        self.cancelled.set()
        saving = self.saving
        if saving is not None and hasattr(saving, "set_load_cancellation_flag"):
            saving.set_load_cancellation_flag(True)

    def _run(self) -> None:
        try:
            _lower_priority()
            _remove_stale_builds(self.plan.cache.directory)
            entry = self._optimized(self.scratch / _SAVED_GRAPH)
            if entry is not None and not self.cancelled.is_set():
                path = self.plan.cache.write(self.plan.key, entry)
                log.debug("session cache: stored %s (%d bytes)", path, len(entry))
        except Exception as exc:  # noqa: BLE001 - the loaded session is unaffected: no entry, said once
            if not self.cancelled.is_set():
                _failed(self.plan.cache.directory, exc)
        finally:
            self.weights_file.close()
            shutil.rmtree(self.scratch, ignore_errors=True)
            with self._lock:
                self.running.discard(self)

    def _optimized(self, saved: Path) -> bytes | None:
        """ONNX Runtime's optimized graph, saved at ``saved`` (its weights in a data file beside it), with its
        weights pointed back at the artifact's; None when cancelled or when the weights are not the recorded ones."""
        self.saving = self.options.for_saving(saved, self.folder)
        if self.cancelled.is_set():
            return None
        ort.InferenceSession(
            self.graph, sess_options=self.saving, providers=self.providers, disabled_optimizers=self.disabled
        )
        if self.cancelled.is_set():
            return None
        data = saved.with_name(saved.name + ".data")
        with contextlib.ExitStack() as stack:
            source = stack.enter_context(mmap.mmap(self.weights_file.fileno(), 0, access=mmap.ACCESS_READ))
            written: mmap.mmap | bytes = b""
            if data.exists() and data.stat().st_size:
                handle = stack.enter_context(open(data, "rb"))
                written = stack.enter_context(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))
            if not _weights_are_recorded_ones(source, self.plan.weights):
                log.info("session cache: the weights differ from their recorded SHA-256; no entry is written")
                return None
            return _deduplicated(onnx.load(str(saved), load_external_data=False), self.plan, source, written)


def _failed(directory: Path, exc: BaseException) -> None:
    """Say why no entry could be built in ``directory``: at WARNING the first time, at INFO after."""
    if directory in _Build.failed:
        log.info("session cache: could not build an entry in %s (%s)", directory, exc)
    else:
        _Build.failed.add(directory)
        log.warning(
            "session cache: could not build an entry in %s (%s); loads stay as fast as without it", directory, exc
        )


def _weights_are_recorded_ones(source: mmap.mmap, weights: RecordedWeights) -> bool:
    """Do the bytes ``weights`` names in ``source`` have its SHA-256? (An entry holds weights ONNX Runtime made
    from them, folded constants: it must not be built from others.)"""
    view = memoryview(source)[weights.offset : weights.offset + weights.length]
    try:
        return len(view) == weights.length and hashlib.sha256(view).hexdigest() == weights.sha256
    finally:
        view.release()


def _deduplicated(
    optimized: onnx.ModelProto, plan: _Plan, source: mmap.mmap, written: mmap.mmap | bytes
) -> bytes | None:
    """``optimized`` (saved by ONNX Runtime, its weights in ``written``) with each weight that is, byte for byte, the
    runnable graph's weight of that name (in ``source``, the artifact) pointed at the artifact's bytes, and the others
    (made by ONNX Runtime) inline; None when more than :data:`MAX_INLINE_BYTES` would be inline."""
    original = {t.name: ExternalDataInfo(t) for t in external_tensors(plan.model)}
    inline = 0
    for tensor in list(external_tensors(optimized)):
        info = ExternalDataInfo(tensor)
        start = info.offset or 0
        made = written[start : start + info.length] if info.length is not None else written[start:]
        same = original.get(tensor.name)
        if same is not None and same.length == len(made):
            at = same.offset or 0
            if source[at : at + len(made)] == made:
                _point_at(tensor, plan.weights.location, at, len(made))
                continue
        inline += len(made)
        if inline > MAX_INLINE_BYTES:
            log.info("session cache: ONNX Runtime made over %d bytes of weights; no entry is written", MAX_INLINE_BYTES)
            return None
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
        tensor.raw_data = bytes(made)
    set_weights_dir(optimized, None)  # the build's private directory: each load names its own
    return optimized.SerializeToString()


def _remove_stale_builds(directory: Path) -> None:
    """Remove the scratch directories of builds killed before they could (a build takes seconds, not an hour)."""
    cutoff = time.time() - _STALE_BUILD_SECONDS
    for scratch in directory.glob(".build-*"):
        with contextlib.suppress(OSError):
            if scratch.stat().st_mtime < cutoff:
                shutil.rmtree(scratch, ignore_errors=True)


def _point_at(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    tensor.external_data.add(key="offset", value=str(offset))
    tensor.external_data.add(key="length", value=str(length))


def _lower_priority() -> None:
    """Lower this thread's CPU priority (Linux: a thread's own nice value) so that the build yields to the module."""
    if sys.platform.startswith("linux") and hasattr(os, "setpriority"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _BUILD_NICENESS)


@atexit.register
def _cancel_builds() -> None:
    """At exit, a build still running is cancelled and waited for (ONNX Runtime must not run past finalisation)."""
    builds = list(_Build.running)
    for build in builds:
        build.cancel()
    for build in builds:
        build.join()
