"""``pipeline generate DIR --processor P --prompt TEXT --audio a.wav`` on a converted Qwen2.5-Omni thinker, as a user
runs it: the processor is built offline and saved as a checkpoint's is (a byte-level BPE tokenizer of printable ASCII
with the thinker's special tokens at the tiny config's ids, Whisper's feature extractor of the tiny tower's 16 mels in
a window of 1 s, Qwen2-VL's image and video processors, a chat template writing an audio item as
``<|audio_bos|><|AUDIO|><|audio_eos|>``, as Qwen's does). Its call takes ``audio=`` and returns
``feature_attention_mask``, which the converted audio graph holds at its sample's (1 s: every frame). A batch of two
prompts prints, line by line, the module's ``generate`` on the processor's inputs, which is transformers' greedy
``model.generate``; an audio longer than the window is heard for its first second, with a warning. Refused, each naming
the fix: a prompt without the placeholder, a bare ``<|AUDIO|>`` (not the template's form), a prompt count other than
the audio count, an audio shorter than the artifact's window (in seconds, not a frame mask). Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers imports it
import torch
import transformers
from tiny_models import qwen_omni_thinker, tone_wav

import pipeline
from pipeline.cli.audio import audio_placeholder
from pipeline.runtime.generation.vision_language import VisionLanguageModule

RATE, MELS, FRAMES = 16000, 16, 100  # a window of 1 s: 100 frames, 25 audio tokens
GENERATION = {"max_length": 72, "max_batch": 2}
NEW_TOKENS = 6
#: The thinker's special tokens at the tiny config's ids (ids 0-95: printable ASCII, byte-level; 96-117 other bytes).
SPECIAL = {
    118: "<|endoftext|>", 119: "<|im_start|>", 120: "<|im_end|>", 121: "<|vision_bos|>", 122: "<|vision_eos|>",
    123: "<|audio_bos|>", 124: "<|audio_eos|>", 125: "<|AUDIO|>", 126: "<|VIDEO|>", 127: "<|IMAGE|>",
}  # fmt: skip
FORM = "<|audio_bos|><|AUDIO|><|audio_eos|>"
#: Qwen2.5-Omni's chat template, shortened (its system prompt, without the video and the numbering of items).
TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are Qwen."
    "<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content %}<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif content['type'] == 'audio' or 'audio' in content %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tokenizer() -> Any:
    """A byte-level BPE tokenizer (no merges) of printable ASCII, space and newline (then other bytes up to the first
    special id), with :data:`SPECIAL` (added after the vocabulary: at their ids)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    chars = [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ"]  # byte-level's space and newline
    chars += sorted(set(pre_tokenizers.ByteLevel.alphabet()) - set(chars))[: min(SPECIAL) - len(chars)]  # fillers
    words = Tokenizer(models.BPE({char: index for index, char in enumerate(chars)}, merges=[]))
    words.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    words.decoder = decoders.ByteLevel()
    words.add_special_tokens([AddedToken(SPECIAL[i], special=True) for i in sorted(SPECIAL)])
    names = ("image", "audio", "video", "vision_bos", "vision_eos", "audio_bos", "audio_eos")
    extra = {
        f"{name}_token": SPECIAL[index] for name, index in zip(names, (127, 125, 126, 121, 122, 123, 124), strict=True)
    }
    return transformers.Qwen2Tokenizer(
        tokenizer_object=words, pad_token="<|endoftext|>", eos_token="<|im_end|>", extra_special_tokens=extra
    )


def omni_processor(directory: Path) -> Any:
    """Qwen2.5-Omni's processor for the tiny thinker, saved to ``directory``."""
    sizes = {"patch_size": 8, "merge_size": 2, "temporal_patch_size": 2}
    processor = transformers.Qwen2_5OmniProcessor(
        image_processor=transformers.Qwen2VLImageProcessor(**sizes),
        video_processor=transformers.Qwen2VLVideoProcessor(**sizes),
        feature_extractor=transformers.WhisperFeatureExtractor(
            feature_size=MELS, sampling_rate=RATE, hop_length=160, chunk_length=1, n_fft=400
        ),
        tokenizer=tokenizer(),
        chat_template=TEMPLATE,
    )
    processor.save_pretrained(directory)
    return processor


def write_wav(path: Path, seconds: float, hertz: float) -> Path:
    """A 16-bit mono PCM WAV at :data:`RATE` of two tones (:func:`tiny_models.tone_wav`)."""
    return tone_wav(path, seconds, hertz, RATE)


def inputs_of(processor: Any, prompts: list[str], files: list[Path]) -> dict[str, torch.Tensor]:
    """The processor's inputs for the prompts and audio files, left-padded, without its token counts."""
    from pipeline.cli.audio import read_wav

    processor.tokenizer.padding_side = "left"
    clips = [read_wav(file)[0] for file in files]
    made = processor(text=prompts, audio=clips, sampling_rate=RATE, return_tensors="pt", padding=True)
    return {name: value for name, value in made.items() if name != "num_audio_tokens"}


@pytest.fixture(scope="module")
def omni(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path, Path]:
    """The thinker, its processor, the processor's directory and the artifact's (converted from two prompts of 1 s of
    audio each through the processor)."""
    root = tmp_path_factory.mktemp("omni")
    processor = omni_processor(root / "processor")
    model = qwen_omni_thinker(MELS, FRAMES, positions=128)
    files = [write_wav(root / "a.wav", 1.0, 330.0), write_wav(root / "b.wav", 1.0, 500.0)]
    sample = inputs_of(processor, [f"{FORM}What?", f"Say {FORM} again"], files)
    module = pipeline.convert(model, sample, generation=GENERATION, validate=False)
    assert isinstance(module, VisionLanguageModule) and module.modality == "audio"
    return model, processor, root / "processor", module.save(root / "omni")


def test_the_cli_decodes_a_batch_of_audio_prompts_as_transformers(
    omni: tuple[Any, Any, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two chat prompts, 1 s and 1.5 s of audio (its first second heard, with a warning): each printed line is the
    module's greedy tokens on the processor's inputs, which are transformers'."""
    from pipeline.cli import main

    model, processor, directory, target = omni
    files = [write_wav(tmp_path / "one.wav", 1.0, 220.0), write_wav(tmp_path / "two.wav", 1.5, 880.0)]
    prompts = [f"<|im_start|>user\n{FORM}What is said?<|im_end|>\n<|im_start|>assistant\n", f"{FORM}Why?"]
    pairs = [item for text, file in zip(prompts, files, strict=True) for item in ("--prompt", text, "--audio", file)]
    command = ["generate", str(target), "--processor", str(directory), *map(str, pairs)]
    with pytest.warns(UserWarning, match=f"--audio {files[1]} is 1.50 s; the processor keeps its first 1 s "):
        assert main([*command, "--max-new-tokens", str(NEW_TOKENS)]) == 0
    captured = capsys.readouterr()
    inputs = inputs_of(processor, prompts, files)
    assert int((inputs["input_ids"] == 125).sum()) == 2 * 25 and inputs["attention_mask"][1, 0] == 0
    assert inputs["feature_attention_mask"].all()
    ours = pipeline.load(target).generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    with torch.no_grad():
        theirs = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert torch.equal(ours, theirs)
    new = ours[:, inputs["input_ids"].shape[1] :]
    assert len(set(new.flatten().tolist())) > 3  # not one token repeated
    assert captured.out.splitlines() == [processor.tokenizer.decode(row, skip_special_tokens=True) for row in new]


def test_the_placeholder_is_written_as_the_chat_template_writes_it(omni: tuple[Any, Any, Path, Path]) -> None:
    """The template writes the audio token between its begin and end tokens: that is the form a prompt must hold;
    without a template, the token alone."""
    processor = omni[1]
    assert audio_placeholder(processor, "<|AUDIO|>") == FORM
    bare = transformers.Qwen2_5OmniProcessor(
        image_processor=processor.image_processor, video_processor=processor.video_processor,
        feature_extractor=processor.feature_extractor, tokenizer=processor.tokenizer,
    )  # fmt: skip
    assert audio_placeholder(bare, "<|AUDIO|>") == "<|AUDIO|>"


@pytest.mark.parametrize(
    ("prompts", "seconds", "said"),
    [
        (["What is said?"], [1.0], f"a prompt lacks the audio placeholder '<|AUDIO|>'|fix: write '{FORM}'"),
        (["What is said? <|AUDIO|>"], [1.0], "without the tokens the processor's chat template writes around"),
        ([f"{FORM}What?"], [1.0, 1.0], "1 prompt(s) and 2 audio file(s): each prompt takes one audio"),
        ([f"{FORM}What?"], [0.5], "fills 50 feature frames (0.5 s), but the artifact's audio graph was converted for"),
    ],
    ids=["no placeholder", "bare token", "counts", "short audio"],
)  # fmt: skip
def test_bad_prompts_and_audio_are_refused_naming_the_fix(
    omni: tuple[Any, Any, Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    prompts: list[str],
    seconds: list[float],
    said: str,
) -> None:
    from pipeline.cli import main

    _, _, directory, target = omni
    files = [str(write_wav(tmp_path / f"{index}.wav", length, 440.0)) for index, length in enumerate(seconds)]
    given = [item for text in prompts for item in ("--prompt", text)] + [item for f in files for item in ("--audio", f)]
    assert main(["generate", str(target), "--processor", str(directory), *given, "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert all(part in err for part in said.split("|fix: ")), err
    assert "error: [input] " in err and "\n  fix: " in err
    if seconds == [0.5]:
        assert "fix: give audio of at least 1 s (pad it with silence: ffmpeg -i 0.wav -af apad=whole_dur=1" in err
