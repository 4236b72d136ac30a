"""SpeechT5 (speech to text): a waveform through a convolutional feature encoder (group-normalised, 7 strided
convolutions), a grouped positional convolution and a Transformer encoder whose every layer's cross-attention keys and
values are the encoder graph's outputs. Its float32 is ill-conditioned: PyTorch float32 is up to 1.7e-5 from PyTorch
float64 on those outputs here (values of RMS ~1.4; ~5e-5 in the family sweep's model), beyond the fixed atol of 1e-5,
so validation judges them against PyTorch's own error (:mod:`pipeline.accuracy.anchor`). The conversion must validate
and be about as accurate as PyTorch float32 itself: against the float64 answer on every validation input, the encoder
graph's RMS error is 0.52-0.96x PyTorch float32's on an Intel machine (0.33-0.72x in the sweep's model), 1.1-1.95x on
an AMD EPYC, where the fixed tolerance holds and no anchor is needed. Then it decodes as transformers does
(greedy tokens, every step's scores within 1e-3, 4 beams). One conversion serves every test."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers imports it
import torch
import transformers
from tiny_models import decodes_as_transformers, greedy_scores

import pipeline
from pipeline.accuracy import anchoring
from pipeline.runtime.generation.encoder_decoder import EncoderDecoderModule

GENERATION = {"max_length": 24, "max_batch": 8}
GREEDY: dict[str, Any] = {"max_new_tokens": 10, "do_sample": False}


def speecht5() -> transformers.SpeechT5ForSpeechToText:
    """A tiny SpeechT5 (width 32, 2 layers each side; the feature encoder transformers' default, 7 convolutions of 512
    channels: the source of float32's error), its matrices and kernels drawn with standard deviation 1.5 / sqrt(fan-in)
    (the family sweep's rule), eval mode."""
    config = transformers.SpeechT5Config(
        vocab_size=96, hidden_size=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, conv_dim=[512] * 7,
        num_conv_pos_embeddings=32, num_conv_pos_embedding_groups=4, max_text_positions=64,
    )  # fmt: skip
    torch.manual_seed(0)  # the biases transformers draws
    model = transformers.SpeechT5ForSpeechToText(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                fan_in = parameter[0].numel()
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 1.5 / fan_in**0.5)
    return model.eval()


@pytest.fixture(scope="module")
def converted() -> tuple[Any, dict[str, torch.Tensor], EncoderDecoderModule, list[dict[str, Any]]]:
    """The model, two waveforms of 0.2 s (16 kHz), the validated conversion, and what validation compared on each
    input of the encoder graph: the feed, ours and PyTorch float32's outputs, and the anchor runs that can give
    PyTorch's float64 answer on it."""
    model = speecht5()
    inputs = {"input_values": torch.randn(2, 3200, generator=torch.Generator().manual_seed(1))}
    compared: list[dict[str, Any]] = []
    tolerances = anchoring.Anchoring.tolerances

    def recorded(self: anchoring.Anchoring, feed: Any, actual: Any, expected: Any) -> Any:
        if any(name.startswith("cross.") for name in self.judged):  # the encoder graph's comparison
            compared.append({"feed": dict(feed), "ours": dict(actual), "torch": dict(expected), "runs": self.runs})
        return tolerances(self, feed, actual, expected)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(anchoring.Anchoring, "tolerances", recorded)
        module = pipeline.convert(model, inputs, generation=GENERATION, validate=True)
    assert isinstance(module, EncoderDecoderModule)
    return model, inputs, module, compared


def test_the_encoder_graph_validates_and_is_as_accurate_as_pytorch_float32(
    converted: tuple[Any, dict[str, torch.Tensor], EncoderDecoderModule, list[dict[str, Any]]],
) -> None:
    _, _, module, compared = converted
    report = module.encoder.report.accuracy
    assert report is not None and report.passed
    cross = [o for o in report.outputs if o.name.startswith("cross.")]
    assert len(cross) == 4 and all(o.passed and o.outside == 0 for o in cross)
    # where PyTorch float32's own error exceeds the fixed atol, the anchored rule judged, and the note says so (the
    # case this file is about: on an Intel machine it does; on an AMD EPYC's kernels the fixed atol held everywhere)
    assert all(("PyTorch's own error" in o.note) == (o.atol_used > o.atol) for o in cross), [o.note for o in cross]
    assert len(compared) == report.inputs >= 4
    ratios = []
    for seen in compared:
        exact = seen["runs"].outputs("float32", seen["feed"])  # PyTorch with every float32 op in float64
        assert exact is not None
        for o in cross:
            ours, theirs = (np.asarray(seen[side][o.name], np.float64) for side in ("ours", "torch"))
            answer = np.asarray(exact[o.name], np.float64)
            rms = float(np.sqrt(np.mean(np.square(theirs - answer))))
            assert rms > 0  # float32 rounding is there to compare with
            ratios.append(float(np.sqrt(np.mean(np.square(ours - answer)))) / rms)
    # the graph about as close to the exact answer as PyTorch float32, on every input and output, in RMS (not one
    # element's luck): 0.52-0.96x on an Intel machine, 1.1-1.95x on an AMD EPYC (where PyTorch's own kernels are the
    # closer), the anchored rule's 2x in RMS. A graph that loses precision (an op in a lower type, a cancelling rewrite)
    # is orders of magnitude further
    assert max(ratios) <= 2.5, sorted(ratios)[-4:]


def test_greedy_scores_and_beams_equal_transformers(
    converted: tuple[Any, dict[str, torch.Tensor], EncoderDecoderModule, list[dict[str, Any]]],
) -> None:
    """Greedy tokens and beams equal, every step's scores (all 96 of them) within 1e-3. A tiny random SpeechT5 repeats
    one token (the family sweep's: 2 distinct tokens), so what shows the audio reaching the decoder is the scores:
    another waveform moves them, in transformers and in ours alike."""
    model, inputs, module, _ = converted
    expected, expected_scores = decodes_as_transformers(model, module, inputs, **GREEDY)
    other = {"input_values": inputs["input_values"].flip(-1)}
    theirs, their_scores = greedy_scores(model.generate, other, **GREEDY)
    ours, our_scores = greedy_scores(module.generate, other, **GREEDY)
    assert torch.equal(ours, theirs) and float((our_scores - their_scores).abs().max()) < 1e-3
    steps = min(len(their_scores), len(expected_scores))
    assert float((their_scores[:steps] - expected_scores[:steps]).abs().max()) > 0.05  # the audio reaches the logits
