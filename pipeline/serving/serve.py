"""``pipeline.serve``: artifacts as models of a real Triton Inference Server, on this machine.

>>> with pipeline.serve(["resnet.ptrt", "bert.ptrt"], max_batch=8) as server:   # doctest: +SKIP
...     client = tritonclient.http.InferenceServerClient(server.http_url)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from converters.errors import InputError
from pipeline.serving.model_config import BatchAxis, batch_axis, check_max_batch
from pipeline.serving.repository import ServedArtifact, served_artifact, write_serving_model
from pipeline.serving.server import TritonServer

logger = logging.getLogger(__name__)
DEFAULT_MAX_BATCH = 8


def serve(
    artifacts: str | Path | Sequence[str | Path] | Mapping[str, str | Path],
    *,
    max_batch: int | None = None,
    max_queue_delay_us: int = 100,
    dynamic_batching: bool = True,
    instances: int = 1,
    threads: int | None = None,
    spinning: bool | None = None,
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int = 8002,
    startup_timeout: float = 300.0,
    start: bool = True,
) -> TritonServer:
    """Serve artifacts with Triton; the running server (a context manager that stops it).

    ``artifacts``: paths (each model named after its file's stem; ``DIR/model.ptrt`` after DIR) or
    ``{name: path}``. ``max_batch`` is the largest batch Triton's dynamic batcher gathers; None: 8 (at most the
    converted maximum) for a graph whose inputs and outputs share a batch dimension, and 0 (each request is one
    whole call) for one without; a ``max_batch`` the graph cannot take is an ``InputError``.
    ``max_queue_delay_us`` is how long the batcher waits for more. ``instances`` copies of each model run in
    separate processes, each with ``threads`` ONNX Runtime threads and ``spinning`` their spin-waiting (None for
    both: the artifact's). A generation artifact streams tokens (decoupled) whatever ``max_batch`` is. Ports of 0
    take free ones.
    """
    items = _named(artifacts)
    served = [served_artifact(path, name) for name, path in items]
    seen: dict[str, Path] = {}
    for each in served:
        if each.name in seen:
            raise InputError(
                f"serving: two artifacts would be model {each.name!r} ({seen[each.name]} and {each.path})",
                fix="name them: serve({'a': path_a, 'b': path_b}) or --name",
            )
        seen[each.name] = each.path
    server = TritonServer(
        Path("."),
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        startup_timeout=startup_timeout,
    )
    server.repository = server.workdir / "models"
    for each in served:
        write_serving_model(
            server.repository,
            each,
            max_batch=0 if each.generative else _max_batch(each, max_batch),
            queue_delay_us=max_queue_delay_us if dynamic_batching else None,
            instances=instances,
            threads=threads,
            spinning=spinning,
        )
    return server.start() if start else server


def _max_batch(served: ServedArtifact, requested: int | None) -> int:
    axis = batch_axis(served.io, served.dynamic)
    if requested is None:
        chosen = 0 if axis is None else min(DEFAULT_MAX_BATCH, axis.max or DEFAULT_MAX_BATCH)
        logger.info("serving %s with max_batch %d (%s)", served.name, chosen, _why(axis))
        return chosen
    check_max_batch(served.name, axis, requested)
    return requested


def _why(axis: BatchAxis | None) -> str:
    if axis is None:
        return "its graph has no batch dimension shared by every input and output"
    return f"batch dimension {axis.name!r}" + (f" up to {axis.max}" if axis.max else "")


def _named(
    artifacts: str | Path | Sequence[str | Path] | Mapping[str, str | Path],
) -> list[tuple[str | None, str | Path]]:
    if isinstance(artifacts, (str, Path)):
        return [(None, artifacts)]
    if isinstance(artifacts, Mapping):
        return [(str(name), path) for name, path in artifacts.items()]
    items: list[tuple[str | None, str | Path]] = [(None, path) for path in artifacts]
    if not items:
        raise InputError("serving: no artifact given", fix="pass the path of at least one saved artifact")
    return items
