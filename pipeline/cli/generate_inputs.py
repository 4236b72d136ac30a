"""What ``pipeline generate`` reads from its arguments (:mod:`pipeline.cli.generate`): token ids, text through a local
tokenizer, speech features from a .npy file, an image-taking encoder's prompts and images through its processor; the
prompts padded into one batch; and the printed tokens (up to the end of the sequence, as text through a tokenizer).
Each bad argument is an InputError naming the fix."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from converters.errors import InputError

if TYPE_CHECKING:
    import torch


def read_ids(text: str) -> list[int]:
    """``--prompt-ids 1,2,3`` (commas and/or spaces) as a list of ints."""
    parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise InputError(
            f"cannot read --prompt-ids {text!r}: token ids are whole numbers", fix="write --prompt-ids 1,2,3"
        ) from None


def encode(tokenizer: Any, text: str) -> list[int]:
    """The token ids of a text prompt (with the tokenizer's special tokens, as ``tokenizer(text)`` gives them)."""
    return [int(i) for i in tokenizer(text)["input_ids"]]


def padded(prompts: list[list[int]], pad: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts as one batch padded on ``side`` ("left": a decoder's prompts; "right": an encoder's sources, as
    its tokenizer pads them): ``input_ids`` and ``attention_mask`` [batch, longest]."""
    import torch

    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad, dtype=torch.int64)
    mask = torch.zeros((len(prompts), longest), dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        place = slice(longest - len(prompt), longest) if side == "left" else slice(0, len(prompt))
        ids[row, place] = torch.tensor(prompt, dtype=torch.int64)
        mask[row, place] = 1
    return ids, mask


def load_tokenizer(directory: Path) -> Any:
    """``AutoTokenizer.from_pretrained(directory, local_files_only=True)``; a clear error when it cannot load."""
    if not directory.is_dir():
        raise InputError(
            f"--tokenizer {directory}: no such directory",
            fix="give a local directory holding tokenizer files (tokenizer.json, tokenizer_config.json)",
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"--tokenizer {directory} holds no tokenizer transformers can load: {type(exc).__name__}: {exc}",
            fix="save one there with tokenizer.save_pretrained(DIR) (tokenizer.json + tokenizer_config.json)",
        ) from exc


def check_prompts(module: Any, prompts: list[list[int]], new_tokens: int) -> None:
    """Every prompt fits the artifact: not empty, ids in its vocabulary, prompt + new tokens within ``max_length``,
    no more prompts than ``max_batch``; each error names the prompt and the fix."""
    generation = module.generation
    if len(prompts) > generation.max_batch:
        raise InputError(
            f"{len(prompts)} prompts, but the artifact was converted for max_batch={generation.max_batch}",
            fix=f"give at most {generation.max_batch} prompts, or convert with --generation max_batch={len(prompts)}",
        )
    vocab = module.vocabulary_size
    for number, prompt in enumerate(prompts, start=1):
        if not prompt:
            raise InputError(f"prompt {number} is empty (no token ids)", fix="give at least one token id: 1,2,3")
        outside = [i for i in prompt if i < 0 or (vocab is not None and i >= vocab)]
        if outside:
            raise InputError(
                f"prompt {number} holds token id(s) {outside[:5]} outside the model's vocabulary [0, {vocab})",
                fix="use ids below the vocabulary size (a tokenizer made for this model gives them)",
            )
        if len(prompt) + new_tokens > generation.max_length:
            raise InputError(
                f"prompt {number} has {len(prompt)} tokens; with --max-new-tokens {new_tokens} that is "
                f"{len(prompt) + new_tokens}, more than the cache holds (max_length={generation.max_length})",
                fix=f"shorten the prompt or lower --max-new-tokens, or convert with --generation "
                f"max_length={len(prompt) + new_tokens}",
            )


def read_features(path: Path) -> torch.Tensor:
    """``--input-features FILE.npy`` as a float32 tensor [batch, mels, frames]."""
    import numpy as np
    import torch

    if not path.is_file():
        raise InputError(f"--input-features {path}: no such file", fix="give a .npy file saved with numpy.save")
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(
            f"--input-features {path} is not a NumPy .npy file: {exc}", fix="save the features with numpy.save"
        ) from exc
    if array.ndim == 2:
        array = array[None]
    if array.ndim != 3 or not np.issubdtype(array.dtype, np.floating):
        raise InputError(
            f"--input-features {path} holds a {array.dtype} array of shape {list(array.shape)}; features are floats "
            "[mels, frames] or [batch, mels, frames]",
            fix="save the feature extractor's input_features (e.g. processor(audio).input_features[0])",
        )
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


def until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """The new tokens up to and including the first end-of-sequence token (the rest is padding)."""
    for index, token in enumerate(tokens):
        if token in eos:
            return tokens[: index + 1]
    return tokens


def text_of(tokenizer: Any, ids: list[int]) -> str:
    """The ids as text, without special tokens."""
    return str(tokenizer.decode(ids, skip_special_tokens=True))


def check_media(args: argparse.Namespace, audio: bool) -> None:
    """A vision-language model's arguments (an audio-language model's when ``audio``): --prompt and --image (--audio)
    pairs through --processor, nothing of another model's."""
    medium, other = ("--audio", "--image") if audio else ("--image", "--audio")
    example = (
        "--processor DIR --audio a.wav --prompt 'TEXT (WITH THE AUDIO PLACEHOLDER, WHERE THE PROCESSOR HAS ONE)'"
        if audio
        else "--processor DIR --image a.png --prompt 'USER: <image> What is shown? ASSISTANT:'"
    )
    kind = "an audio-language" if audio else "a vision-language"
    if getattr(args, other.removeprefix("--")):
        raise InputError(
            f"{other} given, but {args.artifact} is {kind} model: it takes {'audio' if audio else 'images'}",
            fix=f"give {medium} FILE instead: {example}",
        )
    if args.input_features is not None or args.feature_extractor is not None:
        given = "--input-features" if args.input_features is not None else "--feature-extractor"
        raise InputError(
            f"{given} given, but {kind} model's inputs come from its processor ({medium} through --processor)",
            fix=f"drop {given}: {example}",
        )
    if args.prompt_ids:
        raise InputError(
            f"--prompt-ids cannot place {'audio' if audio else 'an image'}",
            fix=f"give --prompt TEXT with the {medium.removeprefix('--')} placeholder",
        )
    if args.processor is None or not getattr(args, medium.removeprefix("--")) or not args.prompt:
        lacking = "--processor DIR" if args.processor is None else medium if args.prompt else "--prompt"
        raise InputError(
            f"{kind} model takes --prompt TEXT and {medium} FILE pairs through its --processor DIR ({lacking} is "
            "missing)",
            fix=f"pass {example}",
        )


def image_sources(args: argparse.Namespace, takes: list[str]) -> tuple[dict[str, Any], Any]:
    """An image-taking encoder's sources (each --prompt with its --image through --processor, right-padded as an
    encoder's source is) and the processor's tokenizer."""
    from pipeline.cli.images import image_prompts, load_processor

    if args.processor is None or not args.image or not args.prompt or args.prompt_ids:
        raise InputError(
            f"this encoder-decoder's encoder takes {', '.join(takes)}: --prompt TEXT and --image FILE pairs through "
            "its --processor DIR (no --prompt-ids)",
            fix="pass --processor DIR --image a.png --prompt 'TEXT' (Florence-2: a task, e.g. '<CAPTION>')",
        )
    processor = load_processor(args.processor)
    made = image_prompts(processor, args.prompt, args.image, padding_side="right")
    return {name: value for name, value in made.items() if name in takes}, processor.tokenizer
