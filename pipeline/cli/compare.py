"""``pipeline compare SPEC [--input ...] -o OUTDIR``: the comparison from the command line.

Same model conventions as ``pipeline convert`` (``SPEC`` is ``file.py:factory`` or ``package.module:factory``,
``--input``/``--dynamic``/``--seed`` alike); ``--converters`` names a factory returning the
``ConverterRegistry`` to convert with (it may live in the same file as the model). Prints the short table,
writes the report directory, and exits 0 when every output is within tolerance, 1 when one is not.
"""

from __future__ import annotations

import argparse
from typing import Any

from converters.errors import InputError
from converters.registry import ConverterRegistry
from pipeline.cli.common import add_model_arguments, call_factory, dynamic_dims, load_spec, random_inputs


def add_compare_command(commands: Any) -> None:
    """Add the ``compare`` subcommand to ``pipeline``'s subparsers."""
    from pipeline.compare.layers import DEFAULT_MEMORY_BUDGET
    from pipeline.compare.runners import REFERENCE_DTYPES, RUNNERS

    parser = commands.add_parser("compare", help="compare a converted model with PyTorch and write a report")
    add_model_arguments(parser, output_help="report directory")
    parser.add_argument(
        "--backend",
        action="append",
        choices=RUNNERS,
        default=None,
        help="a runner to compare (repeatable; default: every one that can run)",
    )
    parser.add_argument("--per-layer", action="store_true", help="compare module outputs, name the first divergence")
    parser.add_argument(
        "--random-inputs",
        type=int,
        default=None,
        metavar="N",
        help="seeded random inputs drawn like the sample (default 3)",
    )
    parser.add_argument(
        "--reference-dtype",
        choices=REFERENCE_DTYPES,
        default="float32",
        help="float64: a float64 copy of the model is the reference",
    )
    parser.add_argument(
        "--tolerance",
        action="append",
        default=[],
        metavar="KEY:ATOL:RTOL",
        help="tolerance for a dtype, output name or module path, e.g. float32:1e-4:1e-3",
    )
    parser.add_argument(
        "--memory-budget",
        type=int,
        default=DEFAULT_MEMORY_BUDGET >> 20,
        metavar="MIB",
        help="memory for intermediates per chunk of the per-layer comparison (MiB)",
    )
    parser.add_argument(
        "--converters",
        default=None,
        metavar="SPEC",
        help="file.py:factory returning the ConverterRegistry to convert with",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of random inputs")
    parser.set_defaults(run=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    from pipeline.conversion import compare

    model, sample = load_spec(args.spec)
    if args.input:
        sample = ((), dict(random_inputs(args.input, args.seed)))
    if sample is None:
        raise InputError(
            f"{args.spec} returned a module but no sample, and no --input was given",
            fix="pass --input NAME:SHAPE[:DTYPE] for each forward() argument, or return (module, sample)",
        )
    registry = None
    if args.converters:
        registry = call_factory(args.converters)
        if not isinstance(registry, ConverterRegistry):
            raise InputError(
                f"{args.converters} returned {type(registry).__name__}",
                fix="the --converters factory must return a converters.ConverterRegistry",
            )
    report = compare(
        model,
        sample,
        backends=args.backend or "auto",
        reference_dtype=args.reference_dtype,
        tolerances=_tolerances(args.tolerance),
        per_layer=args.per_layer,
        random_inputs=args.random_inputs,
        memory_budget=args.memory_budget << 20,
        output_dir=args.output,
        converters=registry,
        seed=args.seed,
        dynamic=dynamic_dims(args.dynamic),
    )
    print(report.table(args.output))
    return 0 if report.passed else 1


def _tolerances(specs: list[str]) -> dict[str, tuple[float, float]]:
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
