"""Loading time: why a loaded artifact's ONNX Runtime session is not cached across processes, and what a load does
instead (Python's garbage collector paused while it runs).

An ONNX Runtime session of a 226 MB Llama step costs 0.3 s of CPU, 0.25 s of it prepacking the ``MatMul`` weights.
ONNX Runtime 1.32 cannot skip that for a saved model (the test below); the rest, its graph optimizations, a cache of
the optimized graph did skip (commit d1102e6), saving 0.02-0.03 s per load for 1 s of CPU to build each entry, and was
taken out. Real models, real artifacts, real sessions."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import pipeline

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
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
    model, ids = LlamaForCausalLM(config).eval(), torch.randint(0, 128, (1, 6))
    module = pipeline.convert(model, ids, generation={"max_length": 32, "max_batch": 2}, validate=False)
    return module.save(tmp_path_factory.mktemp("llama") / "llama.ptrt")


def test_the_collector_is_restored_after_a_load(artifact: Path) -> None:
    assert gc.isenabled()
    module = pipeline.load(artifact)
    assert gc.isenabled()
    assert module.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2).shape == (1, 5)
    with pytest.raises(pipeline.ArtifactError):
        pipeline.load(artifact.with_name("missing.ptrt"))  # a failed load too
    assert gc.isenabled()
    gc.disable()
    try:
        pipeline.load(artifact)
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


COUNT_COLLECTIONS = """
import sys, gc
sys.path.insert(0, sys.argv[1])
import tests_environment, torch, pipeline
started, given_back = [], []
gc.callbacks.append(lambda phase, info: started.append(info["generation"]) if phase == "start" else None)
enable = gc.enable
gc.enable = lambda: (given_back.append(len(started)), enable())[1]  # the count when the load gives the collector back
pipeline.load(sys.argv[2])
print(len(given_back), given_back[0] if given_back else len(started))
"""


def test_a_load_in_a_fresh_process_runs_no_collection_until_it_gives_the_collector_back(artifact: Path) -> None:
    """With torch imported, the collector walks some 170,000 objects at each full collection; a load (its imports
    above all) triggered about 30 collections, one of them full: 0.15 s of CPU. Now none while the load runs: counted
    when the load calls ``gc.enable``. After that, collections are whoever allocates next: a float32 step's prepacked
    session is still being made in a thread of its own when the load returns, and counting up to the return
    counted 1 here and 2 in three full-suite CI runs (ci109, ci110 and stop 61's), never reproduced alone."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    done = subprocess.run(
        [sys.executable, "-c", COUNT_COLLECTIONS, str(ROOT), str(artifact)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    given_back, collections = map(int, done.stdout.split())
    assert given_back == 1  # the load paused the collector and gave it back once
    assert collections == 0  # 24 when the load does not pause it


def test_onnx_runtime_packs_saved_prepacked_weights_again(tmp_path: Path) -> None:
    """Why no cache keeps prepacked weights: ONNX Runtime (1.32) saves them
    (``session.save_external_prepacked_constant_initializers``), but a session that loads them packs the plain
    weights again, and uses the saved copy only when the packed bytes hash the same: the saved copy saves memory, not
    time. Shown by zeroing the plain weights after saving: the loaded session computes with zeros. If a later release
    uses the saved copy as it is, this fails, and a cache of prepacked weights is worth measuring again."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])],
        [weight],
    )
    source = tmp_path / "matmul.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), source)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "saved.onnx")
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "saved.onnx.data")
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    options.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    saved = onnx.load(str(tmp_path / "saved.onnx"), load_external_data=False)
    (tensor,) = [t for t in saved.graph.initializer if t.name == "w"]
    fields = {e.key: e.value for e in tensor.external_data}
    assert any(key.startswith("prepacked") for key in fields), "the packed copy is saved beside the plain weight"
    with open(tmp_path / "saved.onnx.data", "r+b") as data:
        data.seek(int(fields["offset"]))
        data.write(b"\0" * int(fields["length"]))  # the plain weight only; the packed copy is left as it was
    loading = ort.SessionOptions()
    loading.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(tmp_path / "saved.onnx"), loading, providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": np.ones((4, 256), np.float32)})
    assert not y.any()  # packed again from the zeroed plain weight
