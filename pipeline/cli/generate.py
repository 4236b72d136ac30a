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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from converters.errors import InputError
from pipeline.cli.generate_inputs import (
    check_media,
    check_prompts,
    encode,
    image_sources,
    load_tokenizer,
    padded,
    read_features,
    read_ids,
    text_of,
    until_eos,
)

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
    parser.add_argument(
        "--do-sample",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="sample, or not (default: as the model's generation config says; greedy when it says nothing)",
    )
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (1.0)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the K most likely (50; 0: all)")
    parser.add_argument("--top-p", type=float, default=None, help="sample among the most likely tokens up to P")
    parser.add_argument("--seed", type=int, default=None, help="seed of the draws (same seed, same tokens)")
    parser.add_argument("--repetition-penalty", type=float, default=None, help="transformers' repetition penalty")
    parser.add_argument(
        "--num-beams",
        type=int,
        default=None,
        metavar="N",
        help="beam search over N beams (1: off; default: the model's)",
    )
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
    if args.stream and (args.num_beams or 1) > 1:
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
    ids, mask = padded(prompts, module.generation.pad_token_id or 0, "left")
    options = decoding_options(args)
    if args.stream:
        _stream(module, ids, mask, options, tokenizer, args.echo)
        return 0
    out = module.generate(ids, mask, **options)
    eos = set(options.get("eos_token_id", module.generation.eos_token_id))
    for row, prompt in enumerate(prompts):
        new = until_eos(out[row, ids.shape[1] :].tolist(), eos)
        shown = (prompt if args.echo else []) + new
        print(text_of(tokenizer, shown) if tokenizer is not None else " ".join(map(str, shown)))
    return 0


def _generate_vision_language(module: Any, args: argparse.Namespace) -> int:
    """A vision-language model's decoding (images placed in the prompt, or cross-attended: Mllama, IDEFICS; audio for
    an audio-language model's): each --prompt with its --image (--audio) through the model's processor, each output
    line the prompt's new tokens as text."""
    from pipeline.cli.images import image_prompts, load_processor

    audio = getattr(module, "modality", "image") == "audio"
    check_media(args, audio)
    processor = load_processor(args.processor)
    if audio:
        from pipeline.cli.audio import audio_prompts, check_audio_frames

        inputs = audio_prompts(processor, args.prompt, args.audio)
        check_audio_frames(module, inputs, args.audio, processor)
    else:
        inputs = image_prompts(processor, args.prompt, args.image)
    rows = len(args.prompt)
    if rows * (args.num_beams or 1) > module.generation.max_batch:
        raise InputError(
            f"{rows} prompt(s) x {args.num_beams} beam(s), but the artifact was converted for max_batch="
            f"{module.generation.max_batch}",
            fix="give fewer prompts or beams, or convert with a larger --generation max_batch",
        )
    options = decoding_options(args)
    if args.stream:
        tokens = [int(step[0]) for step in module.stream(**inputs, **options)]
        print(text_of(processor.tokenizer, tokens), flush=True)
        return 0
    out = module.generate(**inputs, **options)
    eos = set(options.get("eos_token_id", module.generation.eos_token_id))
    # the sequences start with the prompts as the model's generate hands them on (BLIP's is one token shorter)
    width = inputs["input_ids"].shape[1] - getattr(module, "dropped_prompt_tokens", 0)
    for row in range(rows):
        print(text_of(processor.tokenizer, until_eos(out[row, width:].tolist(), eos)))
    return 0


def _generate_encoder_decoder(module: Any, args: argparse.Namespace, tokenizer: Any) -> int:
    """An encoder-decoder's decoding: the sources (or features) through its encoder, each output line the decoder's
    new tokens."""
    generation = module.generation
    takes = [spec.name for spec in module.encoder.io.inputs]
    if "pixel_values" in takes:  # an encoder that takes the image with the prompt (Florence-2's)
        inputs, tokenizer = image_sources(args, takes)
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
        ids, mask = padded(sources, generation.pad_token_id or 0, "right")
        inputs, rows = {"input_ids": ids, "attention_mask": mask}, len(sources)
    if rows * (args.num_beams or 1) > generation.max_batch:
        raise InputError(
            f"{rows} input(s) x {args.num_beams} beam(s), but the artifact was converted for max_batch="
            f"{generation.max_batch}",
            fix="give fewer inputs or beams, or convert with a larger --generation max_batch",
        )
    options = {**decoding_options(args), **inputs}
    if args.stream:
        for count, tokens in enumerate(module.stream(**options)):
            shown = text_of(tokenizer, [int(tokens[0])]) if tokenizer is not None else str(int(tokens[0]))
            print(("" if count == 0 or tokenizer is not None else " ") + shown, end="", flush=True)
        print(flush=True)
        return 0
    out = module.generate(**options)
    eos = set(options.get("eos_token_id", generation.eos_token_id))
    for row in range(rows):
        new = until_eos(out[row, 1:].tolist(), eos)  # after the decoder's start token
        print(text_of(tokenizer, new) if tokenizer is not None else " ".join(map(str, new)))
    return 0


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
    options = {name: value for name, value in options.items() if value is not None}  # else the model's defaults
    if args.num_beams is not None:  # 1 turns the model's own beams off
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
