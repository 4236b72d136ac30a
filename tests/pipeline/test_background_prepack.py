"""A float32 generation step's prepacked ONNX Runtime session is made in a background thread
(:mod:`pipeline.runtime.ort.prepacking`): a module runs on the unprepacked session of the same graph from the moment
it is loaded (or converted), and on the prepacked one once it is ready, with the same tokens; a failed build is a
BuildError at the next call; concurrent requests across the switch get their own tokens; the interpreter exits
cleanly during a build. Real conversions, real artifacts, real ONNX Runtime sessions.

The build is held back for some tests by a gate before the real ``InferenceSession`` is made, so that "before the
prepacked session is ready" is certain rather than a race with a build of a few milliseconds.
"""

from __future__ import annotations

import dataclasses
import gc
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from tiny_models import tiny_llama

import pipeline
from passes.model_io.external_data import ort_session_bytes
from pipeline.runtime.artifact import Artifact
from pipeline.runtime.artifact_reading import read_artifact
from pipeline.runtime.ort import executor as executor_module
from pipeline.runtime.ort.aliased_cache import AliasedCacheSession, cache_pairs
from pipeline.runtime.ort.executor import OnnxRuntimeExecutor
from pipeline.runtime.ort.prepacking import PrepackingSession

ROOT = Path(__file__).resolve().parents[2]
CAPACITY = 32
PROMPTS = [torch.randint(1, 90, (1, 4 + i), generator=torch.Generator().manual_seed(10 + i)) for i in range(4)]
NEW = 12


@pytest.fixture(scope="module")
def llama() -> transformers.LlamaForCausalLM:
    return tiny_llama(seed=5, max_position_embeddings=64)


def convert(llama: transformers.LlamaForCausalLM, **settings: Any) -> Any:
    ids = torch.randint(1, 90, (1, 6), generator=torch.Generator().manual_seed(1))
    generation = {"max_length": CAPACITY, "max_batch": 2}
    return pipeline.convert(llama, ids, generation=generation, validate=False, **settings)


@pytest.fixture(scope="module")
def step(llama: transformers.LlamaForCausalLM) -> Any:
    return convert(llama)


