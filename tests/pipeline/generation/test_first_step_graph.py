"""An encoder-decoder whose decoder decides in Python on its cache's length: the first step gets a graph of its own.

ProphetNet's decoder builds its masks and relative position buckets at the first step only (``if cache_length !=
0``) and, after it, turns the cache's length into its position with ``int()``. One step graph exported over an empty
cache holds the first step's branch only; the conversion sees that export decided sizes from the sample's values,
exports the step again after one token, finds the two decided otherwise and keeps the first step's graph beside the
step's (``module.first_step``); ``int()`` of the cache's length stays symbolic in the model's code while exporting
(:func:`~pipeline.generation.seq2seq.symbolic_int`), so that the later step's graph holds every length. A small
ProphetNet then decodes a right-padded batch of two as ``model.generate`` does (greedy tokens, every step's scores,
4 beams), saved and loaded too; the graph over an empty cache alone (the step before this) does not.

One conversion, for TensorRT-RTX when it imports (its real builder builds the three graphs; they run on ONNX Runtime
beside the engines), else for ONNX Runtime. Nothing is downloaded."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers imports it
import torch
import transformers
from model_sources.transformers_models import shrunk_config
from tiny_models import converted_for_rtx_when_it_imports, decodes_as_transformers, drawn_by_fan_in, greedy_scores

import pipeline
from pipeline.generation.seq2seq import symbolic_int
from pipeline.runtime.generation.encoder_decoder import EncoderDecoderModule
from pipeline.runtime.generation.source_and_step import FIRST_STEP_FILE

GENERATION = {"max_length": 16, "max_batch": 8}
GREEDY: dict[str, Any] = {"max_new_tokens": 6, "do_sample": False, "num_beams": 1}


def prophetnet() -> tuple[Any, dict[str, torch.Tensor]]:
    """A small ProphetNet (one encoder and one decoder layer, width 32, 2 heads, vocabulary 128) and two sources, the
    second 2 tokens shorter (right-padded)."""
    sizes = {"num_encoder_layers": 1, "num_decoder_layers": 1, "num_encoder_attention_heads": 2}
    config = shrunk_config("prophetnet", {**sizes, "num_decoder_attention_heads": 2, "use_cache": True})
    model = drawn_by_fan_in(transformers.ProphetNetForConditionalGeneration(config))
    ids = torch.randint(4, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return model, {"input_ids": ids.masked_fill(mask == 0, config.pad_token_id), "attention_mask": mask}


@pytest.fixture(scope="module")
def converted() -> tuple[Any, dict[str, torch.Tensor], EncoderDecoderModule]:
    model, inputs = prophetnet()
    module = converted_for_rtx_when_it_imports(model, inputs, GENERATION)
    assert isinstance(module, EncoderDecoderModule)
    return model, inputs, module


def test_the_first_step_has_a_graph_of_its_own_and_decodes_as_transformers(
    converted: tuple[Any, dict[str, torch.Tensor], EncoderDecoderModule], tmp_path: Path
) -> None:
    model, inputs, module = converted
    assert module.first_step is not None
    if module.backend == "tensorrt-rtx":  # the real builder built every graph
        assert all(part.engine_bytes for part in (module.encoder, module.decoder, module.first_step))
    expected, _ = decodes_as_transformers(model, module, inputs, **GREEDY)
    assert len(set(expected.flatten().tolist())) > 2  # tokens that vary: a decoding that could go wrong
    module.save(tmp_path / "prophetnet")
    assert (tmp_path / "prophetnet" / FIRST_STEP_FILE).is_file()
    loaded = pipeline.load(tmp_path / "prophetnet", backend="onnxruntime")
    assert isinstance(loaded, EncoderDecoderModule) and loaded.first_step is not None
    assert torch.equal(loaded.generate(**inputs, **GREEDY), expected)


def test_the_graph_over_an_empty_cache_alone_holds_the_first_step_only(
    converted: tuple[Any, dict[str, torch.Tensor], EncoderDecoderModule],
) -> None:
    """The one graph the step was before: exported over an empty cache, run for every step."""
    model, inputs, module = converted
    assert module.first_step is not None
    alone = EncoderDecoderModule(module.encoder, module.first_step)
    _, expected_scores = greedy_scores(model.generate, inputs, **GREEDY)
    _, scores = greedy_scores(alone.generate, inputs, **GREEDY)
    assert float((scores[0] - expected_scores[0]).abs().max()) < 1e-3  # its own step
    assert float((scores[1:] - expected_scores[1:]).abs().max()) > 1e-2  # the first step's branch at every later one


class _Positions(torch.nn.Module):
    """A position from the cache's length as a Python number (``int()``), as ProphetNet's decoder computes it."""

    def forward(self, length: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        past = length.item()
        torch._check(past >= 0)
        torch._check(past < 64)
        return ids + torch.ones((1, 1), dtype=torch.int64) * int(past + 2)


def test_int_of_the_cache_length_stays_symbolic_in_the_models_code_while_exporting() -> None:
    model, ids = _Positions(), torch.zeros(2, 3, dtype=torch.int64)
    with symbolic_int(model):
        program = torch.export.export(model, (torch.tensor(1), ids))
    assert "int" not in vars(sys.modules[__name__])  # the model's module is as it was after the block
    assert torch.equal(program.module()(torch.tensor(7), ids), ids + 9)  # not the sample's length, 1
