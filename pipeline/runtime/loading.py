"""``pipeline.load``: an artifact written by ``ConvertedModule.save`` back to a module.

It sits above :mod:`pipeline.runtime.module` (it makes a ``ConvertedModule``), which is why it is not beside
``save_artifact`` in :mod:`pipeline.runtime.artifact`: the module's ``save`` calls that one. Loading never builds: an
engine that must be built (``rebuild=True``, TensorRT asked of an artifact without an engine) is built by the
``build`` callable the caller passes, which ``pipeline.load`` does (:func:`pipeline.backends.build_executor`, imported
only then).

An ONNX Runtime artifact with a stored session graph made for this machine has its session made in a thread as soon
as the members, the settings and that graph are read: ONNX Runtime lets go of the GIL while it makes a session, and
the rest of the load (the module's graph parsed and checked against the metadata, the module's imports) runs
meanwhile. For a float32 generation step that session is the graph without weight prepacking (0.05 s for the
issue-35 Llama, against 0.35 s prepacked): the load returns with it, and the prepacked session is made in a
background thread that outlives the load (:mod:`pipeline.runtime.ort.prepacking`); every call runs on the
unprepacked session until the prepacked one is ready, none waits for it, and a failed build is a BuildError at the
next call.

Python's cyclic garbage collector is paused while an artifact loads (the modules it imports included, which is why
they are imported inside :func:`load`): with torch imported, the collector walks some 170,000 objects each time the
imports' allocations trigger it, which made ``import onnxruntime`` 0.3-0.5 s instead of 0.08 s. A load makes little
cyclic garbage; the collector runs again, as it was, when the load returns or fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from converters.errors import ArtifactError

if TYPE_CHECKING:
    from passes.model_io.external_data import WeightFiles
    from pipeline.runtime.artifact import Artifact
    from pipeline.runtime.artifact_reading import InThread, OpenedArtifact
    from pipeline.runtime.executors import Executor, ExecutorBuilder
    from pipeline.runtime.module import ConvertedModule
    from pipeline.runtime.reports.conversion import ConversionReport
    from pipeline.settings import Settings


def load(
    path: str | Path,
    *,
    backend: str | None = None,
    rebuild: bool = False,
    build: ExecutorBuilder | None = None,
    threads: int | None = None,
    spinning: bool | None = None,
) -> ConvertedModule:
    """Load an artifact written by ``ConvertedModule.save``.

    ``backend=None`` uses the artifact's backend; ``backend="onnxruntime"`` runs its ONNX graph on the CPU even
    when it holds a TensorRT engine. ``rebuild=True`` builds a new engine when the saved one was made for another
    TensorRT version or GPU, with ``build`` (:func:`pipeline.load` passes the conversion layer's). ``threads`` and
    ``spinning`` set ONNX Runtime's intra-op threads and their spin-waiting for this process (None: the artifact's).
    """
    if isinstance(path, str | os.PathLike) and Path(path).is_dir() and (Path(path) / "decoder.ptrt").is_file():
        # an encoder-decoder: two artifacts
        from pipeline.runtime.generation.encoder_decoder import DECODER_FILE, ENCODER_FILE, EncoderDecoderModule

        if not (Path(path) / ENCODER_FILE).is_file():
            raise ArtifactError(
                f"{path} holds {DECODER_FILE} but not {ENCODER_FILE}: an incomplete encoder-decoder",
                fix="save the module again (EncoderDecoderModule.save writes both, atomically)",
            )
        from pipeline.runtime.generation.source_and_step import FIRST_STEP_FILE

        first = (FIRST_STEP_FILE,) if (Path(path) / FIRST_STEP_FILE).is_file() else ()  # a first step of its own
        parts = [
            load(Path(path) / name, backend=backend, rebuild=rebuild, build=build, threads=threads, spinning=spinning)
            for name in (ENCODER_FILE, DECODER_FILE, *first)
        ]
        return EncoderDecoderModule(*parts)  # type: ignore[return-value]
    if isinstance(path, str | os.PathLike) and Path(path).is_dir() and (Path(path) / "prompt.ptrt").is_file():
        # a recurrent model's step and its prompt graph
        from pipeline.runtime.generation.module import PROMPT_FILE, STEP_FILE, GenerativeModule

        if not (Path(path) / STEP_FILE).is_file():
            raise ArtifactError(
                f"{path} holds {PROMPT_FILE} but not {STEP_FILE}: an incomplete step and prompt graph",
                fix="save the module again (its save writes both, atomically)",
            )
        step, prompt = (
            load(Path(path) / name, backend=backend, rebuild=rebuild, build=build, threads=threads, spinning=spinning)
            for name in (STEP_FILE, PROMPT_FILE)
        )
        if not isinstance(step, GenerativeModule):
            raise ArtifactError(
                f"{path}/{STEP_FILE} is not a generation step: the directory is not one a step saved",
                fix="load the directory a converted recurrent model's save wrote",
            )
        step.hold_prompt_graph(prompt)
        return step
    if isinstance(path, str | os.PathLike) and Path(path).is_dir() and (Path(path) / "vision_language.json").is_file():
        # a vision-language model: a vision graph and a text step
        from pipeline.runtime.generation.vision_language import load_directory

        def part(file: Path) -> ConvertedModule:
            return load(file, backend=backend, rebuild=rebuild, build=build, threads=threads, spinning=spinning)

        return load_directory(Path(path), part)  # type: ignore[return-value]
    with collector_paused():
        from pipeline.runtime.artifact_reading import open_artifact

        # the weights' SHA-256 runs while the executor is made; a corrupt artifact still fails here (ArtifactError)
        opened = open_artifact(path)
        early = _early_session(opened, backend, (threads, spinning))
        try:
            artifact = opened.read(wait=False)
        except BaseException:
            _settle(early, opened.weights)  # no session left being made behind the error
            raise
        try:
            module = _module(artifact, path, backend, rebuild, build, (threads, spinning), early)
        except BaseException:
            _settle(early, opened.weights)
            artifact.verified()  # corrupt weights are the cause to report, whatever failed on them
            raise
        artifact.verified()
        return module


def _settle(early: InThread[Executor] | None, weights: WeightFiles) -> None:
    """After an error of the load: the early session made, and the weights it reads held by its executor while it
    still makes its prepacked session in the background (the directory would otherwise go with the failed load,
    under the build)."""
    if early is None:
        return
    early.wait()
    try:
        executor = early.result()
    except Exception:  # noqa: BLE001 - the load's own error is the one raised
        return
    hold = getattr(executor, "hold", None)
    if callable(hold):
        hold(weights)


def _early_session(
    opened: OpenedArtifact, backend: str | None, runtime: tuple[int | None, bool | None]
) -> InThread[Executor] | None:
    """The ONNX Runtime executor of the artifact's stored session graph, made in a thread while the rest of the
    artifact is read and checked, when that is what the load will run (see the module docstring); else None."""
    chosen = backend or opened.metadata["backend"]
    if chosen != "onnxruntime" or opened.metadata.get("plugins") or opened.stored_session is None:
        return None
    from pipeline.runtime.artifact_reading import InThread
    from pipeline.runtime.io_spec import IOSpec
    from pipeline.runtime.ort.executor import OnnxRuntimeExecutor  # imported here: the thread imports nothing
    from pipeline.runtime.ort.stored_graph import session_graph_key

    settings = opened.settings.with_runtime(*runtime)
    key, graph = opened.stored_session
    if key != session_graph_key(settings):
        return None  # the load rewrites the graph (Artifact.session_graph says why)
    try:
        io = IOSpec.from_json(opened.metadata["io"])
    except (KeyError, TypeError, ValueError):
        return None  # a malformed I/O spec: reading the rest says so
    return InThread(lambda: OnnxRuntimeExecutor(graph, io, settings, prepared=graph), name="artifact-session")


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside the block, and back as it was after (see the module docstring)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _module(
    artifact: Artifact,
    path: str | Path,
    backend: str | None,
    rebuild: bool,
    build: ExecutorBuilder | None,
    runtime: tuple[int | None, bool | None] = (None, None),
    early: InThread[Executor] | None = None,
) -> ConvertedModule:
    """The module of a read artifact (its weights possibly still being checked), with the runtime's thread choices;
    ``early``: its executor, being made (:func:`_early_session`)."""
    from pipeline.runtime.artifact import runtime_cache_beside
    from pipeline.runtime.executors import load_executor, select_backend
    from pipeline.runtime.generation.module import module_class

    settings, io = artifact.settings.with_runtime(*runtime), artifact.io
    chosen = backend or artifact.metadata["backend"]
    engine = None
    if chosen == "tensorrt":
        engine = _usable_engine(artifact.engine, artifact.metadata.get("engine", {}), Path(path), rebuild, settings)
    elif chosen == "tensorrt-rtx" and not rebuild:
        engine = artifact.engine  # runs where TensorRT-RTX supports the GPU, else kept beside ONNX Runtime
    # raises with the reason when TensorRT was asked for and cannot run; warns when a TensorRT-RTX engine cannot
    choice = select_backend(chosen, settings)
    records = artifact.metadata.get("plugins", ())
    # ONNX Runtime maps the artifact's weights in place while their copy and check go on; every other path reads the
    # module's graph, whose copy must be complete first
    session_graph = artifact.session_model if chosen == "onnxruntime" and not records else None
    # and runs the session graph stored at save time, when it was made for these settings here (not rewritten again)
    prepared = artifact.session_graph(settings) if session_graph is not None and early is None else None
    if session_graph is None:
        artifact.verified()
    if records or chosen == "tensorrt":  # imported only then: the plugin machinery costs 0.3-1 s of imports (sympy)
        from pipeline.runtime.plugins import restore_plugins

        # the torch ops behind plugin nodes, re-imported; TensorRT's plugins registered before the engine is read
        restore_plugins(records, artifact.onnx_model, chosen)
    plan = artifact.metadata.get("segments")
    executor: Executor
    if early is not None:
        executor = early.result()
    elif plan is not None and chosen in ("tensorrt", "tensorrt-rtx"):  # TensorRT segments, ONNX Runtime for the rest
        executor = _segmented(chosen, artifact, Path(path), rebuild, settings, plan, build)
    elif engine is None and chosen in ("tensorrt", "tensorrt-rtx"):
        executor = _builder(build, path, chosen)(chosen, artifact.onnx_model, io, settings)
    else:
        executor = load_executor(
            chosen,
            session_graph or artifact.onnx_model,
            io,
            settings,
            engine=engine,
            runtime_cache=runtime_cache_beside(Path(path)) if chosen == "tensorrt-rtx" else None,
            refit_at_load=bool(artifact.metadata.get("engine", {}).get("refit_at_load", False)) and engine is not None,
            prepared=prepared,
        )
    report: ConversionReport | dict[str, Any] = artifact.metadata["report"]  # read when first asked for
    if chosen == "tensorrt-rtx":  # where its engine runs is this machine's answer, not the converting one's
        from pipeline.runtime.reports.conversion import ConversionReport

        report = dataclasses.replace(
            ConversionReport.from_dict(artifact.metadata["report"]), backend_reason=choice.reason
        )
    return module_class(settings)(executor, io, artifact.onnx_model, settings, report, artifact.weights)


def _builder(build: ExecutorBuilder | None, path: str | Path, backend: str) -> ExecutorBuilder:
    """``build``, or an error saying that building is the conversion layer's."""
    if build is None:
        raise ArtifactError(
            f"{path} must be given a new {backend} engine (rebuild=True, or it holds none), and building is "
            "conversion work the runtime's loader does not do",
            fix="load it with pipeline.load(path, ...), which builds it, or pass "
            "build=pipeline.backends.build_executor",
        )
    return build


