"""``pipeline convert SPEC --input NAME:SHAPE[:DTYPE] ... -o OUTDIR``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from converters.errors import InputError
from pipeline.cli.common import (
    add_conversion_arguments,
    add_model_arguments,
    call_factory,
    conversion_options,
    model_and_sample,
    staged_output,
)
from pipeline.cli.engine_options import add_engine_option_arguments, engine_options

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
    convert.set_defaults(run=_convert)


def _convert(args: argparse.Namespace) -> int:
    from converters.files import write_file_atomically
    from pipeline.conversion import convert

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
            **conversion_options(args),
            **engine_options(args),
        )
        module.save(staging / ARTIFACT_NAME)
        module.save_onnx(staging / "model.onnx")  # with model.onnx.data beside it when the weights are external
        write_file_atomically(staging / "report.json", json.dumps(module.report.to_dict(), indent=2).encode())
    artifact = out / ARTIFACT_NAME
    print(module.report.summary())
    engine = module.engine_bytes
    if engine is not None:
        print(f"engine    {len(engine) / 1e6:.1f} MB {module.backend} engine in the artifact")
    print(f"artifact  {artifact}  (graph: {out / 'model.onnx'}, report: {out / 'report.json'})")
    return 0


def _calibration(spec: str | None) -> list[Any] | None:
    """``--calibration``: a ``.pt`` file holding a list of samples, or ``file.py:factory`` returning an iterable."""
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
