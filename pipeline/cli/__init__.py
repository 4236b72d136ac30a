"""Command line: ``pipeline convert|check|compare|bench|inspect|generate|serve|export-triton``; one module per
command, shared parsing in ``common``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from collections.abc import Sequence

from converters.errors import PipelineError
from pipeline.cli.bench import add_bench_command
from pipeline.cli.check import add_check_command
from pipeline.cli.compare import add_compare_command
from pipeline.cli.convert import add_convert_command
from pipeline.cli.export_triton import add_export_triton_command
from pipeline.cli.generate import add_generate_command
from pipeline.cli.inspect import add_inspect_command
from pipeline.cli.serve import add_serve_command
from pipeline.noise import show_third_party


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
    except BrokenPipeError:  # the reader of our output closed it (`pipeline inspect ... | head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's exit flush would raise again
        return 141  # a shell's code for a process ended by SIGPIPE


def build_parser() -> argparse.ArgumentParser:
    """The ``pipeline`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="pipeline", description="PyTorch -> ONNX -> TensorRT / ONNX Runtime")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for add in (
        add_convert_command,
        add_check_command,
        add_compare_command,
        add_bench_command,
        add_inspect_command,
        add_generate_command,
        add_serve_command,
        add_export_triton_command,
    ):
        add(commands)
    for sub in commands.choices.values():  # -v after the command too (`pipeline convert ... -v`)
        sub.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=VERBOSE_HELP)
    return parser


VERBOSE_HELP = "-v: third-party warnings too; -vv: debug logs; before or after the command"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch-trt-pipeline")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


#: The name of the CLI's logging handler (replaced, not added again, when ``main`` runs twice in one process).
_HANDLER = "pipeline-cli"


def _configure_logging(verbose: int) -> None:
    # our warnings (engine not runnable here, low fp16 share, ...) read as messages, not as Python source lines
    warnings.formatwarning = lambda message, category, *_args, **_kwargs: f"warning: {message}\n"
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER)
    handler.setFormatter(logging.Formatter("  %(message)s" if verbose < 2 else "%(levelname)s %(name)s: %(message)s"))
    for name in ("pipeline", "passes", "converters"):
        log = logging.getLogger(name)
        for old in [h for h in log.handlers if h.get_name() == _HANDLER]:  # a second main() in one process: one handler
            log.removeHandler(old)
        log.addHandler(handler)
        log.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)
    if verbose >= 1:  # -v: what torch's exporter, onnxscript and the other libraries say too
        show_third_party()
