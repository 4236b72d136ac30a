"""``pipeline check model.onnx``: will TensorRT's ONNX parser accept this graph?"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_check_command(commands: Any) -> None:
    """Add the ``check`` subcommand to ``pipeline``'s subparsers."""
    checker = commands.add_parser("check", help="will TensorRT's ONNX parser accept this graph? (no TensorRT needed)")
    checker.add_argument("model", type=Path, help="an ONNX file")
    checker.add_argument("--trt-version", default=None, help="TensorRT version to check against (default 11.1)")
    checker.add_argument("--json", action="store_true", help="print the report as JSON")
    checker.set_defaults(run=_check)


def _check(args: argparse.Namespace) -> int:
    from pipeline.check.ops import DEFAULT_TRT_VERSION
    from pipeline.check.static import check

    report = check(args.model, trt_version=args.trt_version or DEFAULT_TRT_VERSION)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.summary())
    return 0 if report.ok else 1
