"""The prepacked ONNX Runtime session of a generation step runs merged projections apart
(``pipeline.runtime.ort.projections``): same numbers, one MatMul per part over a Split of the weight, weights read
from the artifact."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from tiny_models import tiny_llama

import pipeline
from passes.model_io.external_data import ort_session_bytes
from pipeline.runtime.ort.projections import split_projections
from pipeline.runtime.ort.session_graph import runnable_model


def test_a_loaded_step_runs_its_projections_apart_with_the_merged_graphs_numbers(tmp_path: Path) -> None:
    model = tiny_llama(seed=4, max_position_embeddings=64, eos_token_id=2, pad_token_id=None)
    ids = torch.randint(1, 90, (1, 5), generator=torch.Generator().manual_seed(3))
    module = pipeline.convert(model, ids, generation={"max_length": 24, "max_batch": 2}, validation_inputs=1)
    module.save(tmp_path / "step.ptrt")
    loaded = pipeline.load(tmp_path / "step.ptrt")
    merged = runnable_model(loaded.onnx, "onnxruntime", loaded.settings)
    count = collections.Counter(n.op_type for n in merged.graph.node)
    assert count["Split"] == 4 and count["MatMul"] == 2 * 4 + 1  # q/k/v and gate/up merged; o, down; the head
    apart = split_projections(merged)
    count = collections.Counter(n.op_type for n in apart.graph.node)
    assert count["MatMul"] == 2 * 7 + 1
    assert merged.graph.initializer[0].data_location == onnx.TensorProto.EXTERNAL  # read from the artifact's file
    names = {i.name for i in apart.graph.initializer}
    splits = [n for n in apart.graph.node if n.op_type == "Split"]  # of the weights now: constants folded at load
    assert len(splits) == 4 and all(n.input[0] in names and n.input[1] in names for n in splits)
    parts = {o for n in splits for o in n.output}
    assert not [n.input[1] for n in apart.graph.node if n.op_type == "MatMul" and n.input[1] not in names | parts]
    # the same logits as the merged graph, on one prompt step
    feed = {
        "input_ids": ids.numpy(),
        "attention_mask": np.pad(np.ones((1, 5), np.int64), ((0, 0), (0, 19))),
        "position_ids": np.arange(5)[None],
        "past_length": np.array(0),
    }
    sessions = []
    for graph in (merged, apart):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        sessions.append(ort.InferenceSession(ort_session_bytes(graph, options, True), options))
    caches = {i.name: np.zeros([1, *i.shape[1:]], np.float32) for i in sessions[0].get_inputs() if "past_key" in i.name}
    logits = [s.run(["logits"], {**feed, **caches})[0] for s in sessions]
    np.testing.assert_allclose(logits[1], logits[0], rtol=1e-5, atol=1e-5)
    # and the loaded module generates as transformers does
    expected = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None)
    assert torch.equal(loaded.generate(ids, max_new_tokens=12, eos_token_id=[]), expected)
