"""The cache of a cached decoder step: its tensors' graph names (as optimum and ONNX Runtime GenAI name them) and its
layout (names, shapes, dtypes) as the runners allocate it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.runtime.io_spec import IOSpec

#: The step's inputs before the cache, in order.
STEP_INPUTS = ("input_ids", "attention_mask", "position_ids", "past_length")


def past_name(layer: int, kind: str) -> str:
    """``past_key_values.{layer}.{kind}`` (kind: ``key`` or ``value``): a cache input."""
    return f"past_key_values.{layer}.{kind}"


def cross_name(layer: int, kind: str) -> str:
    """``cross.{layer}.{kind}``: an encoder-decoder's cross-attention keys or values (the encoder graph's outputs,
    the step's inputs)."""
    return f"cross.{layer}.{kind}"


def present_name(layer: int, kind: str) -> str:
    """``present.{layer}.{kind}`` (kind: ``key`` or ``value``): a cache output."""
    return f"present.{layer}.{kind}"


@dataclass(frozen=True)
class CachedLayer:
    """One cached attention layer as the model writes it: its key-value heads, the widths of a key and of a value
    (equal in most models; multi-head latent attention's keys are wider: DeepSeek-V3's 192 against 128) and dtype."""

    heads: int
    key_dim: int
    value_dim: int
    dtype: torch.dtype

    @classmethod
    def of(cls, keys: torch.Tensor, values: torch.Tensor) -> CachedLayer:
        """The layer of a cache's 4-D ``keys`` and ``values`` [batch, heads, tokens, width]."""
        return cls(int(keys.shape[1]), int(keys.shape[-1]), int(values.shape[-1]), keys.dtype)

    def storage(self, rows: int, capacity: int) -> list[torch.Tensor]:
        """The layer's static key and value storage of ``capacity`` tokens, zeros."""
        return [
            torch.zeros(rows, self.heads, capacity, width, dtype=self.dtype) for width in (self.key_dim, self.value_dim)
        ]


@dataclass(frozen=True)
class CacheLayout:
    """The cache inputs of a step graph: per tensor its name, shape after the batch axis, and dtype."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]

    @property
    def layers(self) -> int:
        """The number of cached layers."""
        return len(self.names) // 2

    @property
    def capacity(self) -> int:
        """The cache's sequence capacity (tokens)."""
        return self.shapes[0][1]

    @property
    def present_names(self) -> tuple[str, ...]:
        """The matching outputs, ``present.{i}.key/value``."""
        return tuple(present_name(i, kind) for i in range(self.layers) for kind in ("key", "value"))

    def bytes_per_row(self) -> int:
        """Cache bytes for one batch row."""
        return sum(
            int(np.prod(s)) * torch.empty((), dtype=d).element_size()
            for s, d in zip(self.shapes, self.dtypes, strict=True)
        )


def cache_layout(io: IOSpec, layers: int) -> CacheLayout:
    """The layout of the ``past_key_values.{i}.key/value`` inputs of ``io``."""
    specs = {t.name: t for t in io.inputs}
    names = tuple(past_name(i, kind) for i in range(layers) for kind in ("key", "value"))
    shapes = tuple(tuple(int(d) for d in specs[n].shape[1:]) for n in names)
    return CacheLayout(names, shapes, tuple(specs[n].torch_dtype for n in names))