def _segmented(
    backend: str,
    artifact: Artifact,
    path: Path,
    rebuild: bool,
    settings: Settings,
    plan: list[dict[str, Any]],
    build: ExecutorBuilder | None,
) -> Executor:
    """The saved segments with their saved engines (checked against this machine as a whole engine is), or with
    engines built anew (``rebuild``)."""
    from pipeline.runtime.segments.executor import PlannedSegment, SegmentedExecutor
    from pipeline.runtime.segments.partition import TENSORRT_SEGMENT

    engines = {} if rebuild else dict(artifact.segment_engines)
    if backend == "tensorrt" and engines:
        first = next(iter(engines.values()))
        _usable_engine(first, artifact.metadata.get("engine", {}), path, rebuild, settings)
    segments = [PlannedSegment.from_json(p) for p in plan]
    if len(engines) < sum(p.kind == TENSORRT_SEGMENT for p in segments):
        build = _builder(build, path, backend)
    return SegmentedExecutor.from_plan(backend, artifact.onnx_model, artifact.io, settings, segments, engines, build)


def _usable_engine(
    engine: bytes | None, built_for: dict[str, str], path: Path, rebuild: bool, settings: Settings
) -> bytes | None:
    """The saved engine if it can run with this TensorRT and GPU; None (build anew) if ``rebuild``."""
    if engine is None or rebuild:
        return None
    from pipeline.runtime.tensorrt.identity import device_identity, engine_mismatch, tensorrt_status

    available, why = tensorrt_status()
    if not available:
        raise ArtifactError(
            f"{path} holds a TensorRT engine but TensorRT cannot run here: {why}",
            fix="load it with backend='onnxruntime' to run its ONNX graph on the CPU",
        )
    mismatch = engine_mismatch(built_for, device_identity(), settings)
    if mismatch is not None:
        raise ArtifactError(
            f"{path} holds an engine that cannot run here: {mismatch}",
            fix="load it with rebuild=True to build a new engine from the saved ONNX graph",
        )
    return engine
