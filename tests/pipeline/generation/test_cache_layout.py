"""The cache layout of a cached decoder step (``pipeline.runtime.generation.layout``), read from a hand-written I/O
spec: the names optimum and ONNX Runtime GenAI use, the shapes after the batch axis, the dtypes, the bytes a row
takes."""

from __future__ import annotations

import pytest
import torch

from pipeline.runtime.generation.layout import (
    STEP_INPUTS,
    CacheLayout,
    cache_layout,
    past_name,
    present_name,
)
from pipeline.runtime.io_spec import IOSpec, TensorSpec


def step_spec(layers: int, dtypes: tuple[str, ...]) -> IOSpec:
    """A step graph's inputs: the four step inputs, then per layer a key and a value cache [batch, heads, capacity,
    head size] (the value's head size differs from the key's, so that a swapped pair shows), in reverse order (the
    layout is read by name, not position)."""
    inputs = [TensorSpec(name, "int64", ("batch", "tokens")) for name in STEP_INPUTS]
    cache = []
    for layer in range(layers):
        dtype = dtypes[layer % len(dtypes)]
        cache.append(TensorSpec(f"past_key_values.{layer}.key", dtype, ("batch", 2, 16, 8)))
        cache.append(TensorSpec(f"past_key_values.{layer}.value", dtype, ("batch", 2, 16, 4)))
    return IOSpec(tuple(inputs + cache[::-1]), (), "", (), "", (), ())


def test_the_cache_tensors_are_named_as_optimum_names_them() -> None:
    assert STEP_INPUTS == ("input_ids", "attention_mask", "position_ids", "past_length")
    assert past_name(0, "key") == "past_key_values.0.key" and past_name(11, "value") == "past_key_values.11.value"
    assert present_name(3, "key") == "present.3.key" and present_name(0, "value") == "present.0.value"


def test_the_layout_of_a_step_graph_is_read_by_name() -> None:
    layout = cache_layout(step_spec(3, ("float16", "float32")), 3)
    assert layout.names == (
        "past_key_values.0.key",
        "past_key_values.0.value",
        "past_key_values.1.key",
        "past_key_values.1.value",
        "past_key_values.2.key",
        "past_key_values.2.value",
    )
    assert layout.shapes == ((2, 16, 8), (2, 16, 4)) * 3
    assert all(type(d) is int for shape in layout.shapes for d in shape)
    assert layout.dtypes == (torch.float16,) * 2 + (torch.float32,) * 2 + (torch.float16,) * 2
    assert layout.layers == 3 and layout.capacity == 16
    assert layout.present_names == (
        "present.0.key",
        "present.0.value",
        "present.1.key",
        "present.1.value",
        "present.2.key",
        "present.2.value",
    )


def test_a_row_of_cache_takes_the_bytes_of_its_tensors() -> None:
    # per layer: key 2 x 16 x 8 + value 2 x 16 x 4 = 384 values; float16 2 bytes, float32 4
    assert cache_layout(step_spec(1, ("float16",)), 1).bytes_per_row() == 384 * 2
    assert cache_layout(step_spec(2, ("float16", "float32")), 2).bytes_per_row() == 384 * 2 + 384 * 4
    assert cache_layout(step_spec(1, ("bfloat16",)), 1).bytes_per_row() == 384 * 2


def test_a_layout_reads_only_the_layers_asked_for_and_a_missing_one_is_a_key_error() -> None:
    spec = step_spec(2, ("float32",))
    assert cache_layout(spec, 1).names == ("past_key_values.0.key", "past_key_values.0.value")
    with pytest.raises(KeyError, match=r"past_key_values\.2\.key"):
        cache_layout(spec, 3)


def test_a_hand_made_layout_counts_its_layers_and_capacity() -> None:
    layout = CacheLayout(("a", "b", "c", "d"), ((1, 7, 2),) * 4, (torch.float32,) * 4)
    assert layout.layers == 2 and layout.capacity == 7 and layout.bytes_per_row() == 4 * 14 * 4
    assert layout.present_names == ("present.0.key", "present.0.value", "present.1.key", "present.1.value")
    with pytest.raises(ValueError):  # zip(strict=True): shapes and dtypes of different lengths are a bug
        CacheLayout(("a", "b"), ((1, 2, 3),) * 2, (torch.float32,)).bytes_per_row()
