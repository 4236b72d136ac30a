"""The engine options of ``pipeline convert`` (README "Engine options"), named as Polygraphy and trtexec name them
where they have a name (``--strip-plan``, ``--refittable``, ``--weight-streaming-budget``, ``--sparse-weights``,
``--use-cuda-graph``)."""

from __future__ import annotations

import argparse
from typing import Any


def add_engine_option_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the engine options to a command that builds engines."""
    group = parser.add_argument_group("engine options (TensorRT, TensorRT-RTX)")
    group.add_argument(
        "--strip-weights",
        "--strip-plan",
        action="store_true",
        help="weight-stripped plan, refit from the graph's weights at load (the artifact keeps them once)",
    )
    group.add_argument("--refittable", action="store_true", help="an engine pipeline.refit can give new weights")
    group.add_argument(
        "--weight-streaming-budget",
        type=int,
        default=None,
        metavar="BYTES",
        help="build with weight streaming; keep BYTES of weights on the GPU (-1: TensorRT's automatic budget)",
    )
    group.add_argument("--sparse-weights", action="store_true", help="let TensorRT use 2:4-sparse weights")
    group.add_argument(
        "--cuda-graphs", "--use-cuda-graph", action="store_true", help="run the engine as a CUDA graph per input shapes"
    )
    group.add_argument(
        "--no-runtime-cache", action="store_true", help="TensorRT-RTX: do not keep JIT-compiled kernels in a file"
    )


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """``pipeline.convert`` keyword arguments from :func:`add_engine_option_arguments`'s options."""
    return {
        "strip_weights": args.strip_weights,
        "refittable": args.refittable,
        "weight_streaming_budget": args.weight_streaming_budget,
        "sparse_weights": args.sparse_weights,
        "cuda_graphs": args.cuda_graphs,
        "trt_runtime_cache": not args.no_runtime_cache,
    }
