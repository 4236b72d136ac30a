"""What every ``pipeline`` command shares: the model arguments, the model spec loader, inputs and dynamic dims."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from converters.errors import InputError
from converters.files import current_umask

if TYPE_CHECKING:
    import torch


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


def load_spec(spec: str) -> tuple[torch.nn.Module, Any]:
    """The model (and sample, when the factory returns one) named by ``SPEC``."""
    import torch

    built = call_factory(spec)
    if isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], torch.nn.Module):
        return built[0], built[1]
    if isinstance(built, torch.nn.Module):
        return built, None
    raise InputError(
        f"{spec} returned {type(built).__name__}", fix="the factory must return an nn.Module or (module, sample)"
    )


def model_and_sample(spec: str, inputs: list[str], seed: int) -> tuple[torch.nn.Module, Any]:
    """The model of ``spec`` and the sample to call it with: ``--input`` tensors when given, else the factory's."""
    model, sample = load_spec(spec)
    if inputs:
        sample = ((), dict(random_inputs(inputs, seed)))
        _check_input_names(model, sample[1])
    if sample is None:
        raise InputError(
            f"{spec} returned a module but no sample, and no --input was given",
            fix="pass --input NAME:SHAPE[:DTYPE] for each forward() argument, or return (module, sample)",
        )
    return model, sample


