"""``pipeline convert SPEC --input NAME:SHAPE[:DTYPE] ... -o OUTDIR``."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from converters.errors import InputError
from converters.settings import GenerationSettings
from pipeline.cli.common import (
    add_conversion_arguments,
    add_model_arguments,
    call_factory,
    conversion_options,
    model_and_sample,
    staged_output,
)
from pipeline.cli.engine_options import add_engine_option_arguments, engine_options

if TYPE_CHECKING:
    pass

ARTIFACT_NAME = "model.ptrt"
OUTPUTS = (ARTIFACT_NAME, "model.onnx", "model.onnx.data", "report.json")


def add_convert_command(commands: Any) -> None:
    """Add the ``convert`` subcommand to ``pipeline``'s subparsers."""
    convert = commands.add_parser("convert", help="convert a model and write the artifact, graph and report")
    add_model_arguments(convert, output_help="output directory")
    convert.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "onnxruntime", "tensorrt", "tensorrt-rtx"],
        help="tensorrt-rtx builds a TensorRT-RTX engine without a GPU (run where a supported GPU is)",
    )
    convert.add_argument(
        "--compute-capability",
        action="append",
        default=[],
        metavar="X.Y",
        help="TensorRT-RTX target GPU compute capability (repeatable; default: TensorRT-RTX's portable set)",
    )
    convert.add_argument(
        "--require-engine-runtime",
        action="store_true",
        help="fail when the engine cannot run here instead of running the same graph on ONNX Runtime",
    )
    convert.add_argument("--no-validate", action="store_true", help="skip the comparison with PyTorch")
    add_conversion_arguments(convert)
    add_engine_option_arguments(convert)
    convert.add_argument(
        "--calibration",
        metavar="FILE.pt|FILE.py:FACTORY",
        help="calibration samples for fp16/int8/fp8/int4/nvfp4: a torch.save'd list of samples, or a factory "
        "returning them",
    )
    convert.add_argument(
        "--calibration-method",
        default="auto",
        choices=["auto", "max", "percentile", "entropy", "mse", "awq"],
        help="int8/fp8: how activation ranges are calibrated; int4/nvfp4: max or awq (activation-aware scales)",
    )
    convert.add_argument(
        "--generation",
        nargs="?",
        const="",
        default=None,
        metavar="KEY=VALUE,...",
        help="a transformers causal LM as one cached decoder step, for `pipeline generate`: e.g. "
        "max_length=256,max_batch=4 (also max_prompt, eos_token_id=2+7, pad_token_id, attention=auto|onnx|decomposed)",
    )
    convert.set_defaults(run=_convert)


def _convert(args: argparse.Namespace) -> int:
    from converters.files import write_file_atomically
    from pipeline.conversion import convert

    generation = generation_settings(args.generation)  # read before the model is built: a typo fails at once
    model, sample = model_and_sample(args.spec, args.input, args.seed)
    out: Path = args.output
    with staged_output(out, OUTPUTS) as staging:  # checked before converting; all three files, or none
        module = convert(
            model,
            sample,
            backend=args.backend,
            validate=not args.no_validate,
            trt_compute_capabilities=tuple(args.compute_capability),
            require_engine_runtime=args.require_engine_runtime,
            calibration=_calibration(args.calibration),
            calibration_method=args.calibration_method,
            generation=generation,
            **conversion_options(args),
            **engine_options(args),
        )
        saved = module.save(staging / ARTIFACT_NAME)
        # with model.onnx.data beside it when the weights are external; a generation module's other graphs beside
        written = module.save_onnx(staging / "model.onnx")
        write_file_atomically(staging / "report.json", json.dumps(module.report.to_dict(), indent=2).encode())
        members = sorted(p.relative_to(saved).as_posix() for p in saved.rglob("*.ptrt")) if saved.is_dir() else []
    artifact = out / ARTIFACT_NAME
    print(module.report.summary())
    engine = module.engine_bytes
    if engine is not None:
        print(f"engine    {len(engine) / 1e6:.1f} MB {module.backend} engine in the artifact")
    held = f" (a directory of {', '.join(members)})" if members else ""
    graphs = ", ".join(str(out / p.name) for p in written if p.suffix == ".onnx") or str(out / "model.onnx")
    print(f"artifact  {artifact}{held}  (graphs: {graphs}; report: {out / 'report.json'})")
    step = module.settings.generation
    if step is not None:
        print(
            f"generate  max_length {step.max_length}, max_batch {step.max_batch}, {step.layers} cached layers, eos "
            f"{list(step.eos_token_id)}: {generate_command(module, artifact)}"
        )
    return 0


