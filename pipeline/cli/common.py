"""What every ``pipeline`` command shares: the model arguments, the model spec loader, inputs and dynamic dims."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from pathlib import Path
from typing import Any

import torch

from converters.errors import InputError


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


def random_inputs(specs: list[str], seed: int) -> list[tuple[str, torch.Tensor]]:
    """Seeded random tensors for ``--input NAME:SHAPE[:DTYPE]`` arguments."""
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
