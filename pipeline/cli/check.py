"""``pipeline check model.onnx``: will TensorRT's ONNX parser accept this graph?"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_check_command(commands: Any) -> None:
    """Add the ``check`` subcommand to ``pipeline``'s subparsers."""
    checker = commands.add_parser(
        "check",
        help="will TensorRT's ONNX parser accept this graph? (the real parser when TensorRT or TensorRT-RTX imports, "
        "else the static table)",
    )
    checker.add_argument("model", type=Path, help="an ONNX file")
    checker.add_argument(
        "--parser",
        default="auto",
        choices=["auto", "tensorrt", "tensorrt-rtx", "static"],
        help="who judges: auto = TensorRT's parser, else TensorRT-RTX's, else the static table",
    )
    checker.add_argument("--build", action="store_true", help="also build an engine with the real builder")
    checker.add_argument("--trt-version", default=None, help="TensorRT version for the static table (default 11.1)")
    checker.add_argument("--json", action="store_true", help="print the report as JSON")
    checker.set_defaults(run=_check)


def _check(args: argparse.Namespace) -> int:
    from pipeline.compatibility.judge import check

    report = check(args.model, args.trt_version, parser=args.parser, build=args.build)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.summary())
    return 0 if report.ok else 1
