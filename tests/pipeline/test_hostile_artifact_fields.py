"""Artifacts whose metadata lies about their graph, re-hashed so that the manifest agrees (a forger who knows the
format): every field the runtime relies on is compared with the graph on load, and a disagreement is an
ArtifactError naming the field, the metadata's value and the graph's, with a fix. And ``on_first_call(...,
artifact=path)`` that notices an artifact of other weights, and converts once when called from several threads."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from test_hostile_artifacts import rewrite
from tiny_models import tiny_llama
from torch import nn

import pipeline
import pipeline.first_call as first_call
from pipeline.first_call import weights_fingerprint

Members = dict[str, bytes]


def forge(source: Path, target: Path, *, metadata: Callable[[dict], Any] = lambda m: None, graph: Any = None) -> Path:
    """A copy of the artifact with ``metadata`` (and ``graph``, on the ONNX proto) edited, the manifest re-hashed
    (``test_hostile_artifacts.rewrite`` with ``reseal``)."""

    def edit(members: Members) -> None:
        data = json.loads(members["metadata.json"])
        metadata(data)
        members["metadata.json"] = json.dumps(data).encode()
        if graph is not None:
            model = onnx.load_model_from_string(members["model.onnx"])
            graph(model)
            members["model.onnx"] = model.SerializeToString()

    return rewrite(source, target, edit, reseal=True)


def expect_artifact_error(path: Path, *causes: str) -> None:
    with pytest.raises(pipeline.ArtifactError) as info:
        pipeline.load(path)
    text = str(info.value)
    assert all(cause in text for cause in causes) and "fix:" in text, text


@pytest.fixture(scope="module")
def step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cached decoder step: cache of 32 positions, 2 layers, batch up to 2."""
    ids = torch.randint(1, 90, (1, 6), generator=torch.Generator().manual_seed(1))
    module = pipeline.convert(tiny_llama(), ids, generation={"max_length": 32, "max_batch": 2}, validation_inputs=1)
    return module.save(tmp_path_factory.mktemp("step") / "step.ptrt")


@pytest.fixture(scope="module")
def linear(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """input [b, 4] -> out [b, 3], b dynamic in [1, 8]."""
    module = pipeline.convert(
        nn.Linear(4, 3).eval(), torch.randn(2, 4), backend="onnxruntime", dynamic={"input": {0: ("b", 1, 4, 8)}}
    )
    return module.save(tmp_path_factory.mktemp("linear") / "linear.ptrt")


def generation(change: Callable[[dict], Any]) -> Callable[[dict], Any]:
    return lambda m: change(m["settings"]["generation"])


def test_the_step_as_saved_loads_and_generates(step: Path) -> None:
    """The checks refuse no honest artifact: the step loads and decodes within its cache."""
    loaded = pipeline.load(step)
    out = loaded.generate(torch.randint(1, 90, (2, 5)), max_new_tokens=4, eos_token_id=[])
    assert out.shape == (2, 9)


def test_max_length_above_the_graphs_cache(step: Path, tmp_path: Path) -> None:
    """The user's report: max_length 64 over a cache of 32 loaded, then failed inside ONNX Runtime on the attention
    mask. A careful user expects the load to refuse it, saying both sizes."""
    forged = forge(step, tmp_path / "f.ptrt", metadata=generation(lambda g: g.update(max_length=64)))
    expect_artifact_error(forged, "generation.max_length is 64 in metadata.json", "cache holds 32 positions")


def test_fewer_layers_than_the_graph_caches(step: Path, tmp_path: Path) -> None:
    """layers 1 over a graph that caches 2: the loop would feed one layer's cache (ONNX Runtime: a missing input)."""
    forged = forge(step, tmp_path / "f.ptrt", metadata=generation(lambda g: g.update(layers=1)))
    expect_artifact_error(forged, "generation.layers is 1 in metadata.json", "the graph holds 2 cached layer(s)")


def test_max_batch_above_the_declared_batch_range(step: Path, tmp_path: Path) -> None:
    """max_batch 4 where the graph was converted (and a TensorRT profile built) for batches up to 2."""
    forged = forge(step, tmp_path / "f.ptrt", metadata=generation(lambda g: g.update(max_batch=4)))
    expect_artifact_error(forged, "generation.max_batch is 4 in metadata.json", "'batch' [1, 2] on 'input_ids' axis 0")


def test_max_batch_other_than_the_graphs_fixed_batch(step: Path, tmp_path: Path) -> None:
    """A graph that fixes its batch at 1 (and metadata consistent with it but for max_batch 2): a batch of 2 prompts
    would reach ONNX Runtime. The load names the fixed batch."""

    def fix_batch(m: dict) -> None:
        m["settings"]["dynamic"] = [d for d in m["settings"]["dynamic"] if d["name"] != "batch"]
        for spec in [*m["io"]["inputs"], *m["io"]["outputs"]]:
            spec[2][:1] = [1] if spec[2] else []

    def fix_graph_batch(model: onnx.ModelProto) -> None:
        for value in [*model.graph.input, *model.graph.output]:
            dims = value.type.tensor_type.shape.dim
            if len(dims):
                dims[0].dim_value = 1

    forged = forge(step, tmp_path / "f.ptrt", metadata=fix_batch, graph=fix_graph_batch)
    expect_artifact_error(forged, "generation.max_batch is 2 in metadata.json", "the graph fixes the batch at 1")


def test_pad_token_outside_the_graphs_vocabulary(step: Path, tmp_path: Path) -> None:
    """The pad token is fed back to the step for finished rows: 96 over a vocabulary of 96 would fail in a Gather."""
    forged = forge(step, tmp_path / "f.ptrt", metadata=generation(lambda g: g.update(pad_token_id=96)))
    expect_artifact_error(forged, "generation.pad_token_id is 96 in metadata.json", "vocabulary [0, 96)")


def test_generation_settings_over_a_graph_that_is_no_step(linear: Path, tmp_path: Path) -> None:
    """generation= in the settings makes pipeline.load return a GenerativeModule: over a plain graph, refused."""
    forged = forge(linear, tmp_path / "f.ptrt", metadata=lambda m: m["settings"].update(generation={"max_length": 8}))
    expect_artifact_error(forged, "settings.generation in metadata.json", "lacks the step input(s) input_ids")


def test_output_size_other_than_the_graphs(linear: Path, tmp_path: Path) -> None:
    """The output spec sizes the buffers and the module's answers: 5 where the graph fixes 3 is refused."""
    forged = forge(linear, tmp_path / "f.ptrt", metadata=lambda m: m["io"]["outputs"][0][2].__setitem__(1, 5))
    expect_artifact_error(forged, "output 'out' axis 1 is 5 in metadata.json, 3 in the graph")


@pytest.mark.parametrize(
    ("dim", "cause"),
    [
        ({"input": "ghost", "axis": 0}, "but the graph has no input 'ghost'"),
        ({"input": "input", "axis": 2}, "but the graph has no such input axis (the input has 2)"),
    ],
    ids=["no-such-input", "axis-beyond-rank"],
)
def test_dynamic_dimension_the_graph_lacks(linear: Path, tmp_path: Path, dim: dict, cause: str) -> None:
    """A declared dynamic dimension must be an axis of a graph input (the range check and the TensorRT profiles
    read it)."""
    extra = {"name": "d", "min": 1, "opt": 2, "max": 4, "multiple": 1, **dim}
    forged = forge(linear, tmp_path / "f.ptrt", metadata=lambda m: m["settings"]["dynamic"].append(extra))
    expect_artifact_error(forged, "dynamic dimension 'd'", cause)


def test_block_size_other_than_the_graphs_blocks(tmp_path: Path) -> None:
    """An INT4 artifact whose settings say blocks of 64 over weights quantized in blocks of 32."""
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    module = pipeline.convert(
        model, torch.randn(2, 64), precision="int4", block_size=32, keep_head=False, backend="onnxruntime"
    )
    saved = module.save(tmp_path / "int4.ptrt")
    forged = forge(saved, tmp_path / "f.ptrt", metadata=lambda m: m["settings"].update(block_size=64))
    expect_artifact_error(forged, "block_size is 64 in metadata.json", "4-bit weights are in blocks of 32")


# on_first_call(..., artifact=path)


def same_shape(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)).eval()


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts on_first_call's conversions."""
    made: list[int] = []
    convert = first_call.convert

    def counted(*args: Any, **kwargs: Any) -> pipeline.ConvertedModule:
        made.append(1)
        return convert(*args, **kwargs)

    monkeypatch.setattr(first_call, "convert", counted)
    return made