def generate_command(module: Any, artifact: Path) -> str:
    """The ``pipeline generate`` line a converted generation module takes: images and prompts through its processor
    for a vision-language model (and an encoder that takes the image), audio and prompts for an audio-language model,
    input features for a speech encoder-decoder, token ids otherwise."""
    from pipeline.runtime.generation.cross_images import CrossImagesModule
    from pipeline.runtime.generation.encoder_decoder import EncoderDecoderModule
    from pipeline.runtime.generation.vision_language import VisionLanguageModule

    if isinstance(module, VisionLanguageModule) and module.modality == "audio":  # Voxtral's, GLM-ASR's
        return f"pipeline generate {artifact} --processor DIR --prompt 'TEXT WITH THE AUDIO PLACEHOLDER' --audio A.wav"
    if isinstance(module, VisionLanguageModule | CrossImagesModule):
        return f"pipeline generate {artifact} --processor DIR --prompt 'TEXT WITH THE IMAGE PLACEHOLDER' --image FILE"
    sources = module.encoder.io.inputs if isinstance(module, EncoderDecoderModule) else ()
    if any(spec.name == "pixel_values" for spec in sources):  # an image with the prompt (Florence-2's encoder)
        return f"pipeline generate {artifact} --processor DIR --prompt 'TEXT' --image FILE"
    if any(spec.name == "input_features" for spec in sources):
        return f"pipeline generate {artifact} --input-features FILE.npy (or --audio FILE.wav --feature-extractor DIR)"
    return f"pipeline generate {artifact} --prompt-ids 1,2,3"


#: ``--generation`` keys whose values are not a single whole number.
_TEXT_KEYS = ("attention",)


def generation_settings(text: str | None) -> dict[str, Any] | None:
    """``convert``'s ``generation=`` from ``--generation KEY=VALUE,...`` (``--generation`` alone: the defaults);
    ``eos_token_id`` takes several ids joined by ``+``."""
    if text is None:
        return None
    settings: dict[str, Any] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        try:
            if not sep or not key or not value:
                raise ValueError(item)
            if key in _TEXT_KEYS:
                settings[key] = value.strip()
            elif key == "eos_token_id":
                settings[key] = tuple(int(v) for v in value.split("+"))
            else:
                settings[key] = int(value)
        except ValueError:
            raise InputError(
                f"cannot read --generation {item!r}",
                fix="write --generation max_length=256,max_batch=4 (whole numbers; eos_token_id=2+7 for several)",
            ) from None
    known = {f.name for f in dataclasses.fields(GenerationSettings)} - {"layers"}  # layers: found at conversion
    unknown = sorted(set(settings) - known)
    if unknown:
        raise InputError(
            f"unknown generation setting(s) {', '.join(unknown)} in --generation",
            fix=f"known: {', '.join(sorted(known))}",
        )
    return settings


def _calibration(spec: str | None) -> list[Any] | None:
    """``--calibration``: a ``.pt`` file holding a list of samples, or ``file.py:factory`` returning an iterable."""
    import torch

    if spec is None:
        return None
    if spec.endswith(".pt"):
        path = Path(spec)
        if not path.is_file():
            raise InputError(f"--calibration {spec}: no such file", fix="give a file written by torch.save([...])")
        samples = torch.load(path, weights_only=True)
    else:
        samples = call_factory(spec)
    if isinstance(samples, torch.Tensor) or not hasattr(samples, "__iter__"):
        raise InputError(
            f"--calibration {spec} gave {type(samples).__name__}, not a list of samples",
            fix="save or return a list of samples, each like the model's sample (a tensor, a tuple, or (args, kwargs))",
        )
    return list(samples)
