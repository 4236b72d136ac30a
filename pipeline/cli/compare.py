"""``pipeline compare SPEC [--input ...] -o OUTDIR``: the comparison from the command line.

Same model conventions as ``pipeline convert`` (``SPEC`` is ``file.py:factory`` or ``package.module:factory``,
``--input``/``--dynamic``/``--seed`` alike); ``--converters`` names a factory returning the
``ConverterRegistry`` to convert with (it may live in the same file as the model). Prints the short table,
writes the report directory, and exits 0 when every output is within tolerance, 1 when one is not.
"""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.cli.common import (
    add_conversion_arguments,
    add_model_arguments,
    conversion_options,
    model_and_sample,
)


def add_compare_command(commands: Any) -> None:
    """Add the ``compare`` subcommand to ``pipeline``'s subparsers."""
    from pipeline.comparison import DEFAULT_MEMORY_BUDGET, REFERENCE_DTYPES, RUNNERS  # names only: nothing runs

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
        "--memory-budget",
        type=int,
        default=DEFAULT_MEMORY_BUDGET >> 20,
        metavar="MIB",
        help="memory for intermediates per chunk of the per-layer comparison (MiB)",
    )
    add_conversion_arguments(parser)
    parser.set_defaults(run=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    """``pipeline compare``: convert, compare, print the table, write the report; 0 when every output passes."""
    from pipeline.conversion import compare

    model, sample = model_and_sample(args.spec, args.input, args.seed)
    report = compare(
        model,
        sample,
        backends=args.backend or "auto",
        reference_dtype=args.reference_dtype,
        per_layer=args.per_layer,
        random_inputs=args.random_inputs,
        memory_budget=args.memory_budget << 20,
        output_dir=args.output,
        **conversion_options(args),
    )
    print(report.table(args.output))
    return 0 if report.passed else 1
