"""A decoupled generation request to a running Triton server over gRPC, as the serving tests send it."""

from __future__ import annotations

import queue
from typing import Any

import numpy as np
import torch


def stream(
    url: str, model: str, inputs: dict[str, torch.Tensor], *, on_first: Any = None, **options: Any
) -> tuple[np.ndarray, list[str]]:
    """One decoupled request over gRPC (the named tensors, ``options`` as request parameters): the tokens of every
    response [rows, tokens], and the errors (``on_first`` is called once the first token is in)."""
    from tritonclient import grpc

    client = grpc.InferenceServerClient(url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    given = []
    for name, value in inputs.items():
        tensor = grpc.InferInput(name, list(value.shape), "INT64" if value.dtype == torch.int64 else "FP32")
        tensor.set_data_from_numpy(value.numpy())
        given.append(tensor)
    client.async_stream_infer(model, given, parameters=options, enable_empty_final_response=True)
    tokens, errors = [], []
    try:
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                errors.append(str(error))
                break
            response = result.get_response()
            if response.outputs:
                tokens.append(result.as_numpy("tokens"))
                if on_first is not None and len(tokens) == 1:
                    on_first()
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
    finally:
        client.stop_stream()
    rows = next(iter(inputs.values())).shape[0] if inputs else 0
    return (np.concatenate(tokens, axis=1) if tokens else np.zeros((rows, 0), np.int64)), errors
