"""``pipeline convert SPEC --input NAME:SHAPE[:DTYPE] ... -o OUTDIR``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from converters.errors import InputError
from pipeline.cli.common import add_model_arguments, call_factory, dynamic_dims, load_spec, random_inputs

ARTIFACT_NAME = "model.ptrt"


def add_convert_command(commands: Any) -> None:
    """Add the ``convert`` subcommand to ``pipeline``'s subparsers."""
    convert = commands.add_parser("convert", help="convert a model and write the artifact, graph and report")
    add_model_arguments(convert, output_help="output directory")
    convert.add_argument("--backend", default="auto", choices=["auto", "onnxruntime", "tensorrt"])
    convert.add_argument("--no-validate", action="store_true", help="skip the comparison with PyTorch")
    convert.add_argument("--seed", type=int, default=0, help="seed of random inputs (CLI and validation)")
    convert.add_argument(
        "--precision",
        default="fp32",
        choices=["fp32", "fp16", "bf16", "int8", "fp8"],
        help="compute type of the graph (fp32 islands); int8/fp8: Q/DQ at MatMul/Gemm/Conv, the rest fp16",
    )
    convert.add_argument(
        "--calibration",
        metavar="FILE.pt|FILE.py:FACTORY",
        help="calibration samples for fp16/int8/fp8: a torch.save'd list of samples, or a factory returning them",
    )
    convert.add_argument(
        "--calibration-method", default="auto", choices=["auto", "max", "percentile", "entropy", "mse"]
    )
    convert.add_argument(
        "--keep-fp32",
        action="append",
        default=[],
        metavar="NODE|OP|MODULE",
        help="keep in float32: a node name, op type or PyTorch module path (node:, op:, module: to be explicit)",
    )
    convert.set_defaults(run=_convert)


def _convert(args: argparse.Namespace) -> int:
    from converters.files import write_file_atomically
    from pipeline.conversion import convert

    model, sample = load_spec(args.spec)
    if args.input:
        sample = ((), {name: tensor for name, tensor in random_inputs(args.input, args.seed)})
    if sample is None:
        raise InputError(
            f"{args.spec} returned a module but no sample, and no --input was given",
            fix="pass --input NAME:SHAPE[:DTYPE] for each forward() argument, or return (module, sample)",
        )
    module = convert(
        model,
        sample,
        backend=args.backend,
        validate=not args.no_validate,
        seed=args.seed,
        dynamic=dynamic_dims(args.dynamic),
        precision=args.precision,
        keep_fp32=tuple(args.keep_fp32),
        calibration=_calibration(args.calibration),
        calibration_method=args.calibration_method,
    )
    out: Path = args.output
    artifact = module.save(out / ARTIFACT_NAME)
    module.save_onnx(out / "model.onnx")  # with model.onnx.data beside it when the weights are external
    write_file_atomically(out / "report.json", json.dumps(module.report.to_dict(), indent=2).encode())
    print(module.report.summary())
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
