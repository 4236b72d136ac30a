"""What makes loading a generation artifact fast, checked as behaviour (the times are benchmarks/bench_load.py's):

- the artifact stores ONNX Runtime's session graph (``session.onnx``, :mod:`pipeline.runtime.ort.stored_graph`),
  which a load runs instead of rewriting the graph again, with the same numbers; an artifact without it (written
  before, or whose fingerprint is another machine's) is rewritten at load, as before;
- the prepacked session's merged projections are apart through a ``Split`` of the weight that ONNX Runtime folds
  (:mod:`pipeline.runtime.ort.projections`), not copied out at every load: bit for bit the copied parts' numbers;
- a load imports neither the graph rewrites nor the decoding loop.

Real models, real artifacts, real ONNX Runtime sessions.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx.external_data_helper import ExternalDataInfo
from torch import nn

import pipeline
from passes.model_io.external_data import ALIGNMENT, external_tensors, ort_session_bytes
from pipeline.runtime.artifact import DATA_MEMBER, MANIFEST_MEMBER, METADATA_MEMBER, SESSION_MEMBER
from pipeline.runtime.artifact_reading import read_artifact
from pipeline.runtime.mapped_zip import aligned_member
from pipeline.runtime.ort.aliased_cache import AliasedCacheSession, cache_pairs
from pipeline.runtime.ort.executor import OnnxRuntimeExecutor
from pipeline.runtime.ort.projections import split_projections
from pipeline.runtime.ort.session_graph import runnable_model

ROOT = Path(__file__).resolve().parents[2]
CAPACITY = 32


@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def step(llama: torch.nn.Module) -> pipeline.ConvertedModule:
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    return pipeline.convert(llama, ids, generation={"max_length": CAPACITY, "max_batch": 2}, validate=False)


@pytest.fixture(scope="module")
def saved(step: pipeline.ConvertedModule, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return step.save(tmp_path_factory.mktemp("llama") / "llama.ptrt")


PROMPTS = torch.tensor([[0, 5, 9, 17, 33, 2], [4, 8, 15, 16, 23, 42]])
MASK = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])  # a left-padded row


def greedy(module: pipeline.ConvertedModule) -> torch.Tensor:
    return module.generate(PROMPTS, attention_mask=MASK, max_new_tokens=12, eos_token_id=[])  # type: ignore[operator]


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def rewritten(source: Path, target: Path, edit: Callable[[dict[str, bytes]], None]) -> Path:
    """A copy of the artifact with ``edit`` applied to its members, its weights member aligned as the writer aligns
    it and the manifest sealed again (what an artifact written by another version looks like)."""
    contents = members(source)
    edit(contents)
    contents.pop(MANIFEST_MEMBER)
    data = contents.pop(DATA_MEMBER)
    digests = {DATA_MEMBER: hashlib.sha256(data).hexdigest()}
    with open(target, "wb") as handle, zipfile.ZipFile(handle, "w") as archive:
        with archive.open(aligned_member(DATA_MEMBER, handle.tell(), ALIGNMENT), "w", force_zip64=True) as out:
            out.write(data)
        for name, blob in contents.items():
            archive.writestr(name, blob)
            digests[name] = hashlib.sha256(blob).hexdigest()
        manifest = json.loads(members(source)[MANIFEST_MEMBER])
        archive.writestr(MANIFEST_MEMBER, json.dumps({"format": manifest["format"], "sha256": digests}))
    return target


def edit_metadata(change: Callable[[dict], None]) -> Callable[[dict[str, bytes]], None]:
    def edit(contents: dict[str, bytes]) -> None:
        metadata = json.loads(contents[METADATA_MEMBER])
        change(metadata)
        contents[METADATA_MEMBER] = json.dumps(metadata).encode()

    return edit


def runs_stored_graph(module: pipeline.ConvertedModule) -> bool:
    executor = module.executor
    assert isinstance(executor, OnnxRuntimeExecutor)
    return executor.stored_graph


def test_a_generation_artifact_stores_its_session_graph_reading_the_same_weights(saved: Path) -> None:
    """``session.onnx`` is the grouped-attention graph with the merged projections apart, every weight of it read
    from ``model.onnx.data`` where ``model.onnx`` reads it: the artifact holds no weight twice."""
    contents = members(saved)
    record = json.loads(contents[METADATA_MEMBER])["session_graph"]
    assert record["member"] == SESSION_MEMBER and len(record["key"]) == 64
    session = onnx.load_model_from_string(contents[SESSION_MEMBER])
    graph = onnx.load_model_from_string(contents["model.onnx"])
    ops = Counter(n.op_type for n in session.graph.node)
    assert ops["GroupQueryAttention"] == 2 and ops["SkipSimplifiedLayerNormalization"] > 0
    assert not any(n.op_type == "Attention" for n in session.graph.node)
    weights = {t.name: ExternalDataInfo(t) for t in external_tensors(graph)}
    shared = list(external_tensors(session))
    assert shared and all(t.name in weights for t in shared)
    for tensor in shared:
        info, original = ExternalDataInfo(tensor), weights[tensor.name]
        assert (info.location, info.offset, info.length) == (DATA_MEMBER, original.offset, original.length)
    inline = [t for t in session.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    assert all(len(t.raw_data) < 1024 for t in inline)  # what the rewrite adds: sizes, shapes, small constants


def test_loading_runs_the_stored_graph_with_the_converted_modules_numbers(
    step: pipeline.ConvertedModule, saved: Path
) -> None:
    loaded = pipeline.load(saved)
    assert runs_stored_graph(loaded)
    assert not runs_stored_graph(step)  # a converted module makes its graph
    assert torch.equal(greedy(loaded), greedy(step))
    inputs = [PROMPTS, MASK.new_ones(2, CAPACITY), torch.arange(6).expand(2, 6), torch.tensor(0)]
    past = [torch.zeros(2, 2, CAPACITY, 8) for _ in range(4)]
    for got, expected in zip(loaded.run_flat(inputs + past), step.run_flat(inputs + past), strict=True):
        assert torch.equal(got, expected)  # one call: the logits and the whole cache
    threads = pipeline.load(saved, threads=1, spinning=True)  # the thread choices are not part of the graph
    assert runs_stored_graph(threads)
    assert torch.equal(greedy(threads), greedy(step))


def test_an_artifact_without_a_stored_graph_is_rewritten_at_load_with_the_same_numbers(
    step: pipeline.ConvertedModule, saved: Path, tmp_path: Path
) -> None:
    """An artifact written before session graphs were stored: no ``session.onnx``, no metadata entry."""

    def drop(contents: dict[str, bytes]) -> None:
        del contents[SESSION_MEMBER]
        edit_metadata(lambda metadata: metadata.pop("session_graph"))(contents)

    old = rewritten(saved, tmp_path / "old.ptrt", drop)
    loaded = pipeline.load(old)
    assert not runs_stored_graph(loaded)
    assert torch.equal(greedy(loaded), greedy(step))
    again = loaded.save(tmp_path / "again.ptrt")  # saving it again stores the graph
    assert SESSION_MEMBER in members(again) and runs_stored_graph(pipeline.load(again))


def test_a_stored_graph_made_for_another_runtime_is_not_run(
    step: pipeline.ConvertedModule, saved: Path, tmp_path: Path
) -> None:
    """A fingerprint that is not this machine's (another ONNX Runtime, other rewriting code): the graph is rewritten
    at load, and the numbers are the same."""
    other = rewritten(saved, tmp_path / "other.ptrt", edit_metadata(lambda m: m["session_graph"].update(key="0" * 64)))
    loaded = pipeline.load(other)
    assert not runs_stored_graph(loaded)
    assert torch.equal(greedy(loaded), greedy(step))


def test_the_session_made_while_the_graph_is_checked_yields_to_the_checks(saved: Path, tmp_path: Path) -> None:
    """The session of a stored graph is made in a thread while the rest of the artifact is checked: an artifact that
    fails the checks (here an I/O spec that is not the graph's, which the session would refuse too) is the checks'
    ArtifactError, and no session is left being made behind it."""

    def rename(metadata: dict) -> None:
        metadata["io"]["inputs"][0][0] = "tokens"

    other = rewritten(saved, tmp_path / "renamed.ptrt", edit_metadata(rename))
    with pytest.raises(pipeline.ArtifactError, match="tokens"):
        pipeline.load(other)
    assert not [t for t in threading.enumerate() if t.name == "artifact-session"]


def test_a_stored_graph_pointing_outside_the_weights_is_refused(saved: Path, tmp_path: Path) -> None:
    def outside(contents: dict[str, bytes]) -> None:
        session = onnx.load_model_from_string(contents[SESSION_MEMBER])
        tensor = next(iter(external_tensors(session)))
        for entry in tensor.external_data:
            if entry.key == "offset":
                entry.value = str(len(contents[DATA_MEMBER]))
        contents[SESSION_MEMBER] = session.SerializeToString()

    with pytest.raises(pipeline.ArtifactError, match="points outside model.onnx.data"):
        read_artifact(rewritten(saved, tmp_path / "outside.ptrt", outside))


def test_a_tampered_stored_graph_is_caught_by_the_manifest(saved: Path, tmp_path: Path) -> None:
    contents = members(saved)
    contents[SESSION_MEMBER] = contents[SESSION_MEMBER].replace(b"GroupQueryAttention", b"GroupQueryAttentioN")
    forged = tmp_path / "forged.ptrt"
    with zipfile.ZipFile(forged, "w") as archive:
        for name, blob in contents.items():
            archive.writestr(name, blob)
    with pytest.raises(pipeline.ArtifactError, match="session.onnx does not match its SHA-256"):
        pipeline.load(forged)


def test_a_module_whose_session_runs_its_graph_as_it_is_stores_none(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    x = torch.randn(3, 16)
    module = pipeline.convert(model, x, backend="onnxruntime", validate=False)
    path = module.save(tmp_path / "mlp.ptrt")
    contents = members(path)
    assert SESSION_MEMBER not in contents and "session_graph" not in json.loads(contents[METADATA_MEMBER])
    loaded = pipeline.load(path)
    assert not runs_stored_graph(loaded)
    assert torch.equal(loaded(x), module(x))


def _session(graph: onnx.ModelProto, optimized: Path | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(ort_session_bytes(graph, options, True), options, providers=["CPUExecutionProvider"])


def test_the_weights_split_gives_the_merged_numbers_and_is_folded(
    step: pipeline.ConvertedModule, tmp_path: Path
) -> None:
    """The merged projections apart through a ``Split`` of the weight: ONNX Runtime folds it into the parts (no
    ``Split`` left in its optimized graph: nothing is sliced per call), and a prefill and a decode step of a
    left-padded batch give the merged graph's numbers (the same products, in other GEMM calls)."""
    runnable = runnable_model(step.onnx, "onnxruntime", step.settings)
    split = split_projections(runnable)
    assert (
        Counter(n.op_type for n in split.graph.node)["MatMul"]
        > Counter(n.op_type for n in runnable.graph.node)["MatMul"]
    )
    assert not any(i.name.startswith("ort_split_projection") and len(i.dims) == 2 for i in split.graph.initializer)
    _session(split, tmp_path / "optimized.onnx")
    assert not any(n.op_type == "Split" for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node)
    sessions = [AliasedCacheSession(_session(g), cache_pairs(g)) for g in (split, runnable)]
    feed: dict[str, np.ndarray] = {
        "input_ids": PROMPTS.numpy(),
        "attention_mask": np.pad(MASK.numpy(), ((0, 0), (0, CAPACITY - 6))),
        "position_ids": np.array([[0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5]]),
        "past_length": np.array(0),
    }
    for i in range(2):
        for kind in ("key", "value"):
            feed[f"past_key_values.{i}.{kind}"] = np.zeros((2, 2, CAPACITY, 8), np.float32)
    names = [o.name for o in sessions[0].get_outputs()]
    outputs = [s.run(names, feed) for s in sessions]
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(*outputs, strict=True))
    step_feed = dict(feed, input_ids=np.array([[7], [9]]), position_ids=np.array([[5], [6]]), past_length=np.array(6))
    step_feed["attention_mask"][:, 6] = 1
    for i in range(2):
        for kind in ("key", "value"):
            step_feed[f"past_key_values.{i}.{kind}"] = outputs[0][names.index(f"present.{i}.{kind}")]
    decoded = [s.run(names, step_feed) for s in sessions]
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(*decoded, strict=True))


