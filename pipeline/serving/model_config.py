"""A converted model's graph as a Triton model configuration (``config.pbtxt``).

The configuration is built with Triton's own protobuf schema (``tritonclient``'s ``model_config_pb2``), so a field
name or enum this module writes is one the server knows; the text is protobuf's text format, as Triton reads it.

Batching follows the graph: when every input and output has the same symbolic first dimension (the ``batch`` of
``dynamic=``), that dimension is Triton's batch dimension (``max_batch_size`` > 0, ``dims`` without it) and requests
can be batched together; otherwise the model takes whole tensors (``max_batch_size: 0``) and cannot be.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converters.errors import InputError
from converters.files import write_file_atomically
from pipeline.runtime.io_spec import IOSpec, TensorSpec
from pipeline.settings import DynamicDim

# torch dtype names (TensorSpec.dtype) as Triton's data types
TRITON_TYPES = {
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "bfloat16": "TYPE_BF16",
    "float64": "TYPE_FP64",
    "int64": "TYPE_INT64",
    "int32": "TYPE_INT32",
    "int16": "TYPE_INT16",
    "int8": "TYPE_INT8",
    "uint8": "TYPE_UINT8",
    "bool": "TYPE_BOOL",
}
# and as the KServe v2 protocol's datatype strings (what a client sends)
PROTOCOL_TYPES = {name: triton.removeprefix("TYPE_") for name, triton in TRITON_TYPES.items()}


def config_pb2() -> Any:
    """Triton's ``model_config_pb2`` module, or an ``InputError`` saying how to install it."""
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError as err:
        raise InputError(
            "serving: Triton's model configuration schema is not installed",
            fix="pip install 'torch-trt-pipeline[serve]' (tritonclient[grpc] holds the schema)",
        ) from err
    return model_config_pb2


@dataclass(frozen=True)
class BatchAxis:
    """The graph's batch dimension: its symbolic name and the largest batch the conversion declared (0: no bound)."""

    name: str
    max: int


def batch_axis(io: IOSpec, dynamic: Sequence[DynamicDim] = ()) -> BatchAxis | None:
    """The first dimension shared by every input and output as one symbol, or None when there is none."""
    firsts = {t.shape[0] if t.shape else None for t in (*io.inputs, *io.outputs)}
    if len(firsts) != 1:
        return None
    (name,) = firsts
    if not isinstance(name, str):
        return None
    bounds = [d.max for d in dynamic if d.name == name or (d.axis == 0 and _named(io, d.input, name))]
    return BatchAxis(name, min(bounds) if bounds else 0)


def _named(io: IOSpec, input_name: str, dim: str) -> bool:
    return any(t.name == input_name and t.shape[:1] == (dim,) for t in io.inputs)


def check_max_batch(name: str, axis: BatchAxis | None, max_batch: int) -> None:
    """Refuse a ``max_batch`` the graph cannot take (no batch dimension, or more than its declared maximum)."""
    if max_batch < 0:
        raise InputError(f"serving {name!r}: max_batch must be >= 0, not {max_batch}")
    if max_batch == 0:
        return
    if axis is None:
        raise InputError(
            f"serving {name!r}: the graph has no batch dimension shared by all its inputs and outputs, so Triton "
            f"cannot batch its requests (max_batch {max_batch})",
            fix="convert with a dynamic batch, e.g. dynamic={'input': {0: ('batch', 1, 8, 32)}}, or serve with "
            "max_batch=0 (each request is one whole call)",
        )
    if axis.max and max_batch > axis.max:
        raise InputError(
            f"serving {name!r}: max_batch {max_batch} is larger than the batch the model was converted for "
            f"(dimension {axis.name!r} up to {axis.max})",
            fix=f"serve with max_batch <= {axis.max}, or convert again with a larger maximum",
        )


def _tensor(message: Any, spec: TensorSpec, batched: bool) -> None:
    pb2 = config_pb2()
    if spec.dtype not in TRITON_TYPES:
        raise InputError(f"serving: tensor {spec.name!r} has dtype {spec.dtype}, which Triton has no type for")
    message.name = spec.name
    message.data_type = getattr(pb2, TRITON_TYPES[spec.dtype])
    shape = spec.shape[1:] if batched else spec.shape
    message.dims.extend([d if isinstance(d, int) else -1 for d in shape])


def model_config(
    name: str,
    io: IOSpec,
    *,
    backend: str = "",
    platform: str = "",
    max_batch: int = 0,
    queue_delay_us: int | None = None,
    instances: int = 1,
    kind: str = "KIND_CPU",
    decoupled: bool = False,
    inputs: Sequence[TensorSpec] | None = None,
    outputs: Sequence[TensorSpec] | None = None,
    parameters: Mapping[str, str] | None = None,
) -> Any:
    """A ``ModelConfig`` message for the graph of ``io`` (or the given ``inputs``/``outputs``).

    ``max_batch`` > 0 makes the first dimension Triton's batch dimension (the caller checks it with
    :func:`check_max_batch`); ``queue_delay_us`` not None turns on dynamic batching with that delay.
    """
    pb2 = config_pb2()
    config = pb2.ModelConfig(name=name, max_batch_size=max_batch)
    if backend:
        config.backend = backend
    if platform:
        config.platform = platform
    for spec in inputs if inputs is not None else io.inputs:
        _tensor(config.input.add(), spec, max_batch > 0)
    for spec in outputs if outputs is not None else io.outputs:
        _tensor(config.output.add(), spec, max_batch > 0)
    if queue_delay_us is not None and max_batch > 0:
        config.dynamic_batching.max_queue_delay_microseconds = queue_delay_us
    group = config.instance_group.add()
    group.count = instances
    group.kind = getattr(pb2.ModelInstanceGroup, kind)
    if decoupled:
        config.model_transaction_policy.decoupled = True
    for key, value in (parameters or {}).items():
        config.parameters[key].string_value = value
    return config


def config_text(config: Any) -> str:
    """The message in protobuf's text format (what ``config.pbtxt`` holds)."""
    from google.protobuf import text_format

    text: str = text_format.MessageToString(config)
    return text


def write_config(config: Any, directory: Path) -> Path:
    """Write ``directory/config.pbtxt`` atomically; its path."""
    path = directory / "config.pbtxt"
    write_file_atomically(path, config_text(config).encode())
    return path
