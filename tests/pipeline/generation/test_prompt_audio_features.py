"""A features method that also takes the prompt (:mod:`pipeline.generation.prompt_features`): MusicFlamingo's
``get_audio_features(input_features, input_features_mask, input_ids)`` times each audio window by its index within its
run of audio tokens. The features graph gives each audio's features in a prompt of its own; a tiny MusicFlamingo then
decodes a left-padded batch of two prompts (one run of audio tokens each) as ``model.generate`` does: greedy tokens,
every step's scores, 4 beams; TensorRT-RTX's real builder builds both graphs (one conversion: for TensorRT-RTX when it
imports, its graphs run on ONNX Runtime beside the engines), and the module saved and loaded decodes so. A prompt whose
one run of audio tokens holds two audios (where transformers gives the second other features) is refused, at the
conversion and at run time."""

from __future__ import annotations

from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers imports it
import torch
import transformers
from tiny_models import (
    TINY_TEXT,
    converted_for_rtx_when_it_imports,
    decodes_its_audio_as_transformers,
    drawn_by_fan_in,
)

import pipeline
from converters.errors import InputError
from pipeline.runtime.generation.vision_language import VisionLanguageModule

GENERATION = {"max_length": 40, "max_batch": 8}
GREEDY: dict[str, Any] = {"max_new_tokens": 6, "do_sample": False}
AUDIO_TOKEN = 127
MELS, FRAMES = 8, 32  # the tower takes 2 x max_source_positions frames: 16 positions, pooled by 2 to 8 features
FEATURES = 8


def music_flamingo() -> Any:
    """A tiny MusicFlamingo, its weights drawn by fan-in."""
    torch.manual_seed(0)
    audio = transformers.AudioFlamingo3EncoderConfig(
        num_mel_bins=MELS,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        hidden_size=16,
        max_source_positions=FRAMES // 2,
    )
    config = transformers.MusicFlamingoConfig(
        audio_config=audio, text_config=transformers.Qwen2Config(**TINY_TEXT), audio_token_id=AUDIO_TOKEN
    )
    return drawn_by_fan_in(transformers.MusicFlamingoForConditionalGeneration(config))


def batch(one_run: bool = False) -> dict[str, torch.Tensor]:
    """Two prompts of text around each one's 8 audio tokens, the second left-padded by 2, and their audios; with
    ``one_run``, the first prompt holds both audios as one run of 16 audio tokens and the second none."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 100, (2, 8 + 2 * FEATURES), generator=generator)
    mask = torch.ones_like(ids)
    if one_run:
        ids[0, 2 : 2 + 2 * FEATURES] = AUDIO_TOKEN
    else:
        ids[:, 2 : 2 + FEATURES] = AUDIO_TOKEN
        ids[1, :2], mask[1, :2] = 0, 0
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "input_features": torch.randn(2, MELS, FRAMES, generator=torch.Generator().manual_seed(2)),
        "input_features_mask": torch.ones(2, FRAMES, dtype=torch.long),
    }


@pytest.fixture(scope="module")
def converted() -> tuple[Any, VisionLanguageModule]:
    model = music_flamingo()
    module = converted_for_rtx_when_it_imports(model, batch(), GENERATION)
    assert isinstance(module, VisionLanguageModule)
    return model, module


def test_music_flamingo_decodes_as_transformers(converted: tuple[Any, VisionLanguageModule]) -> None:
    model, module = converted
    assert "input_ids" in transformers.MusicFlamingoForConditionalGeneration.get_audio_features.__code__.co_varnames
    assert [spec.name for spec in module.vision.io.inputs] + list(module.fixed_inputs) == [
        "input_features",
        "input_features_mask",
    ]
    decodes_its_audio_as_transformers(model, module, batch(), **GREEDY)


def test_tensorrt_rtx_builds_both_graphs(converted: tuple[Any, VisionLanguageModule]) -> None:
    pytest.importorskip("tensorrt_rtx")
    _, module = converted
    assert module.vision.engine_bytes and module.step.engine_bytes


def test_a_run_holding_two_audios_is_refused_also_when_saved_and_loaded(
    converted: tuple[Any, VisionLanguageModule], tmp_path: Any
) -> None:
    """transformers gives the second audio of a run other features (its window index within the run is 1), which the
    graph (each audio first in its run) does not give: the module refuses the prompt, loaded from disk too, and
    decodes the batch of one run per audio as before."""
    model, module = converted
    inputs, joined = batch(), batch(one_run=True)
    with torch.no_grad():
        alone = model.get_audio_features(
            inputs["input_features"], inputs["input_features_mask"], inputs["input_ids"]
        ).pooler_output
        in_one_run = model.get_audio_features(
            joined["input_features"], joined["input_features_mask"], joined["input_ids"]
        ).pooler_output
    assert torch.equal(alone[:FEATURES], in_one_run[:FEATURES]) and not torch.allclose(alone, in_one_run)
    module.save(tmp_path / "music_flamingo")
    loaded = pipeline.load(tmp_path / "music_flamingo")
    for each in (module, loaded):
        with pytest.raises(InputError, match=r"a run of 16 audio tokens \(127\) in prompt 0 holds .* audio 0 to 1"):
            each.generate(**joined, **GREEDY)
    with torch.no_grad():
        assert torch.equal(loaded.generate(**inputs, **GREEDY), model.generate(**inputs, **GREEDY))


def test_a_sample_whose_run_holds_two_audios_is_refused_at_the_conversion() -> None:
    """On the sample, the audios' features each in a prompt of its own are not the method's on the sample's prompt:
    the conversion says so before converting anything."""
    with pytest.raises(InputError, match=r"get_audio_features takes the prompt \(input_ids\): .* apart"):
        pipeline.convert(music_flamingo(), batch(one_run=True), generation=GENERATION)


def test_count_checks_are_set_aside_in_the_converting_thread_only() -> None:
    """transformers' count check is off for the features call in the converting thread, on in any other thread
    meanwhile (transformers' own switch is process-wide), and restored after."""
    import threading

    from transformers.models.musicflamingo import modeling_musicflamingo as modeling

    from pipeline.generation.prompt_features import _count_checks_off

    def fails() -> str:
        try:
            modeling.torch_compilable_check(False, "count check")
        except ValueError:
            return "raised"
        return "skipped"

    original = modeling.torch_compilable_check
    elsewhere: list[str] = []
    with _count_checks_off():
        here = fails()
        other = threading.Thread(target=lambda: elsewhere.append(fails()))
        other.start()
        other.join()
    assert (here, elsewhere, fails()) == ("skipped", ["raised"], "raised")
    assert modeling.torch_compilable_check is original