IMPORTS_OF_A_LOAD = """
import sys
sys.path.insert(0, sys.argv[1])
import tests_environment, torch, pipeline
module = pipeline.load(sys.argv[2])
loaded = set(sys.modules)
module.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2)
print(" ".join(sorted(loaded)))
print(" ".join(sorted(set(sys.modules) - loaded)))
"""


def test_a_load_imports_neither_the_rewrites_nor_the_decoding_loop(saved: Path) -> None:
    """A fresh process that loads the generation artifact has not imported the graph rewrites (graph-surgeon, the
    emulations, the INT8 and attention rewrites: a stored graph is run) nor the decoding loop; its first generate
    imports the loop."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS_OF_A_LOAD, str(ROOT), str(saved)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    at_load, at_generate = (set(line.split()) for line in done.stdout.strip().splitlines()[-2:])
    rewrites = {
        "onnx_graphsurgeon",
        "pipeline.runtime.ort.session_graph",
        "pipeline.runtime.ort.int8",
        "pipeline.runtime.ort.emulation",
        "pipeline.runtime.ort.grouped_attention",
        "pipeline.runtime.ort.skip_norm",
    }  # (pipeline.runtime.ort.projections: the prepacked session's split, 5 ms in its background build)
    assert not rewrites & at_load
    loop = {"pipeline.runtime.generation.beam_search", "pipeline.runtime.generation.request"}
    assert not loop & at_load and loop <= at_generate
