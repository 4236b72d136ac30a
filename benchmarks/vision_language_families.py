"""Which transformers vision-language families generate token-identically after ``convert(..., generation=...)``.

The families are every model type of transformers' ``MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES``, read from
transformers, not listed here. Each model is the every-type source's (``tests/model_sources/transformers_all_models
.py``): one generic shrinker, the sample found among the inputs its forward names, with one image and as many
placeholder tokens as the model takes; its matrices drawn wider so that greedy tokens vary, eos off (an
encoder-decoder's sample without its decoder inputs: generation makes them). The batch is two prompts: the sample's
padded by 2 tokens (on the left; an encoder-decoder's on the right, as its tokenizer pads) and a copy with 2 more text
tokens there and another image.

For each family, in a process of its own (a crash or a hang is that family's row): transformers' own
``model.generate`` on the batch (else the row says "cannot run eagerly" and why), then
``pipeline.convert(model, batch, generation={"max_length": 64, "max_batch": 8}, precision=..., validate=True)`` on
ONNX Runtime (``max_length`` raised in steps of 64 for a longer prompt; ``--precision``: fp32, or fp16 judged by the
conversion's validation under the accuracy policy); greedy 8 new tokens and beam search with 4 beams compared with
``model.generate``'s; every greedy step's scores compared with transformers' (``output_scores``: the largest
difference, 1e-3 the fp32 goal); the module saved and loaded back gives the same greedy tokens; then the family is
converted again for TensorRT-RTX (the same precision, ``validate=False``), whose real builder builds both graphs ahead
of time on this CPU machine. Rows are appended to ``--jsonl`` as they finish: a stopped run resumes. Features that draw
random numbers: converted again with the options the refusal's fix names (``sample=False``), as the row's note says.

Run from the repository root::

    python benchmarks/vision_language_families.py                      # every family, the markdown table
    python benchmarks/vision_language_families.py --only llava gemma3 --precision fp16 --jsonl vlm16.jsonl
    python benchmarks/vision_language_families.py --audio --jsonl alm.jsonl   # audio-language decoders

``--audio`` sweeps the audio-language decoders instead: the model types transformers maps as speech or
sequence-to-sequence LMs whose config is not an encoder-decoder (a decoder-only LM with an audio encoder: Voxtral,
GLM-ASR, Audio Flamingo 3, ...), and the types of its image-text and multimodal-LM mappings whose class takes audio
(``get_audio_features`` on it or its base model, or a forward taking ``input_features`` or ``input_values``: Gemma 3n
and 4, Qwen Omni's thinkers, Nemotron-H Omni, Muse Spark), from ``audio_samples.py``. Their every-type source's sample
is text alone: the sample is one audio (the first layout of the source's ``input_features``, then of the audio
config's widths, on which its ``get_audio_features`` and its forward run, with a mask of every frame, as integers or
else booleans, where it takes one) and as many audio tokens as the features it gives, between text; a config that
names no audio token (Voxtral's default) is given the vocabulary's last id its image and video tokens leave, as a
checkpoint's config names one; a small config that leaves its optional audio branch off (Nemotron-H Omni's) is given
its audio type's small config. A model without ``get_audio_features`` (Qwen2-Audio's forward computes its features)
is given the first layout its forward runs on, a mask of every frame for its audio masks, and as many audio tokens as
its own count check says the audio gives; a model whose ``generate`` gives no token ids (VibeVoice's speech) is said
so.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import tests_environment  # noqa: E402, F401 -- torchvision's operator schemas, before transformers imports it
import torch  # noqa: E402
import transformers  # noqa: E402
from audio_samples import audio_families, audio_sample, fitted_audio_model  # noqa: E402
from family_sweep import (  # noqa: E402
    PRECISIONS,
    CannotRunEagerly,
    eager_tokens,
    first_line,
    quiet,
    resumed_rows,
    row_of,
    rtx_builds,
    score_cell,
    scores_clause,
    scores_gap,
)
from model_sources import transformers_all_models as every  # noqa: E402
from transformers.generation.utils import GenerationMixin  # noqa: E402

import pipeline  # noqa: E402
from converters.errors import InputError  # noqa: E402
from pipeline.generation.vision_inputs import IMAGES  # noqa: E402

NEW_TOKENS = 8
BEAMS = 4
BATCH = 2
GENERATION = {"max_length": 64, "max_batch": BATCH * BEAMS}  # max_length grows with a longer prompt: generation_of
GREEDY = {"max_new_tokens": NEW_TOKENS, "do_sample": False}
PAD = 2  # the second prompt's left padding
SWEEP_AUDIO = False  # --audio: the audio-language decoders


def families() -> dict[str, str]:
    """model type -> its image-text-to-text class, from transformers' mapping."""
    from transformers.models.auto import modeling_auto

    names = modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    return {kind: name if isinstance(name, str) else name[0] for kind, name in sorted(names.items())}