@pytest.fixture(scope="module")
def saved(step: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return step.save(tmp_path_factory.mktemp("llama") / "llama.ptrt")


@pytest.fixture(scope="module")
def expected(step: Any, llama: transformers.LlamaForCausalLM) -> list[torch.Tensor]:
    """The converted module's greedy tokens for each prompt, which are transformers' tokens."""
    tokens = [step.generate(p, max_new_tokens=NEW, eos_token_id=[]) for p in PROMPTS]
    first = llama.generate(PROMPTS[0], max_new_tokens=NEW, do_sample=False, eos_token_id=None)
    assert torch.equal(tokens[0], first)
    return tokens


def step_inputs(ids: torch.Tensor) -> list[torch.Tensor]:
    """One call of the step on a prompt over an empty cache: its flat inputs."""
    mask = torch.ones(1, CAPACITY, dtype=torch.int64)
    past = [torch.zeros(1, 2, CAPACITY, 16) for _ in range(4)]
    return [ids, mask, torch.arange(ids.shape[1])[None], torch.tensor(0), *past]


def prepacking(module: Any) -> PrepackingSession:
    """The module's prepacking session: its ONNX Runtime executor's, or that of the executor running a TensorRT-RTX
    engine's graph on ONNX Runtime where the engine cannot run."""
    executor = getattr(module.executor, "onnxruntime", module.executor)
    assert isinstance(executor, OnnxRuntimeExecutor) and isinstance(executor.session, PrepackingSession)
    return executor.session


@pytest.fixture
def stored(saved: Path) -> Iterator[tuple[onnx.ModelProto, Artifact]]:
    """The artifact's stored session graph (reading the artifact's weights in place), for sessions made here."""
    artifact = read_artifact(saved)
    graph = artifact.session_graph(artifact.settings)
    assert graph is not None
    yield graph, artifact  # the artifact's weights directory lives while it does


def session_of(graph: onnx.ModelProto, prepack: bool, entries: dict[str, str] | None = None) -> Any:
    """A real session of ``graph``, as the executor makes it (the grouped-attention cache aliased)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    for key, value in (entries or {}).items():
        options.add_session_config_entry(key, value)
    if entries:  # two threads, so that the thread options apply (the test workers' sessions default to one)
        options.intra_op_num_threads = 2
    session = ort.InferenceSession(ort_session_bytes(graph, options, prepack), options)
    return AliasedCacheSession(session, cache_pairs(graph))


def gated(graph: onnx.ModelProto, gate: threading.Event, entries: dict[str, str] | None = None) -> PrepackingSession:
    """The executor's two sessions of ``graph``, the prepacked one made only once ``gate`` is set."""

    def build() -> Any:
        assert gate.wait(60)
        return session_of(graph, True, entries)

    return PrepackingSession(session_of(graph, False), build)


def test_a_loaded_step_generates_the_converted_tokens_before_and_after_the_prepacked_session_is_ready(
    saved: Path, expected: list[torch.Tensor], stored: tuple[onnx.ModelProto, Artifact]
) -> None:
    loaded = pipeline.load(saved)
    session = prepacking(loaded)  # what a load makes: the unprepacked session now, the prepacked one in a thread
    assert loaded.executor.stored_graph and not session._thread.daemon  # type: ignore[attr-defined]
    assert torch.equal(loaded.generate(PROMPTS[0], max_new_tokens=NEW, eos_token_id=[]), expected[0])
    assert session.wait(60) and session.ready
    assert torch.equal(loaded.generate(PROMPTS[0], max_new_tokens=NEW, eos_token_id=[]), expected[0])
    # the same, with the build held back: the first requests certainly run unprepacked, and the request slot's
    # runner (its IOBinding, its cache buffers) carries over to the prepacked session
    gate = threading.Event()
    fresh = pipeline.load(saved)
    prepacking(fresh).wait(60)
    fresh.executor.session = switching = gated(stored[0], gate)  # type: ignore[attr-defined]
    before = [fresh.generate(p, max_new_tokens=NEW, eos_token_id=[]) for p in PROMPTS]
    assert not switching.ready
    gate.set()
    assert switching.wait(60)
    after = [fresh.generate(p, max_new_tokens=NEW, eos_token_id=[]) for p in PROMPTS]
    for got_before, got_after, want in zip(before, after, expected, strict=True):
        assert torch.equal(got_before, want) and torch.equal(got_after, want)
    # a batch of two rows (prefill and decode at batch 2) on both sessions
    batch = torch.cat([PROMPTS[0], PROMPTS[0]])
    assert torch.equal(fresh.generate(batch, max_new_tokens=NEW, eos_token_id=[]), expected[0].expand(2, -1))


def test_a_converted_step_also_prepacks_in_the_background_with_the_same_numbers(step: Any, saved: Path) -> None:
    """A converted module's executor is made the same way (its graph rewritten, the merged projections unprepacked
    first, apart once prepacked); one call's logits and cache agree with the loaded module's."""
    assert prepacking(step).wait(60)
    loaded = pipeline.load(saved)
    assert prepacking(loaded).wait(60)
    inputs = step_inputs(PROMPTS[3])
    for got, want in zip(loaded.run_flat(inputs), step.run_flat(inputs), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_failed_background_build_is_a_build_error_at_the_next_call(
    saved: Path, stored: tuple[onnx.ModelProto, Artifact]
) -> None:
    """The prepacked session's build fails for real (an option ONNX Runtime rejects when it makes the session): the
    next generate, and every one after, is a BuildError naming the cause and the fix; never a raw ONNX Runtime
    error, never a silent run on the unprepacked session."""
    loaded = pipeline.load(saved)
    prepacking(loaded).wait(60)
    gate = threading.Event()
    broken = gated(stored[0], gate, {"session.intra_op_thread_affinities": "not-a-processor"})
    loaded.executor.session = broken  # type: ignore[attr-defined]
    loaded.generate(PROMPTS[0], max_new_tokens=2, eos_token_id=[])  # before the build ends: runs unprepacked
    gate.set()
    with pytest.raises(pipeline.BuildError, match="Processor id"):
        broken.wait(60)
    for _ in range(2):
        with pytest.raises(pipeline.BuildError, match="prepacked session") as raised:
            loaded.generate(PROMPTS[0], max_new_tokens=2, eos_token_id=[])
        assert "ort_prepack_weights=False" in str(raised.value) and "Processor id" in str(raised.value)
    with pytest.raises(pipeline.BuildError, match="prepacked session"):
        loaded.run_flat(step_inputs(PROMPTS[0]))


@pytest.mark.parametrize("backend", [None, "tensorrt-rtx"])
def test_a_module_dropped_during_its_build_keeps_its_weights_until_the_build_ends(
    saved: Path, step: Any, monkeypatch: pytest.MonkeyPatch, backend: str | None
) -> None:
    """The real load's own build, held back just before ONNX Runtime reads the weights: the module dropped (and
    collected) meanwhile leaves its weights directory in place, the build then succeeds (before the fix its session
    found the directory gone: "External data path does not exist") and computes the converted numbers; the directory
    goes once the session is dropped too. Also for a TensorRT-RTX engine, which cannot run here: its graph's ONNX
    Runtime session is built in the background too (before its fix, CI printed that error at the end of a run)."""
    if backend is not None:
        pytest.importorskip("tensorrt_rtx")
    gate, reached = threading.Event(), threading.Event()
    original = executor_module.ort_session_bytes

    def held_back(graph: onnx.ModelProto, options: Any, prepack: bool) -> Any:
        if prepack:
            reached.set()
            assert gate.wait(60)
        return original(graph, options, prepack)

    monkeypatch.setattr(executor_module, "ort_session_bytes", held_back)
    loaded = pipeline.load(saved, backend=backend)
    session = prepacking(loaded)
    weights = loaded._weights.directory  # type: ignore[union-attr]
    try:
        assert reached.wait(60) and any(weights.iterdir())
        del loaded
        gc.collect()
        assert weights.is_dir() and not session.ready
    finally:
        gate.set()
    assert session.wait(60)  # a failed build raises here
    inputs = step_inputs(PROMPTS[2])
    feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs, strict=True)}
    logits = session.run(None, feed)[0]
    torch.testing.assert_close(torch.from_numpy(logits), step.run_flat(inputs)[0], rtol=1e-5, atol=1e-5)
    del session
    gc.collect()
    assert not weights.exists()


