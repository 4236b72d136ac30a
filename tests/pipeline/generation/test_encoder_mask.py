"""An encoder whose states are not its input's positions returns its own mask over them (Moonshine's over the frames
it keeps of a padded waveform, UDOP's over merged image and text), and its decoder reads that mask as the
cross-attention mask. The encoder graph returns it too (``encoder_attention_mask``), and the runtime hands the step
the encoder's mask rather than the request's: a padded batch of two waveforms decodes as ``model.generate`` does
(before, the request's mask over samples was refused: "the mask over its states is the model's own"), and
TensorRT-RTX's builder builds both graphs. A tiny Moonshine from the every-type source's small config, its matrices
drawn wider; nothing is downloaded."""

from __future__ import annotations

import importlib.util

import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers imports it
import torch
import transformers
from model_sources.transformers_models import shrunk_config
from tiny_models import converted_for_rtx_when_it_imports, drawn_by_fan_in

from pipeline.runtime.generation.encoder_decoder import ENCODER_MASK

GREEDY = {"max_new_tokens": 8, "do_sample": False, "num_beams": 1}


def test_a_padded_batch_of_waveforms_decodes_through_the_encoders_own_mask() -> None:
    config = shrunk_config("moonshine", {"use_cache": True})
    torch.manual_seed(0)
    model = drawn_by_fan_in(transformers.MoonshineForConditionalGeneration(config))
    model.generation_config.eos_token_id = None
    waveforms = torch.randn(2, 4000, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 4000, dtype=torch.int64)
    mask[1, 2500:] = 0  # the second waveform is shorter: padded with zeros, as the feature extractor pads
    inputs = {"input_values": waveforms.masked_fill(mask == 0, 0.0), "attention_mask": mask}
    with torch.no_grad():
        states = model.get_encoder()(**inputs).attention_mask
        expected = model.generate(**inputs, **GREEDY)
    assert states.shape[1] < mask.shape[1] and not bool(states.all())  # fewer states, some of them masked
    # not validated: the decodings are compared here; for TensorRT-RTX where it imports (its builder on both graphs)
    module = converted_for_rtx_when_it_imports(model, inputs, {"max_length": 16, "max_batch": 2})
    assert ENCODER_MASK in [spec.name for spec in module.encoder.io.outputs]
    if importlib.util.find_spec("tensorrt_rtx") is not None:
        assert module.encoder.engine_bytes and module.decoder.engine_bytes
    assert torch.equal(module.generate(**inputs, **GREEDY), expected)
    unmasked = {**inputs, "attention_mask": torch.ones_like(mask)}  # the padding read as audio: other tokens
    with torch.no_grad():
        read_as_audio = model.generate(**unmasked, **GREEDY)
    assert not torch.equal(read_as_audio, expected)  # the mask reaches the decoder
    assert torch.equal(module.generate(**unmasked, **GREEDY), read_as_audio)
