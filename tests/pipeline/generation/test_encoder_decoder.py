"""Encoder-decoders (``convert(seq2seq_model, inputs, generation=...)``) judged against transformers' own
``model.generate`` on tiny random models of three kinds: BART (learned positions, a right-padded batch: the encoder's
padding is the cross-attention mask), T5 (relative position buckets: an additive bias in the step's attention) and
Whisper (``input_features``, no cross-attention mask). Greedy and beam-search sequences token-identical, every greedy
step's scores within 1e-3, transformers' output classes, the model's generation config (forced eos) applied, a saved
and loaded directory, and the errors a caller meets."""

from __future__ import annotations

import stat
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from tiny_models import answers_from_threads, lively, mixed_requests, requests_wait_for_slots

import pipeline
from converters.errors import ArtifactError, InputError
from converters.files import current_umask
from pipeline.cli.convert import generate_command
from pipeline.runtime.generation.encoder_decoder import DECODER_FILE, ENCODER_FILE, EncoderDecoderModule

GENERATION = {"max_length": 24, "max_batch": 8}
SIZES = {"vocab_size": 96, "d_model": 32}


@pytest.fixture(scope="module")
def bart() -> transformers.BartForConditionalGeneration:
    layers = {"encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4}
    ffn = {"encoder_ffn_dim": 48, "decoder_ffn_dim": 48, "max_position_embeddings": 64}
    config = transformers.BartConfig(**SIZES, **layers, **ffn)
    return lively(lambda: transformers.BartForConditionalGeneration(config), seed=3, std=0.5)


@pytest.fixture(scope="module")
def source() -> dict[str, torch.Tensor]:
    """Two sources of 7 and 5 tokens, the second right-padded (as BART's tokenizer pads)."""
    ids = torch.randint(4, 96, (2, 7), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 1), "attention_mask": mask}


@pytest.fixture(scope="module")
def bart_module(bart: torch.nn.Module, source: dict[str, torch.Tensor]) -> EncoderDecoderModule:
    # not validated here (the tests compare it with the model themselves); T5's and Whisper's conversions validate
    module = pipeline.convert(bart, source, generation=GENERATION, validate=False)
    assert isinstance(module, EncoderDecoderModule)
    return module


def varied(sequences: torch.Tensor) -> None:
    """The decoding is worth comparing: several distinct tokens, one row at least changing its token twice."""
    assert len(set(sequences.flatten().tolist())) >= 4, sequences
    assert any(len(set(row.tolist())) >= 3 for row in sequences), sequences


def test_bart_greedy_sequences_and_scores_equal_transformers(
    bart: torch.nn.Module, bart_module: EncoderDecoderModule, source: dict[str, torch.Tensor]
) -> None:
    options = {"max_new_tokens": 12, "return_dict_in_generate": True, "output_scores": True}
    theirs = bart.generate(**source, do_sample=False, **options)
    ours = bart_module.generate(**source, **options)
    assert type(ours).__name__ == type(theirs).__name__ == "GenerateEncoderDecoderOutput"
    assert torch.equal(ours.sequences, theirs.sequences)
    varied(ours.sequences)
    assert bart.generation_config.forced_eos_token_id is not None  # the model's default, applied as transformers does
    for mine, reference in zip(ours.scores, theirs.scores, strict=True):
        finite = torch.isfinite(reference)
        assert torch.equal(finite, torch.isfinite(mine))
        scale = float(reference[finite].abs().max())  # 1e-3 of the step's score range
        torch.testing.assert_close(mine[finite], reference[finite], rtol=1e-3, atol=1e-3 * max(scale, 1.0))


@pytest.mark.parametrize(
    "options",
    [
        {"num_beams": 4},
        {"num_beams": 4, "num_return_sequences": 2, "length_penalty": 0.6},
        {"num_beams": 3, "no_repeat_ngram_size": 2, "repetition_penalty": 1.3, "early_stopping": True},
    ],
)
def test_bart_beam_search_equals_transformers(
    bart: torch.nn.Module, bart_module: EncoderDecoderModule, source: dict[str, torch.Tensor], options: dict
) -> None:
    theirs = bart.generate(**source, do_sample=False, max_new_tokens=12, **options)
    ours = bart_module.generate(**source, max_new_tokens=12, **options)
    assert torch.equal(ours, theirs), (ours, theirs)
    varied(ours)