def test_concurrent_requests_across_the_switch_get_their_own_tokens(
    saved: Path, expected: list[torch.Tensor], stored: tuple[onnx.ModelProto, Artifact]
) -> None:
    """Four threads generate while the prepacked session is built, and a stream is advanced across the switch: each
    request gets the tokens it gets alone."""
    loaded = pipeline.load(saved)
    prepacking(loaded).wait(60)
    gate = threading.Event()
    switching = gated(stored[0], gate)
    loaded.executor.session = switching  # type: ignore[attr-defined]
    stream = loaded.stream(PROMPTS[1], max_new_tokens=NEW, eos_token_id=[])
    streamed = [int(next(stream)) for _ in range(4)]  # these four before the switch
    results: list[torch.Tensor | None] = [None] * len(PROMPTS)
    errors: list[BaseException] = []

    def serve(i: int) -> None:
        try:
            for _ in range(3):  # some before the gate opens, some after
                results[i] = loaded.generate(PROMPTS[i], max_new_tokens=NEW, eos_token_id=[])
        except BaseException as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    assert not switching.ready
    gate.set()
    assert switching.wait(60)
    streamed += [int(token) for token in stream]  # the rest after it
    for thread in threads:
        thread.join(120)
    assert not errors
    for got, want in zip(results, expected, strict=True):
        assert got is not None and torch.equal(got, want)
    assert streamed == expected[1][0, PROMPTS[1].shape[1] :].tolist()


def test_the_settings_say_which_sessions_there_are(llama: transformers.LlamaForCausalLM, step: Any) -> None:
    """``ort_prepack_weights=False``: one unprepacked session, nothing built in the background.
    ``ort_row_session=True``: the unprepacked session every call runs on until the switch stays for single-row
    decode steps after it. Same tokens either way."""
    want = step.generate(PROMPTS[2], max_new_tokens=NEW, eos_token_id=[])
    plain = convert(llama, ort_prepack_weights=False)
    assert not isinstance(plain.executor.session, PrepackingSession)
    assert plain.executor.session.get_session_options().get_session_config_entry("session.disable_prepacking") == "1"
    assert torch.equal(plain.generate(PROMPTS[2], max_new_tokens=NEW, eos_token_id=[]), want)
    settings = dataclasses.replace(step.settings, ort_row_session=True)
    executor = OnnxRuntimeExecutor(step.onnx, step.io, settings)
    assert isinstance(executor.session, PrepackingSession)
    row = executor.row_session()
    assert row is not None
    assert executor.session.wait(60) and executor.session.current() is not row and executor.row_session() is row
    rows = convert(llama, ort_row_session=True)
    assert torch.equal(rows.generate(PROMPTS[2], max_new_tokens=NEW, eos_token_id=[]), want)


EXIT_DURING_BUILD = """
import gc, sys, threading, time
sys.path.insert(0, {root!r})
sys.path.insert(0, {tests!r})
import tests_environment
import onnxruntime as ort
import pipeline
from passes.model_io.external_data import ort_session_bytes
from pipeline.runtime.artifact_reading import read_artifact
from pipeline.runtime.ort.prepacking import PrepackingSession

module = pipeline.load({path!r})
if {held}:  # a build held back until the module is gone and the main thread returns
    session = module.executor.session
    session.wait(60)
    artifact = read_artifact({path!r})
    graph = artifact.session_graph(artifact.settings)
    gone = threading.Event()

    def build():
        gone.wait(5)
        time.sleep(0.2)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        made = ort.InferenceSession(ort_session_bytes(graph, options, True), options)
        print("built", flush=True)
        return made

    module.executor.session = PrepackingSession(session.current(), build)
    del module, session
    gc.collect()
    gone.set()
print("exiting", flush=True)
"""


@pytest.mark.parametrize("held", [False, True])
def test_the_interpreter_exits_cleanly_during_a_build(saved: Path, held: bool) -> None:
    """The interpreter exiting right after a load, or with the module dropped while its prepacked session is still
    being made: no crash (a daemon thread inside ONNX Runtime at exit aborts the process: "terminate called without
    an active exception"), no hang; the build finishes first."""
    code = EXIT_DURING_BUILD.format(root=str(ROOT), tests=str(ROOT / "tests"), path=str(saved), held=held)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == (["exiting", "built"] if held else ["exiting"]), done.stdout
    assert "terminate" not in done.stderr
