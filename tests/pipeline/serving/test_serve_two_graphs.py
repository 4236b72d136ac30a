"""An encoder-decoder's and a vision-language model's saved directories served by a real Triton Inference Server
(`pipeline.serve`) and exported as a portable repository (`export_triton`) that the real server loads: each request
(the encoder's inputs; the prompt with its images) streams the tokens the module's own ``generate`` gives.

Tiny BART and LLaVA with random weights wide enough that their greedy tokens vary, built from configs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import torch
import transformers
from tiny_models import lively

import pipeline
from pipeline.serving.export import export_triton
from pipeline.serving.repository_check import LOADED, check_repository

grpc = pytest.importorskip("tritonclient.grpc", reason="the serve extra (tritonclient) is not installed")
from triton_streams import stream  # noqa: E402

GENERATION = {"max_length": 32, "max_batch": 2}
IMAGE = 127


def bart() -> Any:
    config = transformers.BartConfig(
        vocab_size=96, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
    )  # fmt: skip
    return lively(lambda: transformers.BartForConditionalGeneration(config), seed=3, std=0.5, keep_eos=False)


def llava() -> Any:
    tower = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    text = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
    )  # fmt: skip
    vision = transformers.CLIPVisionConfig(**tower, image_size=32, patch_size=8)
    config = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE)
    return lively(lambda: transformers.LlavaForConditionalGeneration(config), seed=0, std=0.3, keep_eos=False)


def requests() -> dict[str, dict[str, torch.Tensor]]:
    source = torch.randint(4, 96, (2, 7), generator=torch.Generator().manual_seed(5))
    source_mask = torch.ones_like(source)
    source_mask[1, 5:] = 0
    prompt = torch.randint(3, 100, (1, 20), generator=torch.Generator().manual_seed(0))
    prompt[0, 2:18] = IMAGE  # one image: its 16 tokens
    return {
        "bart": {"input_ids": source.masked_fill(source_mask == 0, 1), "attention_mask": source_mask},
        "llava": {
            "input_ids": prompt,
            "attention_mask": torch.ones_like(prompt),
            "pixel_values": torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1)),
        },
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("two_graphs")
    sample = requests()
    paths = {"bart": root / "bart", "llava": root / "llava"}
    for name, model in (("bart", bart()), ("llava", llava())):
        pipeline.convert(model, sample[name], generation=GENERATION, validate=False).save(paths[name])
    return paths


@pytest.fixture(scope="module")
def expected(saved: dict[str, Path]) -> dict[str, np.ndarray]:
    """The new tokens of each module's own greedy ``generate``."""
    sample, tokens = requests(), {}
    for name, path in saved.items():
        sequences = pipeline.load(path).generate(**sample[name], max_new_tokens=8)
        start = 1 if name == "bart" else sample[name]["input_ids"].shape[1]  # BART: after the start token
        tokens[name] = sequences[:, start:].numpy()
    return tokens


@pytest.fixture(scope="module")
def server(saved: dict[str, Path]) -> Iterator[pipeline.TritonServer]:
    with pipeline.serve(saved, threads=1, spinning=False, http_port=0, grpc_port=0, metrics_port=0) as running:
        yield running


@pytest.mark.parametrize("model", ["bart", "llava"])
def test_a_request_streams_the_tokens_of_generate(server: Any, expected: dict[str, np.ndarray], model: str) -> None:
    tokens, errors = stream(server.grpc_url, model, requests()[model], max_new_tokens=8)
    assert errors == []
    np.testing.assert_array_equal(tokens, expected[model])
    assert len(np.unique(tokens)) >= 3  # the decoding is worth comparing


def test_the_configs_take_what_each_module_takes(server: Any) -> None:
    client = grpc.InferenceServerClient(server.grpc_url)
    for model, wanted in (
        ("bart", {"input_ids": "TYPE_INT64", "attention_mask": "TYPE_INT64", "decoder_input_ids": "TYPE_INT64"}),
        ("llava", {"input_ids": "TYPE_INT64", "attention_mask": "TYPE_INT64", "pixel_values": "TYPE_FP32"}),
    ):
        config = client.get_model_config(model, as_json=True)["config"]
        assert {i["name"]: i["data_type"] for i in config["input"]} == wanted
        assert [bool(i.get("optional")) for i in config["input"]] == [False, True, True]
        assert config["model_transaction_policy"]["decoupled"]


def test_a_bad_request_fails_alone_with_the_modules_error(server: Any, expected: dict[str, np.ndarray]) -> None:
    inputs = dict(requests()["llava"])
    inputs["pixel_values"] = inputs["pixel_values"][:, :, :16]  # not the size the tower was converted for
    tokens, errors = stream(server.grpc_url, "llava", inputs, max_new_tokens=4)
    assert tokens.size == 0 and len(errors) == 1 and "pixel_values" in errors[0]
    tokens, errors = stream(server.grpc_url, "llava", requests()["llava"], max_new_tokens=8)
    assert errors == [] and np.array_equal(tokens, expected["llava"])


def test_export_triton_copies_the_directory_and_the_real_server_loads_it(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    repository = tmp_path / "repository"
    for name, path in saved.items():
        export = export_triton(path, repository)
        assert [m.name for m in export.models] == [name]
        copied = repository / name / "1" / name
        assert sorted(p.name for p in copied.iterdir()) == sorted(p.name for p in path.iterdir())
    checked = check_repository(repository)
    assert {m.name: m.verdict for m in checked.models} == {"bart": LOADED, "llava": LOADED}