def _check_input_names(model: torch.nn.Module, named: dict[str, torch.Tensor]) -> None:
    """Every ``--input NAME`` must be an argument of ``forward`` (said before anything is exported)."""
    from pipeline.runtime.io_spec import forward_signature, keyword_names, unknown_keywords

    signature = forward_signature(model)
    unknown = unknown_keywords(signature, named)
    if unknown:
        real = keyword_names(signature)
        raise InputError(
            f"--input {', --input '.join(unknown)}: {type(model).__name__}.forward() has no argument "
            f"{', '.join(map(repr, unknown))}; its arguments are: {real}",
            fix="name forward()'s arguments, e.g. "
            + " ".join(f"--input {name}:SHAPE[:DTYPE]" for name in real.split(", ")),
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
    try:
        return factory()
    except Exception as exc:  # the user's code: its error, named as such, with where it came from
        raise InputError(
            f"the factory {spec} raised {type(exc).__name__}: {exc}",
            fix=f"fix {factory_name}() in {target} (run it in Python to see the traceback)",
        ) from exc


def _import(target: str) -> Any:
    if not target.endswith(".py"):
        try:
            return importlib.import_module(target)
        except ImportError as exc:
            raise InputError(f"cannot import {target!r}: {exc}", fix="check the module name and PYTHONPATH") from exc
        except Exception as exc:  # the module exists but fails at import time
            raise InputError(
                f"{target} failed to import: {type(exc).__name__}: {exc}", fix=f"fix {target} (import it in Python)"
            ) from exc
    path = Path(target)
    if not path.is_file():
        raise InputError(f"no such file: {target}", fix="check the path in the spec")
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    if module_spec is None or module_spec.loader is None:
        raise InputError(f"cannot load {target} as Python", fix="name a .py file")
    source = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(source)
    except Exception as exc:  # a syntax error, or an error at import time in the user's file
        raise InputError(
            f"{target} failed to import: {type(exc).__name__}: {exc}",
            fix=f"fix {target} (run `python {target}` to see the traceback)",
        ) from exc
    return source


def random_inputs(specs: list[str], seed: int) -> list[tuple[str, torch.Tensor]]:
    """Seeded random tensors for ``--input NAME:SHAPE[:DTYPE]`` arguments."""
    import torch

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
            if any(size < 1 for size in shape):
                raise ValueError(shape_text)
        except ValueError:
            raise InputError(
                f"cannot read the shape {shape_text!r} of --input {name}: sizes are whole numbers >= 1",
                fix="write it as 1x3x224x224",
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


def dynamic_dims(specs: list[str]) -> dict[str, dict[int, tuple[str, int, int, int]]]:
    """The ``dynamic=`` argument of ``convert`` from ``--dynamic INPUT:AXIS:NAME:MIN:OPT:MAX`` arguments."""
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


def add_conversion_arguments(parser: argparse.ArgumentParser) -> None:
    """The conversion options every command that converts takes (convert, compare, bench): one definition."""
    parser.add_argument(
        "--min-shapes",
        default=None,
        metavar="NAME:SHAPE,...",
        help="trtexec-style: the smallest shape of each input, e.g. input_ids:1x8,attention_mask:1x8",
    )
    parser.add_argument("--opt-shapes", default=None, metavar="NAME:SHAPE,...", help="the shapes to optimise for")
    parser.add_argument("--max-shapes", default=None, metavar="NAME:SHAPE,...", help="the largest shape of each input")
    parser.add_argument(
        "--precision",
        default="fp32",
        choices=["fp32", "fp16", "bf16", "int8", "fp8", "int4", "nvfp4"],
        help="compute type of the graph (fp32 islands); int8/fp8: Q/DQ at MatMul/Gemm/Conv, the rest fp16; "
        "int4/nvfp4: 4-bit MatMul/Gemm weights, activations fp16",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="int4: input channels per weight scale (32, 64 or 128 for TensorRT; default 128); nvfp4's blocks are "
        "fixed at 16 by the format (another value is an error)",
    )
    parser.add_argument(
        "--nvfp4-activations",
        action="store_true",
        help="nvfp4: quantize the 4-bit MatMuls' activations to NVFP4 at run time too (W4A4; TensorRT 12.x only)",
    )
    parser.add_argument(
        "--quantize-embeddings",
        action="store_true",
        help="int4/nvfp4: store embedding tables (Gather) in 4 bits too; a table tied to the head is stored once",
    )
    parser.add_argument(
        "--quantize-fallback",
        default="fp16",
        choices=["fp16", "fp32"],
        help="int8/fp8/int4/nvfp4: the type of the ops left unquantized (fp16 for TensorRT; fp32 for speed on the CPU)",
    )
    parser.add_argument(
        "--ort-int8-conv-outputs",
        default="requantize",
        choices=["requantize", "exact"],
        help="int8 on ONNX Runtime: requantize the convolutions before residual Adds (faster) or keep TensorRT's "
        "float output (exact)",
    )
    parser.add_argument(
        "--keep-fp32",
        action="append",
        default=[],
        metavar="NODE|OP|MODULE",
        help="keep in float32: a node name, op type or PyTorch module path (node:, op:, module: to be explicit)",
    )
    parser.add_argument(
        "--tolerance",
        action="append",
        default=[],
        metavar="KEY:ATOL:RTOL",
        help="tolerance for a dtype or an output name, e.g. float32:1e-4:1e-3 or logits:1e-3:1e-2",
    )
    parser.add_argument(
        "--converters",
        default=None,
        metavar="SPEC",
        help="file.py:factory returning the ConverterRegistry to convert with (default: the built-ins and yours)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of random inputs (CLI and validation)")
    parser.add_argument(
        "--fallback",
        default="onnxruntime",
        choices=["onnxruntime", "error"],
        help="nodes TensorRT rejects: run them on ONNX Runtime between TensorRT segments (default), or fail",
    )
    parser.add_argument(
        "--min-segment-size",
        type=int,
        default=5,
        metavar="N",
        help="TensorRT segments of fewer compute nodes run on ONNX Runtime instead (default 5)",
    )
    parser.add_argument(
        "--fallback-ops",
        action="append",
        default=[],
        metavar="OP[,OP...]",
        help="ONNX op types to keep out of TensorRT (run on ONNX Runtime), e.g. NonZero,TopK",
    )


def conversion_options(args: argparse.Namespace) -> dict[str, Any]:
    """``pipeline.convert`` keyword arguments from :func:`add_conversion_arguments`'s options (and ``--dynamic``)."""
    options: dict[str, Any] = {
        "precision": args.precision,
        "quantize_fallback": args.quantize_fallback,
        "block_size": args.block_size,
        "nvfp4_activations": args.nvfp4_activations,
        "quantize_embeddings": args.quantize_embeddings,
        "ort_int8_conv_outputs": args.ort_int8_conv_outputs,
        "keep_fp32": tuple(args.keep_fp32),
        "seed": args.seed,
        "fallback": args.fallback,
        "min_segment_size": args.min_segment_size,
        "fallback_ops": tuple(op for text in args.fallback_ops for op in text.split(",") if op),
        "dynamic": merge_dynamic(
            dynamic_dims(args.dynamic), shapes_to_dynamic(args.min_shapes, args.opt_shapes, args.max_shapes)
        ),
    }
    tolerances = read_tolerances(args.tolerance)
    if tolerances:
        options["tolerances"] = tolerances
    if args.converters:
        options["converters"] = converter_registry(args.converters)
    return options


def read_tolerances(specs: list[str]) -> dict[str, tuple[float, float]]:
    """``{key: (atol, rtol)}`` from ``--tolerance KEY:ATOL:RTOL`` arguments."""
    tolerances = {}
    for text in specs:
        key, _, rest = text.rpartition(":")
        key, _, atol = key.rpartition(":")
        try:
            tolerances[key] = (float(atol), float(rest))
        except ValueError:
            raise InputError(
                f"cannot read --tolerance {text!r}", fix="write KEY:ATOL:RTOL, e.g. logits:1e-4:1e-3"
            ) from None
        if not key:
            raise InputError(f"--tolerance {text!r} names no dtype or output", fix="write KEY:ATOL:RTOL")
    return tolerances


def converter_registry(spec: str) -> Any:
    """The ``ConverterRegistry`` a ``--converters file.py:factory`` returns."""
    from converters.registry import ConverterRegistry

    registry = call_factory(spec)
    if not isinstance(registry, ConverterRegistry):
        raise InputError(
            f"{spec} returned {type(registry).__name__}",
            fix="the --converters factory must return a converters.ConverterRegistry",
        )
    return registry


Dims = dict[str, dict[int, tuple[str, int, int, int]]]


def shapes_to_dynamic(min_text: str | None, opt_text: str | None, max_text: str | None) -> Dims:
    """trtexec's ``--minShapes/--optShapes/--maxShapes`` as ``dynamic=``: every axis whose sizes differ is dynamic.

    Axes of different inputs with the same position and range share one dimension name (``input_ids`` and
    ``attention_mask`` share batch and sequence length, as the exporter needs); the name is ``dim<axis>_<min>_<max>``.
    """
    given = [t for t in (min_text, opt_text, max_text) if t]
    if not given:
        return {}
    if len(given) != 3:
        raise InputError(
            "--min-shapes, --opt-shapes and --max-shapes go together", fix="give all three, for the same inputs"
        )
    flags = ("--min-shapes", "--opt-shapes", "--max-shapes")
    lo, opt, hi = (_read_shapes(t, flag) for t, flag in zip(given, flags, strict=True))
    if not set(lo) == set(opt) == set(hi):
        raise InputError("--min/opt/max-shapes name different inputs", fix="name the same inputs in all three")
    dims: Dims = {}
    for name, low in lo.items():
        if not len(low) == len(opt[name]) == len(hi[name]):
            raise InputError(f"the shapes of {name!r} have different ranks", fix="give one rank in all three flags")
        for axis, (a, b, c) in enumerate(zip(low, opt[name], hi[name], strict=True)):
            if a != c or a != b:
                dims.setdefault(name, {})[axis] = (f"dim{axis}_{a}_{c}", a, b, c)
    return dims


def _read_shapes(text: str, flag: str) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for item in text.split(","):
        name, sep, shape = item.strip().rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(s) for s in shape.split("x"))
        except ValueError:
            raise InputError(f"cannot read {flag} {item!r}", fix=f"write {flag} NAME:1x3x224x224[,NAME:...]") from None
        if any(s < 1 for s in shapes[name]):
            raise InputError(f"{flag} {item!r} has a size below 1", fix="sizes are whole numbers >= 1")
    return shapes


def merge_dynamic(first: Dims, second: Dims) -> Dims:
    """Both ``dynamic=`` maps; the same input axis in both is an error."""
    merged = {k: dict(v) for k, v in first.items()}
    for name, axes in second.items():
        for axis, dim in axes.items():
            if axis in merged.get(name, {}):
                raise InputError(
                    f"axis {axis} of {name!r} is declared by --dynamic and by the shape flags",
                    fix="declare each dynamic axis once",
                )
            merged.setdefault(name, {})[axis] = dim
    return merged


@contextlib.contextmanager
def staged_output(out: Path, names: Sequence[str]) -> Iterator[Path]:
    """All or nothing: a staging directory for the files ``names``, moved into ``out`` when the block succeeds.

    Checked before any work: ``out`` must be (or become) a writable directory and none of ``names`` may be a
    directory there. On an error inside the block the staging directory goes and ``out`` is as it was. When ``out``
    did not exist, the staging directory is renamed to it (one step); otherwise each file is renamed into it.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"-o {out} is a file", fix="give a directory (it is created if it does not exist)")
    blocked = [n for n in names if (out / n).is_dir()]
    if blocked:
        raise InputError(
            f"-o {out} holds a directory named {', '.join(blocked)}, where an output file goes",
            fix="remove it or choose another output directory",
        )
    fresh = not out.exists()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging.", dir=out.parent if fresh else out))
    except OSError as exc:
        raise InputError(
            f"cannot write to -o {out}: {exc.strerror or exc}", fix="choose a writable output directory"
        ) from exc
    try:
        yield staging
        if fresh:  # mkdtemp made it 0700: the new directory should look like any other (the umask's mode)
            os.chmod(staging, 0o777 & ~current_umask())
            os.replace(staging, out)
            return
        for item in sorted(staging.iterdir()):
            os.replace(item, out / item.name)
        staging.rmdir()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
