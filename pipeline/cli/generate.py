"""``pipeline generate ARTIFACT``: decode with a generation artifact (``pipeline convert ... --generation``).

Prompts are token ids (``--prompt-ids 1,2,3``, repeatable: one prompt each, left-padded into one batch) or text
(``--prompt TEXT`` with ``--tokenizer DIR``, a local directory ``transformers.AutoTokenizer`` loads offline). The
new tokens of every prompt are printed on one line each: ids separated by spaces, or text when a tokenizer is
given. ``--stream`` prints each token as it comes (one prompt; transformers' ``TextStreamer`` for text).

An encoder-decoder (the directory its conversion saves) takes the same prompts as its encoder's sources (right-padded,
as its tokenizer pads them), or ``--input-features FILE.npy`` (a speech model's log-mel features, [mels, frames] or
[batch, mels, frames], as its feature extractor makes them), or ``--audio FILE.wav`` through the model's own
``--feature-extractor DIR`` (:mod:`pipeline.cli.audio`). A vision-language model (its saved directory: images placed
in the prompt, as LLaVA's and Kosmos-2's, or cross-attended, as Mllama's and IDEFICS's) takes ``--prompt TEXT --image
FILE`` pairs through its own ``--processor DIR`` (:mod:`pipeline.cli.images`); an audio-language model (GLM-ASR,
Audio Flamingo 3, Qwen3-ASR: its module's ``modality`` is ``"audio"``) ``--prompt TEXT --audio FILE.wav`` pairs
(:func:`pipeline.cli.audio.audio_prompts`). ``--num-beams`` decodes with beam search.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from converters.errors import InputError

if TYPE_CHECKING:
    import torch


def add_generate_command(commands: Any) -> None:
    """Add the ``generate`` subcommand to ``pipeline``'s subparsers."""
    parser = commands.add_parser("generate", help="generate tokens (or text) with a generation artifact")
    parser.add_argument(
        "artifact",
        type=Path,
        help="a .ptrt written by `pipeline convert ... --generation` (an encoder-decoder's or a vision-language "
        "model's: its directory)",
    )
    parser.add_argument(
        "--input-features",
        type=Path,
        default=None,
        metavar="FILE.npy",
        help="an encoder-decoder speech model's input features ([mels, frames] or [batch, mels, frames])",
    )
    parser.add_argument(
        "--audio",
        type=Path,
        action="append",
        default=[],
        metavar="FILE.wav",
        help="a speech model's audio (PCM WAV at the extractor's rate; repeatable: one row each): an "
        "encoder-decoder's through --feature-extractor, an audio-language model's one per --prompt through --processor",
    )
    parser.add_argument(
        "--feature-extractor",
        type=Path,
        default=None,
        metavar="DIR",
        help="the speech model's feature extractor, a local directory (AutoFeatureExtractor, offline)",
    )
    parser.add_argument(
        "--image",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a vision-language model's image (repeatable: one per --prompt, whose text holds the image placeholder), "
        "through --processor",
    )
    parser.add_argument(
        "--processor",
        type=Path,
        default=None,
        metavar="DIR",
        help="the vision-language (or audio-language) model's processor, a local directory (AutoProcessor, offline): "
        "images (or audio) and prompts",
    )
    parser.add_argument(
        "--prompt-ids",
        action="append",
        default=[],
        metavar="ID,ID,...",
        help="a prompt as token ids (commas or spaces); repeat for a batch of prompts",
    )
    parser.add_argument(
        "--prompt", action="append", default=[], metavar="TEXT", help="a prompt as text (needs --tokenizer); repeatable"
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        metavar="DIR",
        help="a local tokenizer directory (AutoTokenizer.from_pretrained, offline): text prompts, text output",
    )
    add_decoding_arguments(parser)
    parser.add_argument("--stream", action="store_true", help="print each new token as it comes (one prompt)")
    parser.add_argument("--echo", action="store_true", help="print the prompt before its new tokens")
    parser.set_defaults(run=_generate)


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """``generate``'s options, named as transformers names them."""
    parser.add_argument("--max-new-tokens", type=int, default=32, metavar="N", help="new tokens per prompt (32)")
    parser.add_argument("--do-sample", action="store_true", help="sample (default: greedy)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (1.0)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the K most likely tokens")
    parser.add_argument("--top-p", type=float, default=None, help="sample among the most likely tokens up to P")
    parser.add_argument("--seed", type=int, default=None, help="seed of the draws (same seed, same tokens)")
    parser.add_argument("--repetition-penalty", type=float, default=None, help="transformers' repetition penalty")
    parser.add_argument("--num-beams", type=int, default=1, metavar="N", help="beam search over N beams (1: off)")
    parser.add_argument(
        "--eos-token-id",
        type=int,
        action="append",
        default=None,
        metavar="ID",
        help="a token that ends a prompt's generation (repeatable; default: the model's)",
    )
    parser.add_argument("--ignore-eos", action="store_true", help="never stop early: every prompt gets N tokens")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="ONNX Runtime's intra-op threads (default: the artifact's)",
    )
    parser.add_argument(
        "--spinning", action="store_true", help="let ONNX Runtime's threads spin-wait between steps (default: off)"
    )