def test_fingerprint_follows_every_weight() -> None:
    """Same weights, same fingerprint; one weight changed by one step, another one."""
    a, b = same_shape(0), same_shape(0)
    assert weights_fingerprint(a) == weights_fingerprint(b)
    bias = b.get_parameter("2.bias")
    with torch.no_grad():
        bias[1] = torch.nextafter(bias[1], torch.tensor(2.0))
    assert weights_fingerprint(a)["sha256"] != weights_fingerprint(b)["sha256"]


def test_artifact_of_other_weights_is_converted_again(
    tmp_path: Path, conversions: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """Model B (the architecture of A, other weights) given A's artifact: a careful user expects B's answers, a
    WARNING naming the artifact, and the artifact overwritten with B's conversion (loaded next time, no warning)."""
    path, x = tmp_path / "m.ptrt", torch.randn(3, 4)
    a, b = same_shape(0), same_shape(1)
    pipeline.on_first_call(a, artifact=path)(x)
    with caplog.at_level(logging.WARNING, logger="pipeline.first_call"):
        got = pipeline.on_first_call(b, artifact=path)(x)
    torch.testing.assert_close(got, b(x))
    assert f"the artifact at {path} was converted from other weights" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pipeline.first_call"):
        torch.testing.assert_close(pipeline.on_first_call(b, artifact=path)(x), b(x))
    assert conversions == [1, 1] and not caplog.text  # A's, B's; the third loaded B's artifact


def test_artifact_without_fingerprint_is_converted_again(
    tmp_path: Path, conversions: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """An artifact saved by ConvertedModule.save (no fingerprint): it may hold other weights, so it is converted
    again with a WARNING rather than trusted."""
    path, x, model = tmp_path / "m.ptrt", torch.randn(3, 4), same_shape(0)
    pipeline.convert(same_shape(1), x).save(path)
    with caplog.at_level(logging.WARNING, logger="pipeline.first_call"):
        torch.testing.assert_close(pipeline.on_first_call(model, artifact=path)(x), model(x))
    assert f"the artifact at {path} records no fingerprint" in caplog.text and conversions == [1]


def test_four_threads_at_once_convert_once(tmp_path: Path, conversions: list[int]) -> None:
    """Four threads call a fresh on_first_call module at the same moment: one conversion, every answer right."""
    model = same_shape(2)
    wrapped = pipeline.on_first_call(model, artifact=tmp_path / "m.ptrt", dynamic={"input": {0: ("b", 1, 4, 8)}})
    inputs = [torch.randn(i + 1, 4) for i in range(4)]
    answers: dict[int, torch.Tensor] = {}
    start = threading.Barrier(4)

    def call(i: int) -> None:
        start.wait()
        answers[i] = wrapped(inputs[i])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert conversions == [1] and len(wrapped.conversions) == 1
    for i, x in enumerate(inputs):
        torch.testing.assert_close(answers[i], model(x))
