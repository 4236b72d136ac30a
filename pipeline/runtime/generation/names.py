"""The graph names of a cached decoder step's cache tensors (as optimum and ONNX Runtime GenAI name them)."""

from __future__ import annotations

#: The step's inputs before the cache, in order.
STEP_INPUTS = ("input_ids", "attention_mask", "position_ids", "past_length")


def past_name(layer: int, kind: str) -> str:
    """``past_key_values.{layer}.{kind}`` (kind: ``key`` or ``value``): a cache input."""
    return f"past_key_values.{layer}.{kind}"


def present_name(layer: int, kind: str) -> str:
    """``present.{layer}.{kind}`` (kind: ``key`` or ``value``): a cache output."""
    return f"present.{layer}.{kind}"