def test_the_decoders_cache_stays_in_bound_buffers_on_onnx_runtime(
    bart_module: EncoderDecoderModule, source: dict[str, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step writes its cache in place in ``IOBinding`` buffers (no copy in and out per step); the copying form a
    TensorRT engine uses gives the same beams."""
    from pipeline.runtime.generation import encoder_decoder
    from pipeline.runtime.generation.runners import OrtBoundRunner

    runners: list[object] = []
    kept = encoder_decoder.bound_runner
    monkeypatch.setattr(encoder_decoder, "bound_runner", lambda *a: runners.append(kept(*a)) or runners[-1])
    options = {"max_new_tokens": 10, "num_beams": 3, "num_return_sequences": 2}
    bound = bart_module.generate(**source, **options)
    assert runners and all(isinstance(runner, OrtBoundRunner) for runner in runners)
    monkeypatch.setattr(encoder_decoder, "bound_runner", lambda *a: None)
    assert torch.equal(bart_module.generate(**source, **options), bound)


def test_stream_yields_the_greedy_tokens(bart_module: EncoderDecoderModule, source: dict[str, torch.Tensor]) -> None:
    whole = bart_module.generate(**source, max_new_tokens=8, eos_token_id=[])
    streamed = torch.stack(list(bart_module.stream(**source, max_new_tokens=8, eos_token_id=[])), dim=1)
    assert torch.equal(whole[:, 1:], streamed)


def test_requests_from_six_threads_get_the_single_threaded_answers(
    bart_module: EncoderDecoderModule, source: dict[str, torch.Tensor]
) -> None:
    """A server's use: the encoder graph and the decoder step called from 6 threads at once, every answer as alone
    (tests/pipeline/module/test_concurrency.py: the decoder-only module)."""
    assert answers_from_threads(mixed_requests(bart_module, source)) == []


def test_request_slots_bound_the_requests_at_once(
    bart_module: EncoderDecoderModule, source: dict[str, torch.Tensor]
) -> None:
    """Each request holds one of the module's request slots from its first graph run to its last (its cache is its
    own): one slot refuses a second stream of the holding thread and times out another thread's request; 2 slots
    serve 6 threads, every answer as alone."""
    requests_wait_for_slots(bart_module, source)


def test_t5_relative_positions_give_transformers_tokens() -> None:
    config = transformers.T5Config(**SIZES, d_kv=8, d_ff=48, num_layers=2, num_heads=4, decoder_start_token_id=0)
    t5 = lively(lambda: transformers.T5ForConditionalGeneration(config), seed=11, std=0.3)
    ids = torch.randint(4, 96, (2, 7), generator=torch.Generator().manual_seed(5))
    module = pipeline.convert(t5, ids, generation=GENERATION)
    for options in ({}, {"num_beams": 4}):
        theirs = t5.generate(ids, do_sample=False, max_new_tokens=10, **options)
        assert torch.equal(module.generate(ids, max_new_tokens=10, **options), theirs)
    varied(theirs)
    # the relative bias reached the graph as the step's biased attention (its keys and values over the whole cache)
    assert any(node.op_type == "Attention" for node in module.decoder.onnx.graph.node)


class _SizedByItsCache(transformers.FSMTForConditionalGeneration):
    """FSMT whose logits read the length of its self-attention cache's keys beyond the tokens it holds: nothing over
    its own growing cache, the unwritten positions over a static one (whether or not the step hands it the written
    positions only: the layer's storage is the whole capacity)."""

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        return False  # FSMT's answer (transformers reads it from the source file of the class: this test's)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = super().forward(*args, **kwargs)
        cache = getattr(out, "past_key_values", None)
        if cache is not None:
            keys = cache.self_attention_cache.layers[0].keys
            out.logits = out.logits + (keys.shape[-2] - cache.get_seq_length())
        return out


def test_a_decoder_that_cannot_run_over_a_static_cache_is_refused_before_export(
    source: dict[str, torch.Tensor],
) -> None:
    """A decoder whose own code reads the unwritten positions of a static cache (here its storage's length) gives
    other logits over either form of the step's cache (the whole capacity, the written positions) than over its own:
    the PyTorch step is compared with the model's own decoding before any export, and the refusal says why and what
    to do. (FSMT itself, whose attention masks no cache position, decodes over the written positions:
    test_own_attention_seq2seq.py.)"""
    config = transformers.FSMTConfig(
        src_vocab_size=96, tgt_vocab_size=96, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=48, decoder_ffn_dim=48,
        max_position_embeddings=64, langs=["en", "de"],
    )  # fmt: skip
    fsmt = lively(lambda: _SizedByItsCache(config), seed=3, std=0.5)
    with pytest.raises(InputError, match="static cache") as caught:
        pipeline.convert(fsmt, source, generation=GENERATION)
    assert "_SizedByItsCache" in str(caught.value) and "written positions only" in str(caught.value)
    assert "AttentionInterface" in str(caught.value) and "without generation=" in str(caught.value)
    assert caught.value.stage == "input"


def test_whisper_input_features_give_transformers_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layers = {"encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4}
    sizes = {"encoder_ffn_dim": 48, "decoder_ffn_dim": 48, "num_mel_bins": 8, "max_source_positions": 16}
    tokens = {"max_target_positions": 32, "decoder_start_token_id": 3, "pad_token_id": 0, "eos_token_id": 2}
    config = transformers.WhisperConfig(**SIZES, **layers, **sizes, **tokens, bos_token_id=1)
    whisper = lively(lambda: transformers.WhisperForConditionalGeneration(config), seed=11, std=0.5)
    features = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(3))
    module = pipeline.convert(whisper, features, generation=GENERATION)
    ours = module.generate(input_features=features, max_new_tokens=10)
    theirs = whisper.generate(input_features=features, max_new_tokens=10)
    # transformers' Whisper leaves its decoder prompt out of the sequences; every other model keeps it, as we do
    assert torch.equal(ours[:, 1:], theirs)
    varied(theirs)
    cli_reads_audio_through_the_models_feature_extractor(module, tmp_path, capsys)
    assert "--input-features FILE.npy" in generate_command(module, tmp_path / "whisper")  # what convert prints


def cli_reads_audio_through_the_models_feature_extractor(
    module: EncoderDecoderModule, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pipeline generate DIR --audio A.wav --audio B.wav --feature-extractor FE``: 16-bit and 24-bit stereo PCM
    files read and averaged to mono, the saved extractor's features, one line of tokens per file, as ``generate``
    gives them on those features; a file at another rate is refused with the ffmpeg line that fixes it."""
    import wave

    from pipeline.cli import main

    with pytest.warns(UserWarning, match="mel filter"):  # 8 mel bins over a 1600 Hz signal: some filters are empty
        extractor = transformers.WhisperFeatureExtractor(
            feature_size=8, sampling_rate=1600, hop_length=50, chunk_length=1, n_fft=100
        )
    extractor.save_pretrained(tmp_path / "extractor")
    clips = [np.sin(np.arange(n) * f)[:, None] * [0.5, 0.25] for n, f in ((1200, 0.3), (900, 0.05))]
    for index, (clip, width) in enumerate(zip(clips, (2, 3), strict=True)):
        scaled = np.round(clip * 2 ** (8 * width - 1)).astype("<i4")
        data = scaled.astype("<i2").tobytes() if width == 2 else scaled.view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
        with wave.open(str(tmp_path / f"{index}.wav"), "wb") as writer:
            writer.setnchannels(2)
            writer.setsampwidth(width)
            writer.setframerate(1600)
            writer.writeframes(data)
    mono = [clip.mean(axis=1).astype(np.float32) for clip in clips]
    features = extractor(mono, sampling_rate=1600, return_tensors="pt").input_features  # padded to its window
    expected = module.generate(input_features=features, max_new_tokens=6, eos_token_id=[])[:, 1:]
    from pipeline.cli.audio import audio_inputs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the extractor's empty mel filters, again when it loads
        read = audio_inputs([tmp_path / "0.wav", tmp_path / "1.wav"], tmp_path / "extractor", ["input_features"])
    assert list(read) == ["input_features"]  # the extractor's attention_mask is not an input of Whisper's encoder
    torch.testing.assert_close(read["input_features"], features, atol=2e-3, rtol=0)  # the PCM files' rounding
    target = module.save(tmp_path / "whisper")
    audio = ["--audio", str(tmp_path / "0.wav"), "--audio", str(tmp_path / "1.wav")]
    command = ["generate", str(target), *audio, "--feature-extractor", str(tmp_path / "extractor")]
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the extractor's empty mel filters, again when it loads
        assert main([*command, "--max-new-tokens", "6", "--ignore-eos"]) == 0
        printed = [[int(t) for t in line.split()] for line in capsys.readouterr().out.strip().splitlines()]
        assert printed == expected.tolist()
        with wave.open(str(tmp_path / "0.wav"), "wb") as writer:  # the same samples at another rate
            writer.setnchannels(1)
            writer.setsampwidth(2)
            writer.setframerate(8000)
            writer.writeframes(np.zeros(800, "<i2").tobytes())
        assert main(command) == 1
    assert "sampled at 8000 Hz; the feature extractor takes 1600 Hz" in capsys.readouterr().err


def test_a_saved_directory_loads_and_generates_the_same(
    bart_module: EncoderDecoderModule, source: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    target = bart_module.save(tmp_path / "bart")
    assert sorted(p.name for p in target.iterdir()) == [DECODER_FILE, ENCODER_FILE]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging directory left behind
    assert stat.S_IMODE(target.stat().st_mode) == 0o777 & ~current_umask()  # readable as a file's save is
    loaded = pipeline.load(target)
    assert isinstance(loaded, EncoderDecoderModule)
    assert loaded.generation == bart_module.generation
    options = {"max_new_tokens": 10, "num_beams": 3}
    assert torch.equal(loaded.generate(**source, **options), bart_module.generate(**source, **options))
    bart_module.save(target)  # saving over it again replaces it whole
    (target / ENCODER_FILE).unlink()
    with pytest.raises(ArtifactError, match="incomplete encoder-decoder"):
        pipeline.load(target)


def test_bad_calls_name_the_fix(
    bart: torch.nn.Module, bart_module: EncoderDecoderModule, source: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    with pytest.raises(InputError, match="decoder_input_ids.*generation makes"):
        pipeline.convert(bart, {**source, "decoder_input_ids": source["input_ids"]}, generation=GENERATION)
    with pytest.raises(InputError, match="needs the encoder's input_ids"):
        bart_module.generate(attention_mask=source["attention_mask"])
    with pytest.raises(InputError, match="does not take the option.*num_beam"):
        bart_module.generate(**source, num_beam=2)
    with pytest.raises(InputError, match="max_batch=8"):
        bart_module.generate(**source, num_beams=5)
    prompt = torch.tensor([[2, 7, 9], [2, 8, 1]])
    padded = torch.tensor([[1, 1, 1], [1, 1, 0]])
    with pytest.raises(InputError, match="decoder_attention_mask masks tokens"):
        bart_module.generate(**source, decoder_input_ids=prompt, decoder_attention_mask=padded, max_new_tokens=2)
    whole = bart_module.generate(**source, decoder_input_ids=prompt, max_new_tokens=2)
    ones = torch.ones_like(prompt)
    assert torch.equal(
        bart_module.generate(**source, decoder_input_ids=prompt, decoder_attention_mask=ones, max_new_tokens=2), whole
    )
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        bart_module.save(tmp_path / "file")
    with pytest.raises(ArtifactError, match=r"(?s)cannot write .*is a file, not a directory"):
        bart_module.save(tmp_path / "file" / "bart")


def test_the_cli_generates_from_a_saved_directory(
    bart_module: EncoderDecoderModule, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.cli import main

    target = bart_module.save(tmp_path / "bart")
    sources = [[5, 6, 7, 8, 9], [10, 11, 12]]
    argv = ["generate", str(target), "--max-new-tokens", "8", "--num-beams", "2", "--ignore-eos"]
    assert main([*argv, *(item for s in sources for item in ("--prompt-ids", ",".join(map(str, s))))]) == 0
    printed = [line.split() for line in capsys.readouterr().out.strip().splitlines()]
    ids = torch.tensor([sources[0], [*sources[1], 1, 1]])  # right-padded with BART's pad id
    mask = torch.tensor([[1] * 5, [1, 1, 1, 0, 0]])
    expected = bart_module.generate(ids, attention_mask=mask, max_new_tokens=8, num_beams=2, eos_token_id=[])
    assert [[int(t) for t in row] for row in printed] == expected[:, 1:].tolist()
    features = tmp_path / "features.npy"
    np.save(features, np.zeros((8, 32), np.float32))
    assert main(["generate", str(target), "--input-features", str(features)]) == 1
    assert "this model's encoder takes input_ids" in capsys.readouterr().err


@pytest.mark.parametrize(("heads", "head_size"), [(4, 8), (2, 16)])
def test_tensorrt_rtx_builds_both_graphs_of_t5_in_float16(heads: int, head_size: int) -> None:
    """The real TensorRT-RTX builder takes the encoder graph and the step in float16. T5's biased attention (a float
    mask) is decomposed for TensorRT: with heads of 16 its attention layer had no dedicated kernel, and marked
    decomposable it failed inside the builder (a float32 mask added to float16 scores)."""
    pytest.importorskip("tensorrt_rtx")
    sizes = {"d_kv": head_size, "num_heads": heads, "d_ff": 48, "num_layers": 1}
    config = transformers.T5Config(**SIZES, **sizes, decoder_start_token_id=0)
    t5 = lively(lambda: transformers.T5ForConditionalGeneration(config), seed=11, std=0.3)
    ids = torch.randint(4, 96, (2, 7), generator=torch.Generator().manual_seed(5))
    options = {"backend": "tensorrt-rtx", "precision": "fp16", "trt_engine_cache": False}  # built here, not reused
    module = pipeline.convert(t5, ids, generation=GENERATION, validate=False, **options)
    assert module.encoder.engine_bytes and module.decoder.engine_bytes
    assert module.generation.attention == "onnx"  # float16: ONNX Attention (the biased one decomposed)


def test_tensorrt_rtx_builds_both_graphs_of_bart_in_float16(source: dict[str, torch.Tensor]) -> None:
    """BART's float16 step with heads of 16 (boolean-masked self- and cross-attention as TensorRT's attention layer)
    has no dedicated kernel in TensorRT-RTX 1.7 ("Attention operation was not supported by a dedicated kernel"): the
    build marks the attention layers decomposable, and both graphs build."""
    pytest.importorskip("tensorrt_rtx")
    heads = {"encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_layers": 1, "decoder_layers": 1}
    config = transformers.BartConfig(**SIZES, **heads, encoder_ffn_dim=48, decoder_ffn_dim=48)
    model = lively(lambda: transformers.BartForConditionalGeneration(config), seed=3, std=0.5)
    options = {"backend": "tensorrt-rtx", "precision": "fp16", "trt_engine_cache": False}  # built here, not reused
    module = pipeline.convert(model, source, generation=GENERATION, validate=False, **options)
    assert module.encoder.engine_bytes and module.decoder.engine_bytes
    assert module.generation.attention == "onnx"


def test_a_softcap_in_a_nested_config_decomposes_attention_for_tensorrt() -> None:
    """T5Gemma keeps its attention softcap in its encoder's and decoder's configs, not the top one: the float16 step
    for TensorRT-RTX used ONNX ``Attention`` with ``softcap``, which the parser refuses ("Setting softcap is not
    supported in TensorRT Attention"), and the decoder ran in segments. Now both graphs are single engines."""
    pytest.importorskip("tensorrt_rtx")
    part = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1}
    part |= {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "query_pre_attn_scalar": 16}
    config = transformers.T5GemmaConfig(encoder=part, decoder=part, vocab_size=96)
    model = lively(lambda: transformers.T5GemmaForConditionalGeneration(config), seed=2, std=0.3)
    ids = torch.randint(4, 96, (2, 7), generator=torch.Generator().manual_seed(5))
    options = {"backend": "tensorrt-rtx", "precision": "fp16", "trt_engine_cache": False}  # built here, not reused
    module = pipeline.convert(model, ids, generation=GENERATION, validate=False, **options)
    assert module.generation.attention == "decomposed"
    assert module.encoder.engine_bytes and module.decoder.engine_bytes
