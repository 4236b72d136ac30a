"""``pipeline serve model.ptrt [more.ptrt ...]``: artifacts as models of a Triton Inference Server, until stopped."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from converters.errors import InputError


def add_serve_command(commands: Any) -> None:
    """Add the ``serve`` subcommand to ``pipeline``'s subparsers."""
    serve = commands.add_parser(
        "serve",
        help="serve artifacts with a real Triton Inference Server (HTTP, gRPC, metrics; dynamic batching; token "
        "streaming for generation artifacts) until SIGTERM or Ctrl-C",
    )
    serve.add_argument(
        "artifacts",
        type=Path,
        nargs="+",
        help="artifacts written by module.save() (a file, or the directory of an "
        "encoder-decoder or a vision-language model)",
    )
    serve.add_argument(
        "--name",
        action="append",
        default=[],
        help="model name of each artifact, in order (default: the file's stem); give one per artifact",
    )
    serve.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="largest batch the dynamic batcher gathers (0: none; default 8, or 0 for a graph without a batch "
        "dimension)",
    )
    serve.add_argument("--max-queue-delay-us", type=int, default=100, help="how long a request waits for others")
    serve.add_argument("--no-dynamic-batching", action="store_true", help="run each request on its own")
    serve.add_argument("--instances", type=int, default=1, help="copies of each model (separate processes)")
    serve.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads per instance")
    serve.add_argument(
        "--ort-spinning",
        choices=("on", "off"),
        default=None,
        help="ONNX Runtime's spin-waiting between calls (default: the artifact's); off leaves the cores to the "
        "server's own threads on a busy CPU",
    )
    serve.add_argument("--http-port", type=int, default=8000)
    serve.add_argument("--grpc-port", type=int, default=8001)
    serve.add_argument("--metrics-port", type=int, default=8002)
    serve.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for every model")
    serve.set_defaults(run=_serve)


def _serve(args: argparse.Namespace) -> int:
    from pipeline.serving.serve import serve

    if args.name and len(args.name) != len(args.artifacts):
        raise InputError(
            f"serve: {len(args.name)} --name for {len(args.artifacts)} artifacts",
            fix="give one --name per artifact, in the same order, or none",
        )
    artifacts: Any = dict(zip(args.name, args.artifacts, strict=True)) if args.name else list(args.artifacts)
    stopping: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        server = serve(
            artifacts,
            max_batch=args.max_batch,
            max_queue_delay_us=args.max_queue_delay_us,
            dynamic_batching=not args.no_dynamic_batching,
            instances=args.instances,
            threads=args.threads,
            spinning=None if args.ort_spinning is None else args.ort_spinning == "on",
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
            startup_timeout=args.startup_timeout,
        )
    except KeyboardInterrupt:
        return 128 + (stopping[0] if stopping else signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)
    with server:
        names = ", ".join(model["name"] for model in server.models())
        print(
            f"serving {names}: HTTP {server.http_url}, gRPC {server.grpc_url}, metrics {server.metrics_url} "
            "(SIGTERM or Ctrl-C stops after the requests in flight)",
            flush=True,
        )
        signal.signal(signal.SIGTERM, stop)
        try:
            code = server.wait()
        except KeyboardInterrupt:
            print("stopping: finishing the requests in flight", file=sys.stderr, flush=True)
            code = server.stop() or 0
        else:
            print(f"error: tritonserver exited with code {code}: {server.failure()}", file=sys.stderr)
            return code or 1
    return 0
