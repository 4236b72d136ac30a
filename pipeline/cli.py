"""Command line: ``pipeline convert SPEC --input NAME:SHAPE[:DTYPE] ... -o OUTDIR``."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from converters.errors import InputError, PipelineError

ARTIFACT_NAME = "model.ptrt"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    try:
        return int(args.run(args))
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def add_model_arguments(parser: argparse.ArgumentParser, *, output_help: str) -> None:
    """The arguments that say which model to take and how to call it (shared by convert and compare)."""
    parser.add_argument(
        "spec",
        help="path/to/file.py:factory or package.module:factory; the factory returns a module or (module, sample)",
    )
    parser.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME:SHAPE[:DTYPE]",
        help="a forward() argument, e.g. x:1x3x224x224 or input_ids:1x128:int64 (random values)",
    )
    parser.add_argument(
        "--dynamic",
        action="append",
        default=[],
        metavar="INPUT:AXIS:NAME:MIN:OPT:MAX",
        help="a dynamic dimension, e.g. x:0:batch:1:8:32",
    )
    parser.add_argument("-o", "--output", required=True, type=Path, help=output_help)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipeline", description="PyTorch -> ONNX -> TensorRT / ONNX Runtime")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    convert = commands.add_parser("convert", help="convert a model and write the artifact, graph and report")
    add_model_arguments(convert, output_help="output directory")
    convert.add_argument("--backend", default="auto", choices=["auto", "onnxruntime", "tensorrt"])
    convert.add_argument("--no-validate", action="store_true", help="skip the comparison with PyTorch")
    convert.add_argument("--seed", type=int, default=0, help="seed of random inputs (CLI and validation)")
    convert.add_argument(
        "--precision", default="fp32", choices=["fp32", "fp16", "bf16"], help="compute type of the graph (fp32 islands)"
    )
    convert.add_argument(
        "--keep-fp32",
        action="append",
        default=[],
        metavar="NODE|OP|MODULE",
        help="keep in float32: a node name, op type or PyTorch module path (node:, op:, module: to be explicit)",
    )
    convert.set_defaults(run=_convert)
    checker = commands.add_parser("check", help="will TensorRT's ONNX parser accept this graph? (no TensorRT needed)")
    checker.add_argument("model", type=Path, help="an ONNX file")
    checker.add_argument("--trt-version", default=None, help="TensorRT version to check against (default 11.1)")
    checker.add_argument("--json", action="store_true", help="print the report as JSON")
    checker.set_defaults(run=_check)
    from pipeline.compare_cli import add_compare_command

    add_compare_command(commands)
    return parser


def _check(args: argparse.Namespace) -> int:
    from pipeline.parser_check import check
    from pipeline.trt_ops import DEFAULT_TRT_VERSION

    report = check(args.model, trt_version=args.trt_version or DEFAULT_TRT_VERSION)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.summary())
    return 0 if report.ok else 1


def _convert(args: argparse.Namespace) -> int:
    from converters.files import write_file_atomically
    from pipeline.conversion import convert

    model, sample = load_spec(args.spec)
    if args.input:
        sample = ((), {name: tensor for name, tensor in _random_inputs(args.input, args.seed)})
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
        dynamic=_dynamic(args.dynamic),
        precision=args.precision,
        keep_fp32=tuple(args.keep_fp32),
    )
    out: Path = args.output
    artifact = module.save(out / ARTIFACT_NAME)
    module.save_onnx(out / "model.onnx")  # with model.onnx.data beside it when the weights are external
    write_file_atomically(out / "report.json", json.dumps(module.report.to_dict(), indent=2).encode())
    print(module.report.summary())
    print(f"artifact  {artifact}  (graph: {out / 'model.onnx'}, report: {out / 'report.json'})")
    return 0


def load_spec(spec: str) -> tuple[torch.nn.Module, Any]:
    """The model (and sample, when the factory returns one) named by ``SPEC``."""
    built = call_factory(spec)
    if isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], torch.nn.Module):
        return built[0], built[1]
    if isinstance(built, torch.nn.Module):
        return built, None
    raise InputError(
        f"{spec} returned {type(built).__name__}", fix="the factory must return an nn.Module or (module, sample)"
    )


_SOURCES: dict[str, Any] = {}  # a file is executed once, so the model and its converters share custom ops


def call_factory(spec: str) -> Any:
    """Call the factory named by ``path/to/file.py:factory`` or ``package.module:factory``."""
    target, sep, factory_name = spec.rpartition(":")
    if not sep or not target or not factory_name:
        raise InputError(f"cannot read spec {spec!r}", fix="write path/to/file.py:factory or package.module:factory")
    if target not in _SOURCES:
        _SOURCES[target] = _import(target)
    factory = getattr(_SOURCES[target], factory_name, None)
    if not callable(factory):
        raise InputError(f"{target} has no callable {factory_name!r}", fix="name a function that builds it")
    return factory()


def _import(target: str) -> Any:
    if not target.endswith(".py"):
        try:
            return importlib.import_module(target)
        except ImportError as exc:
            raise InputError(f"cannot import {target!r}: {exc}", fix="check the module name and PYTHONPATH") from exc
    path = Path(target)
    if not path.is_file():
        raise InputError(f"no such file: {target}", fix="check the path in the spec")
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    assert module_spec is not None and module_spec.loader is not None
    source = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(source)
    return source


def _random_inputs(specs: list[str], seed: int) -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    inputs = []
    for text in specs:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise InputError(
                f"cannot read --input {text!r}", fix="write NAME:SHAPE[:DTYPE], e.g. x:1x3x224x224:float32"
            )
        name, shape_text, dtype_name = parts[0], parts[1], parts[2] if len(parts) == 3 else "float32"
        try:
            shape = tuple(int(s) for s in shape_text.split("x"))
        except ValueError:
            raise InputError(
                f"cannot read the shape {shape_text!r} of --input {name}", fix="write it as 1x3x224x224"
            ) from None
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise InputError(
                f"unknown dtype {dtype_name!r} in --input {text}", fix="use float32, float16, int64, bool, ..."
            )
        if dtype.is_floating_point:
            tensor = torch.randn(shape, generator=generator).to(dtype)
        elif dtype == torch.bool:
            tensor = torch.ones(shape, dtype=torch.bool)
        else:
            tensor = torch.randint(0, 100, shape, generator=generator, dtype=dtype)
        inputs.append((name, tensor))
    return inputs


def _dynamic(specs: list[str]) -> dict[str, dict[int, tuple[str, int, int, int]]]:
    dims: dict[str, dict[int, tuple[str, int, int, int]]] = {}
    for text in specs:
        parts = text.split(":")
        try:
            inp, axis, name, lo, opt, hi = parts
            dims.setdefault(inp, {})[int(axis)] = (name, int(lo), int(opt), int(hi))
        except ValueError:
            raise InputError(
                f"cannot read --dynamic {text!r}", fix="write INPUT:AXIS:NAME:MIN:OPT:MAX, e.g. x:0:batch:1:8:32"
            ) from None
    return dims


def _configure_logging(verbose: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("  %(message)s" if verbose < 2 else "%(levelname)s %(name)s: %(message)s"))
    for name in ("pipeline", "passes", "converters"):
        log = logging.getLogger(name)
        log.addHandler(handler)
        log.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)