def _generate(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise InputError(f"--max-new-tokens {args.max_new_tokens}: nothing to generate", fix="pass --max-new-tokens 32")
    speech = [name for name, given in (("--input-features", args.input_features), ("--audio", args.audio)) if given]
    if not args.prompt_ids and not args.prompt and not speech:
        raise InputError("no prompt given", fix="pass --prompt-ids 1,2,3 (or --prompt TEXT with --tokenizer DIR)")
    if args.prompt and args.tokenizer is None and args.processor is None and not args.image and not args.audio:
        raise InputError("--prompt TEXT needs a tokenizer", fix="pass --tokenizer DIR, or give --prompt-ids instead")
    if args.stream and len(args.prompt_ids) + len(args.prompt) > 1:
        raise InputError(
            f"--stream prints one prompt's tokens as they come; {len(args.prompt_ids) + len(args.prompt)} prompts "
            "were given",
            fix="give one prompt with --stream, or drop --stream to print every prompt's tokens at the end",
        )
    if args.stream and args.num_beams > 1:
        raise InputError("--stream cannot follow beam search (the beams are ordered at the end)", fix="drop one")
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer is not None else None
    module = load_generative(args.artifact, threads=args.threads, spinning=True if args.spinning else None)
    from pipeline.runtime.generation.cross_images import CrossImagesModule
    from pipeline.runtime.generation.encoder_decoder import EncoderDecoderModule
    from pipeline.runtime.generation.vision_language import VisionLanguageModule

    if isinstance(module, VisionLanguageModule | CrossImagesModule):
        return _generate_vision_language(module, args)
    if len(speech) + bool(args.prompt_ids or args.prompt) > 1:  # an audio-language model takes --audio with prompts
        given = " and ".join([*speech, *(["prompts"] if args.prompt_ids or args.prompt else [])])
        raise InputError(f"{given} were both given", fix="give one: features or audio (speech), or prompts (text)")
    if isinstance(module, EncoderDecoderModule):
        return _generate_encoder_decoder(module, args, tokenizer)
    if args.image:
        raise InputError(f"--image is a vision-language model's input; {args.artifact} is not one", fix="drop --image")
    if speech:
        raise InputError(
            f"{speech[0]} is an encoder-decoder's input; {args.artifact} is a decoder-only model",
            fix="give --prompt-ids or --prompt",
        )
    prompts = [read_ids(text) for text in args.prompt_ids] + [encode(tokenizer, text) for text in args.prompt]
    check_prompts(module, prompts, args.max_new_tokens)
    ids, mask = left_pad(prompts, module.generation.pad_token_id or 0)
    options = decoding_options(args)
    if args.stream:
        _stream(module, ids, mask, options, tokenizer, args.echo)
        return 0
    out = module.generate(ids, mask, **options)
    eos = set(options.get("eos_token_id", module.generation.eos_token_id))
    for row, prompt in enumerate(prompts):
        new = until_eos(out[row, ids.shape[1] :].tolist(), eos)
        shown = (prompt if args.echo else []) + new
        print(_text(tokenizer, shown) if tokenizer is not None else " ".join(map(str, shown)))
    return 0


def _generate_vision_language(module: Any, args: argparse.Namespace) -> int:
    """A vision-language model's decoding (images placed in the prompt, or cross-attended: Mllama, IDEFICS; audio for
    an audio-language model's): each --prompt with its --image (--audio) through the model's processor, each output
    line the prompt's new tokens as text."""
    from pipeline.cli.images import image_prompts, load_processor

    audio = getattr(module, "modality", "image") == "audio"
    _check_media(args, audio)
    processor = load_processor(args.processor)
    if audio:
        from pipeline.cli.audio import audio_prompts

        inputs = audio_prompts(processor, args.prompt, args.audio)
    else:
        inputs = image_prompts(processor, args.prompt, args.image)
    rows = len(args.prompt)
    if rows * args.num_beams > module.generation.max_batch:
        raise InputError(
            f"{rows} prompt(s) x {args.num_beams} beam(s), but the artifact was converted for max_batch="
            f"{module.generation.max_batch}",
            fix="give fewer prompts or beams, or convert with a larger --generation max_batch",
        )
    options = decoding_options(args)
    if args.stream:
        tokens = [int(step[0]) for step in module.stream(**inputs, **options)]
        print(_text(processor.tokenizer, tokens), flush=True)
        return 0
    out = module.generate(**inputs, **options)
    eos = set(options.get("eos_token_id", module.generation.eos_token_id))
    # the sequences start with the prompts as the model's generate hands them on (BLIP's is one token shorter)
    width = inputs["input_ids"].shape[1] - getattr(module, "dropped_prompt_tokens", 0)
    for row in range(rows):
        print(_text(processor.tokenizer, until_eos(out[row, width:].tolist(), eos)))
    return 0


def _check_media(args: argparse.Namespace, audio: bool) -> None:
    """A vision-language model's arguments (an audio-language model's when ``audio``): --prompt and --image (--audio)
    pairs through --processor, nothing of another model's."""
    medium, other = ("--audio", "--image") if audio else ("--image", "--audio")
    example = (
        "--processor DIR --audio a.wav --prompt 'TEXT WITH THE AUDIO PLACEHOLDER'"
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


def _image_sources(args: argparse.Namespace, takes: list[str]) -> tuple[dict[str, Any], Any]:
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


def _generate_encoder_decoder(module: Any, args: argparse.Namespace, tokenizer: Any) -> int:
    """An encoder-decoder's decoding: the sources (or features) through its encoder, each output line the decoder's
    new tokens."""
    generation = module.generation
    takes = [spec.name for spec in module.encoder.io.inputs]
    if "pixel_values" in takes:  # an encoder that takes the image with the prompt (Florence-2's)
        inputs, tokenizer = _image_sources(args, takes)
        rows = len(args.prompt)
    elif args.image:
        raise InputError(
            f"--image given, but this encoder-decoder's encoder takes {', '.join(takes)}", fix="drop --image"
        )
    elif args.audio:
        from pipeline.cli.audio import audio_inputs

        inputs = audio_inputs(args.audio, args.feature_extractor, takes)
        rows = len(args.audio)
    elif "input_ids" not in takes or args.input_features is not None:
        wanted = "input_features" if args.input_features is not None else "input_ids"
        if wanted not in takes:
            given = "--input-features" if wanted == "input_features" else "prompts"
            other = "--prompt-ids or --prompt" if wanted == "input_features" else "--input-features or --audio"
            raise InputError(f"{given} given, but this model's encoder takes {', '.join(takes)}", fix=f"give {other}")
        inputs = {"input_features": read_features(args.input_features)}
        rows = inputs["input_features"].shape[0]
    else:
        sources = [read_ids(text) for text in args.prompt_ids] + [encode(tokenizer, text) for text in args.prompt]
        if any(not source for source in sources):
            raise InputError("a prompt is empty (no token ids)", fix="give at least one token id: 1,2,3")
        ids, mask = right_pad(sources, generation.pad_token_id or 0)
        inputs, rows = {"input_ids": ids, "attention_mask": mask}, len(sources)
    if rows * args.num_beams > generation.max_batch:
        raise InputError(
            f"{rows} input(s) x {args.num_beams} beam(s), but the artifact was converted for max_batch="
            f"{generation.max_batch}",
            fix="give fewer inputs or beams, or convert with a larger --generation max_batch",
        )
    options = {**decoding_options(args), **inputs}
    if args.stream:
        for count, tokens in enumerate(module.stream(**options)):
            shown = _text(tokenizer, [int(tokens[0])]) if tokenizer is not None else str(int(tokens[0]))
            print(("" if count == 0 or tokenizer is not None else " ") + shown, end="", flush=True)
        print(flush=True)
        return 0
    out = module.generate(**options)
    eos = set(options.get("eos_token_id", generation.eos_token_id))
    for row in range(rows):
        new = until_eos(out[row, 1:].tolist(), eos)  # after the decoder's start token
        print(_text(tokenizer, new) if tokenizer is not None else " ".join(map(str, new)))
    return 0


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


def right_pad(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources as one right-padded batch (encoders' tokenizers pad on the right): ``input_ids`` and
    ``attention_mask``."""
    import torch

    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad, dtype=torch.int64)
    mask = torch.zeros((len(prompts), longest), dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.int64)
        mask[row, : len(prompt)] = 1
    return ids, mask


def decoding_options(args: argparse.Namespace) -> dict[str, Any]:
    """``GenerativeModule.generate`` keyword arguments from :func:`add_decoding_arguments`'s options."""
    options: dict[str, Any] = {
        "max_new_tokens": args.max_new_tokens,
        "do_sample": args.do_sample,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "repetition_penalty": args.repetition_penalty,
        "seed": args.seed,
    }
    if args.num_beams > 1:
        options["num_beams"] = args.num_beams
    if args.ignore_eos:
        options["eos_token_id"] = []
    elif args.eos_token_id:
        options["eos_token_id"] = list(args.eos_token_id)
    return options


def _stream(
    module: Any, ids: torch.Tensor, mask: torch.Tensor, options: dict[str, Any], tokenizer: Any, echo: bool
) -> None:
    """One prompt's new tokens printed as they come: ids one by one, text through transformers' TextStreamer."""
    if tokenizer is not None:
        from transformers import TextStreamer

        streamer = TextStreamer(tokenizer, skip_prompt=not echo, skip_special_tokens=True)
        module.generate(ids, mask, streamer=streamer, **options)
        return
    if echo:
        print(" ".join(map(str, ids[0].tolist())), end=" ", flush=True)
    for count, tokens in enumerate(module.stream(ids, mask, **options)):
        print(("" if count == 0 else " ") + str(int(tokens[0])), end="", flush=True)
    print(flush=True)


def load_generative(path: Path, threads: int | None = None, spinning: bool | None = None) -> Any:
    """The :class:`~pipeline.runtime.generation.module.GenerativeModule` of a generation artifact (ONNX Runtime's
    ``threads`` and ``spinning`` as :func:`pipeline.load` takes them), or a clear error."""
    import pipeline
    from pipeline.runtime.generation.cross_images import CrossImagesModule
    from pipeline.runtime.generation.encoder_decoder import EncoderDecoderModule
    from pipeline.runtime.generation.module import GenerativeModule
    from pipeline.runtime.generation.vision_language import VisionLanguageModule

    if not path.exists():
        raise InputError(
            f"no such artifact: {path}", fix="give the model.ptrt that `pipeline convert ... --generation` wrote"
        )
    module = pipeline.load(path, threads=threads, spinning=spinning)
    if not isinstance(module, GenerativeModule | EncoderDecoderModule | VisionLanguageModule | CrossImagesModule):
        raise InputError(
            f"{path} is not a generation artifact: it was converted for the plain forward (one call, no KV cache)",
            fix="convert it with `pipeline convert SPEC --generation max_length=256,max_batch=4 -o OUTDIR`",
        )
    return module


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


def left_pad(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts as one left-padded batch: ``input_ids`` and ``attention_mask`` [batch, longest]."""
    import torch

    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad, dtype=torch.int64)
    mask = torch.zeros((len(prompts), longest), dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt) :] = torch.tensor(prompt, dtype=torch.int64)
        mask[row, longest - len(prompt) :] = 1
    return ids, mask


def until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """The new tokens up to and including the first end-of-sequence token (the rest is padding)."""
    for index, token in enumerate(tokens):
        if token in eos:
            return tokens[: index + 1]
    return tokens


def _text(tokenizer: Any, ids: list[int]) -> str:
    return str(tokenizer.decode(ids, skip_special_tokens=True))
