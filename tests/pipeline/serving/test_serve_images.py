"""Vision-language models whose images are not placed at an image token, served by a real Triton Inference Server
(`pipeline.serve`) and exported (`export_triton`): Llama 3.2 Vision (Mllama), whose text cross-attends to its images
(its saved directory holds an image graph and a step, as an encoder-decoder's does), and Kosmos-2, whose images go
where its processor's ``image_embeds_position_mask`` marks them. Each request holds what the processor gives (the
prompt, its per-token image input, the pixels) and streams the tokens the module's own ``generate`` gives.

Tiny models with random weights and their processors, saved locally and converted once (:mod:`image_prompts_support`,
shared with the CLI's tests)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from google.protobuf import text_format
from image_prompts_support import ImageModel, image_model

import pipeline
from pipeline.serving.export import export_triton

grpc = pytest.importorskip("tritonclient.grpc", reason="the serve extra (tritonclient) is not installed")
from triton_streams import stream  # noqa: E402
from tritonclient.grpc import model_config_pb2  # noqa: E402

NEW = 6
#: each model's request inputs: the prompt, then what the processor gives besides it
REQUESTS = {
    "mllama": ["input_ids", "attention_mask", "pixel_values", "aspect_ratio_mask", "aspect_ratio_ids",
               "cross_attention_mask"],
    "kosmos2": ["input_ids", "attention_mask", "pixel_values", "image_embeds_position_mask"],
}  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ImageModel]:
    return {kind: image_model(kind, tmp_path_factory.getbasetemp()) for kind in REQUESTS}


@pytest.fixture(scope="module")
def server(models: dict[str, ImageModel]) -> Iterator[pipeline.TritonServer]:
    served = {kind: made.converted for kind, made in models.items()}
    with pipeline.serve(served, threads=1, spinning=False, http_port=0, grpc_port=0, metrics_port=0) as running:
        yield running


def generated(made: ImageModel, inputs: dict[str, torch.Tensor], **options: Any) -> np.ndarray:
    """The new tokens of the module's own ``generate``."""
    sequences = pipeline.load(made.converted).generate(**inputs, max_new_tokens=NEW, **options)
    return sequences[:, inputs["input_ids"].shape[1] :].numpy()


def test_mllamas_padded_batch_streams_the_tokens_of_generate(server: Any, models: dict[str, ImageModel]) -> None:
    inputs = models["mllama"].inputs()
    assert inputs["attention_mask"][0, 0] == 0  # the shorter prompt is left-padded
    tokens, errors = stream(server.grpc_url, "mllama", inputs, max_new_tokens=NEW)
    expected = generated(models["mllama"], inputs)
    assert errors == []
    np.testing.assert_array_equal(tokens, expected)
    assert len(np.unique(tokens)) >= 4  # the decoding is worth comparing


def test_kosmos2_streams_the_tokens_of_generate_greedy_and_sampled(server: Any, models: dict[str, ImageModel]) -> None:
    """Greedy, then sampled with a seed (the tiny Kosmos-2's greedy tokens soon repeat; its draws vary)."""
    inputs = models["kosmos2"].inputs()
    tokens, errors = stream(server.grpc_url, "kosmos2", inputs, max_new_tokens=NEW)
    assert errors == []
    np.testing.assert_array_equal(tokens, generated(models["kosmos2"], inputs))
    sampled = {"do_sample": True, "seed": 7, "top_k": 20}
    tokens, errors = stream(server.grpc_url, "kosmos2", inputs, max_new_tokens=NEW, **sampled)
    assert errors == []
    np.testing.assert_array_equal(tokens, generated(models["kosmos2"], inputs, **sampled))
    assert len(np.unique(tokens)) >= 4


def test_the_configs_take_what_the_processors_give(server: Any) -> None:
    client = grpc.InferenceServerClient(server.grpc_url)
    for model, names in REQUESTS.items():
        config = client.get_model_config(model, as_json=True)["config"]
        assert [i["name"] for i in config["input"]] == names
        assert [bool(i.get("optional")) for i in config["input"]] == [False] + [True] * (len(names) - 1)
        assert {i["data_type"] for i in config["input"] if i["name"] != "pixel_values"} == {"TYPE_INT64"}


def test_a_request_without_the_image_marks_fails_alone_with_the_modules_error(
    server: Any, models: dict[str, ImageModel]
) -> None:
    inputs = models["kosmos2"].inputs(rows=1)
    unmarked = {name: value for name, value in inputs.items() if name != "image_embeds_position_mask"}
    tokens, errors = stream(server.grpc_url, "kosmos2", unmarked, max_new_tokens=2)
    assert tokens.size == 0 and len(errors) == 1 and "needs image_embeds_position_mask" in errors[0]
    tokens, errors = stream(server.grpc_url, "kosmos2", inputs, max_new_tokens=2)
    assert errors == [] and tokens.shape == (1, 2)


def test_export_triton_writes_the_same_request(models: dict[str, ImageModel], tmp_path: Path) -> None:
    """The portable repository holds the directory and a config whose request is the served one (the real server
    loads such a repository: ``test_serve_two_graphs.py``)."""
    for kind, made in models.items():
        export = export_triton(made.converted, tmp_path, name=kind)
        assert [m.name for m in export.models] == [kind]
        copied = tmp_path / kind / "1" / made.converted.name
        assert sorted(p.name for p in copied.iterdir()) == sorted(p.name for p in made.converted.iterdir())
        config = text_format.Parse((tmp_path / kind / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
        assert [i.name for i in config.input] == REQUESTS[kind]
        assert config.model_transaction_policy.decoupled
