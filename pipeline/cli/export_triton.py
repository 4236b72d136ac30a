"""``pipeline export-triton ARTIFACT REPO``: a saved artifact as a model repository for a GPU Triton server."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_export_triton_command(commands: Any) -> None:
    """Add the ``export-triton`` subcommand to ``pipeline``'s subparsers."""
    exporter = commands.add_parser(
        "export-triton",
        help="write a Triton Inference Server model repository from a saved artifact (TensorRT plan, ONNX model "
        "with the TensorRT accelerator, or a Python-backend model for generation)",
    )
    exporter.add_argument(
        "artifact",
        type=Path,
        help="a file written by module.save(), or the directory of an encoder-decoder, a vision-language model or a "
        "model that cross-attends to its images",
    )
    exporter.add_argument("repository", type=Path, help="the model repository (created if missing)")
    exporter.add_argument("--name", default=None, help="prefix of the model names (default: the artifact's stem)")
    exporter.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="Triton's max_batch_size (default: the batch dimension's declared maximum; 0: no batching)",
    )
    exporter.add_argument(
        "--max-queue-delay-us", type=int, default=100, help="how long the dynamic batcher waits for more requests"
    )
    exporter.add_argument(
        "--no-dynamic-batching", action="store_true", help="write no dynamic_batching (each request runs alone)"
    )
    exporter.add_argument("--instances", type=int, default=1, help="instances of each model per GPU")
    exporter.add_argument("--force", action="store_true", help="replace model directories that already exist")
    exporter.add_argument(
        "--check",
        action="store_true",
        help="then start the real tritonserver over the repository and print each model's verdict",
    )
    exporter.add_argument("--json", action="store_true", help="print the export (and check) as JSON")
    exporter.set_defaults(run=_export_triton)


def _export_triton(args: argparse.Namespace) -> int:
    from pipeline.serving.export import export_triton

    export = export_triton(
        args.artifact,
        args.repository,
        name=args.name,
        max_batch=args.max_batch,
        max_queue_delay_us=args.max_queue_delay_us,
        dynamic_batching=not args.no_dynamic_batching,
        instances=args.instances,
        force=args.force,
    )
    check = None
    if args.check:
        from pipeline.serving.repository_check import check_repository

        check = check_repository(args.repository)
    if args.json:
        data = export.to_dict() | ({"check": check.to_dict()} if check is not None else {})
        print(json.dumps(data, indent=2))
    else:
        print(export.summary())
        if check is not None:
            print(check.summary())
    sys.stdout.flush()
    return 0 if check is None or check.ok else 1