def another_image(value: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Another image of ``value``'s shape: its float values drawn again, its whole-number ones kept (the row and column
    Pix2Struct's and Kosmos-2.5's patches start with); an integer tensor as it is."""
    if not value.is_floating_point():
        return value
    return torch.where(value == value.round(), value, torch.randn(value.shape, generator=generator))


def batch_of_two(sample: dict[str, torch.Tensor], right: bool = False) -> dict[str, torch.Tensor]:
    """The sample's prompt padded by :data:`PAD` tokens (on the left, or on the ``right`` as an encoder-decoder's
    tokenizer pads its source) and a copy with :data:`PAD` more text tokens there and another image: a batch of two.
    A sample without a prompt (an image-to-text encoder-decoder's: Donut's, TrOCR's, Pix2Struct's patches) is its image
    and another, whose whole-number values are kept (the row and column Pix2Struct's patches start with)."""
    generator = torch.Generator().manual_seed(3)
    if "input_ids" not in sample:
        batch = {name: torch.cat([value, another_image(value, generator)]) for name, value in sample.items()}
        mask = batch.get("attention_mask")
        if mask is not None and mask.shape[1] > PAD:  # the first image's last patches are padding, as a processor pads
            mask[0, -PAD:] = 0
            for name, value in batch.items():
                if name != "attention_mask" and value.shape[:2] == mask.shape:
                    value[0, -PAD:] = 0
        return batch
    ids = sample["input_ids"]
    mask = sample.get("attention_mask", torch.ones_like(ids))
    pad = torch.zeros(1, PAD, dtype=ids.dtype)

    def padded(value: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        return torch.cat([value, extra] if right else [extra, value], 1)

    text = ids[:, -PAD:]  # text tokens (the sample's prompt ends in text)
    batch = {
        "input_ids": torch.cat([padded(ids, pad), padded(ids, text)]),
        "attention_mask": torch.cat([padded(mask, pad), padded(mask, torch.ones_like(pad))]),
    }
    for name, value in sample.items():
        if name in batch:
            continue
        if value.shape == ids.shape:  # one per token (M-RoPE's mm_token_type_ids): the added tokens are text
            batch[name] = torch.cat([padded(value, torch.zeros_like(pad))] * 2).to(value.dtype)
        elif value.dim() == 3 and value.shape[:2] == ids.shape:  # a vector per token (UDOP's boxes): zeros added
            extra = torch.zeros(1, PAD, value.shape[-1], dtype=value.dtype)
            batch[name] = torch.cat([padded(value, extra)] * 2)
        elif value.is_floating_point():  # another image for the second prompt
            batch[name] = torch.cat([value, another_image(value, generator)])
        else:
            batch[name] = torch.cat([value, value])
    return batch


def generation_sample(model: torch.nn.Module, sample: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What ``generate`` takes of the forward's sample: an encoder-decoder's (Florence-2's) decoder inputs are what
    generation makes, its sample is the encoder's side (the prompt, its images)."""
    if not getattr(model.config, "is_encoder_decoder", False):
        return sample
    return {name: value for name, value in sample.items() if not name.startswith("decoder_")}


def run_family(kind: str, class_name: str, precision: str, row: dict[str, Any]) -> dict[str, Any]:
    """One family's row, filled in ``row`` as it goes."""
    scored = {**GREEDY, "output_scores": True, "return_dict_in_generate": True}
    model_class = getattr(transformers, class_name, None)
    if isinstance(model_class, type) and not issubclass(model_class, GenerationMixin):
        row["converts"] = "not autoregressive"
        row["error"] = (
            f"{class_name} generates with a loop of its own, not transformers' GenerationMixin token by token "
            f"({', '.join(c.__name__ for c in model_class.__mro__ if 'Generation' in c.__name__) or 'no generate'}): "
            "generation= converts autoregressive decoders"
        )
        return row
    try:
        model, (_args, sample) = every.build(kind, class_name)
        if SWEEP_AUDIO:
            model = fitted_audio_model(kind, model)
            sample = audio_sample(model)
        elif not set(IMAGES.main_inputs) & set(sample):  # an image, or an image's patches (Pix2Struct's)
            raise CannotRunEagerly(text_alone(model, sample))
        model = quiet(model)
        # an encoder-decoder's source is padded on the right, as its tokenizer pads it (BART's): a drawn validation
        # input cropped to one source token then keeps it unmasked
        inputs = batch_of_two(
            generation_sample(model, sample), right=bool(getattr(model.config, "is_encoder_decoder", 0))
        )
        inputs = inputs if SWEEP_AUDIO else joined_batch(model, sample, inputs)
        expected_greedy, expected_beam = eager_tokens(
            model, inputs, row, GREEDY, BEAMS, failure=lambda error: batch_failure(model, inputs, error)
        )
    except (CannotRunEagerly, InputError):  # an InputError: the conversion refused the model (the row's reason)
        raise
    except Exception as error:  # noqa: BLE001 - transformers' own failure on the small config: the row says why
        raise CannotRunEagerly(f"{type(error).__name__}: {first_line(error)}") from error
    if not isinstance(expected_greedy, torch.Tensor):  # a model that generates audio (VibeVoice's speech)
        row["converts"] = "not token generation"
        row["error"] = f"{class_name}.generate returns a {type(expected_greedy).__name__}, not token ids"
        return row
    start = time.perf_counter()
    module, converted = converted_module(model, inputs, precision, row)
    if converted is not inputs:  # with the options the refusal named: transformers' tokens with them too
        inputs = converted
        expected_greedy, expected_beam = eager_tokens(
            model, inputs, row, GREEDY, BEAMS, failure=lambda error: batch_failure(model, inputs, error)
        )
    row["convert_s"] = round(time.perf_counter() - start, 1)
    row["converts"] = "yes"
    ours = module.generate(**inputs, **GREEDY)
    row["greedy"] = torch.equal(ours, expected_greedy)
    if expected_beam is not None:
        row["beam"] = torch.equal(module.generate(**inputs, **GREEDY, num_beams=BEAMS), expected_beam)
    with torch.no_grad():
        expected_scores = model.generate(**inputs, **scored)
    row["scores"] = score_cell(scores_gap(expected_scores, module.generate(**inputs, **scored)), precision)
    with tempfile.TemporaryDirectory() as directory:
        module.save(Path(directory) / kind)
        loaded = pipeline.load(Path(directory) / kind)
        row["reloaded"] = torch.equal(loaded.generate(**inputs, **GREEDY), ours)
    row["rtx"] = rtx_builds(model, inputs, generation_of(inputs), precision)
    return row


def converted_module(model: torch.nn.Module, inputs: dict[str, Any], precision: str, row: dict) -> tuple[Any, dict]:
    """``pipeline.convert`` on ``inputs`` (validated) and the inputs it converted: where it refuses features that draw
    random numbers, once more with the options its fix names (``sample=False``) in them, as the row's note says."""
    while True:
        try:
            generation = generation_of(inputs)
            return pipeline.convert(model, inputs, generation=generation, precision=precision, validate=True), inputs
        except InputError as error:
            named = dict(re.findall(r"(\w+)=(False|True) in the generation sample", error.fix or ""))
            if "random numbers" not in error.message or not named or set(named) <= set(inputs):
                raise
        inputs = {**inputs, **{name: value == "True" for name, value in named.items()}}
        row["error"] = f"converted (and compared) with {', '.join(f'{n}={v}' for n, v in named.items())} in the "
        row["error"] += "sample and to generate, as the refusal's fix names (its features draw random numbers else)"


def joined_batch(model: torch.nn.Module, sample: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> dict:
    """``batch`` with its two images laid out as the model's ``get_image_features`` gives each image's own features
    (``every.joined_images``): one leading row each, as :func:`batch_of_two` stacks them, else packed in one row
    (MiniCPM-V's processor lays a batch's images side by side); as it is when neither does."""
    from pipeline.generation.vision_inputs import TEXT_INPUTS, image_input_names

    names = [n for n in image_input_names(model) if n in sample and n in batch and n not in TEXT_INPUTS]
    if not names or any(batch[n].shape[0] != 2 * sample[n].shape[0] for n in names):
        return batch
    first = {n: sample[n] for n in names}
    second = {n: batch[n][sample[n].shape[0] :] for n in names}
    joined = every.joined_images(model, first, second)
    return batch if joined is None else {**batch, **joined}


def text_alone(model: torch.nn.Module, sample: dict[str, torch.Tensor]) -> str:
    """Why the every-type source found no image sample: the head's forward takes no image (a text model that
    transformers maps as image-text-to-text), or the inputs its ``get_image_features`` requires beside the image."""
    from pipeline.generation.vision_inputs import image_features_method

    found = f"runs on text alone ({', '.join(sorted(sample))}): no image sample was found"
    taken = inspect.signature(model.forward).parameters
    if not set(IMAGES.main_inputs) & set(taken):
        name = type(model).__name__
        return f"{found}: {name}'s forward takes no image (transformers maps the type as image-text-to-text)"
    if "pixel_values" not in taken:  # Kosmos-2.5's image is Pix2Struct's patches beside the prompt
        return f"{found}: its image is flattened_patches beside input_ids, which the every-type source does not make"
    method = image_features_method(model)
    if method is None:
        return found
    parameters = inspect.signature(method).parameters.values()
    required = [p.name for p in parameters if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    extra = [name for name in required if name != "pixel_values"]
    return f"{found}: get_image_features also requires {', '.join(extra)}" if extra else found


def batch_failure(model: torch.nn.Module, inputs: dict[str, torch.Tensor], error: Exception) -> str:
    """transformers' failure on the batch of two, saying so when each prompt (with its image) runs alone: the model
    lays out a batch's images otherwise than one leading row per image (MiniCPM-V packs every image's patches into
    one row), which the sweep's batch and the conversion's image rows take."""
    said = f"{type(error).__name__}: {first_line(error)}"
    try:
        with torch.no_grad():
            for row in range(BATCH):
                model(**{name: value[row : row + 1] for name, value in inputs.items()})
    except Exception:  # noqa: BLE001 - a prompt fails alone too: transformers' own failure
        return said
    return (
        f"each prompt runs alone but not the batch of two (an image per leading row of {', '.join(sorted(inputs))}): "
        f"{said}; the model lays out a batch's images otherwise than one leading row per image"
    )


def generation_of(inputs: dict[str, torch.Tensor]) -> dict[str, int]:
    """:data:`GENERATION`, its ``max_length`` raised (in steps of 64) to hold a longer prompt (InternVL's 256 image
    tokens) and the new tokens (an image-to-text encoder-decoder's decoder starts from its start token alone)."""
    prompt = inputs.get("input_ids")
    needed = (int(prompt.shape[1]) if prompt is not None else 1) + NEW_TOKENS + 1
    return {**GENERATION, "max_length": max(GENERATION["max_length"], -(-needed // 64) * 64)}


def markdown(rows: list[dict[str, Any]], precision: str) -> str:
    """The results table and its summary line."""
    head = "| family | converts | greedy equal | greedy scores, max difference | beam (4) equal |"
    head += " saved + loaded equal | TensorRT-RTX builds | convert s | greedy tokens |"
    lines = [head + " error (or note) |", "|---" * head.count("|") + "|"]
    yes = {True: "yes", False: "**no**", None: ""}
    for r in rows:
        beam = r.get("beam")
        cells = [r["family"], r.get("converts", ""), yes[r.get("greedy")], r.get("scores", "")]
        cells += [beam if isinstance(beam, str) else yes[beam], yes[r.get("reloaded")], r.get("rtx", "")]
        cells += [r.get("convert_s", ""), r.get("tokens", ""), r.get("error", "")]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    eager = [r for r in rows if r.get("converts") != "cannot run eagerly"]
    converted = [r for r in eager if r.get("converts") == "yes"]
    equal = [r for r in converted if r.get("greedy") and r.get("beam") is not False and r.get("reloaded")]
    built = [r for r in converted if str(r.get("rtx", "")).startswith("yes")]
    lines += [
        "",
        f"{len(rows)} model types, {precision}: {len(eager)} run eagerly with "
        f"{'an audio' if SWEEP_AUDIO else 'an image'} from the small config, "
        f"{len(converted)} convert (validated), {len(equal)} decode as transformers does (greedy, beam search, saved "
        f"+ loaded){scores_clause(converted, precision)}, TensorRT-RTX builds both graphs of {len(built)}",
    ]
    return "\n".join(lines)


def main() -> None:
    """Run the families (resuming from ``--jsonl``) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="model types (as transformers names them: llava, gemma3)")
    parser.add_argument("--jsonl", type=Path, default=Path("vision_language_families.jsonl"), help="rows, resumable")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one family may take")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32", help="the conversions' precision")
    parser.add_argument("--audio", action="store_true", help="the audio-language decoders (see the docstring)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one family, its row printed as JSON
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    warnings.simplefilter("ignore")
    global SWEEP_AUDIO
    SWEEP_AUDIO = args.audio
    known = audio_families() if SWEEP_AUDIO else families()
    if args.child:
        print(json.dumps(row_of(run_family, args.child, known[args.child], args.precision)), flush=True)
        return
    chosen = [kind for kind in known if not args.only or kind in args.only]
    what = "audio-language" if SWEEP_AUDIO else "image-text-to-text"
    print(f"{len(known)} {what} model types in transformers; {len(chosen)} chosen", flush=True)
    flags = ["--precision", args.precision, *(["--audio"] if SWEEP_AUDIO else [])]
    done = resumed_rows(__file__, chosen, args.jsonl, args.timeout, flags)
    print(markdown([done[kind] for kind in chosen if kind in done], args.precision))


if __name__ == "__main__":
    main()
