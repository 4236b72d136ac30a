"""Command line: ``pipeline convert|check|compare``; one module per command, shared parsing in ``common``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from converters.errors import PipelineError
from pipeline.cli.check import add_check_command
from pipeline.cli.compare import add_compare_command
from pipeline.cli.convert import add_convert_command


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pipeline`` with ``argv`` (default: the process arguments); returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    try:
        return int(args.run(args))
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    """The ``pipeline`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="pipeline", description="PyTorch -> ONNX -> TensorRT / ONNX Runtime")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    add_convert_command(commands)
    add_check_command(commands)
    add_compare_command(commands)
    return parser

def _configure_logging(verbose: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("  %(message)s" if verbose < 2 else "%(levelname)s %(name)s: %(message)s"))
    for name in ("pipeline", "passes", "converters"):
        log = logging.getLogger(name)
        log.addHandler(handler)
        log.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)
