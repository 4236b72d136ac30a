"""The cache of a cached decoder step: its tensors' graph names (as optimum and ONNX Runtime GenAI name them) and its
layout (names, shapes, dtypes) as the runners allocate it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from pipeline.runtime.io_spec import IOSpec

#: The step's inputs before the cache, in order.
STEP_INPUTS = ("input_ids", "attention_mask", "position_ids", "past_length")


def past_name(layer: int, kind: str) -> str:
    """``past_key_values.{layer}.{kind}`` (kind: ``key`` or ``value``): a cache input."""
    return f"past_key_values.{layer}.{kind}"


#: Kinds of a layer's recurrent-state tensors (``past_key_values.{i}.conv``, ``.recurrent``; a layer's further states
#: ``conv_1``, ``recurrent_1``, ...): fixed-size, batch-first, replaced whole by every step (never written in place).
STATE_KINDS = ("conv", "recurrent")


def state_kind(kind: str, index: int) -> str:
    """The name kind of a layer's state ``index`` of ``kind`` (``conv``, ``conv_1``, ...)."""
    return kind if index == 0 else f"{kind}_{index}"


#: The name kind of an indexed attention layer's indexer keys (DeepSeek sparse attention's:
#: ``past_key_values.{i}.indexer`` [batch, 1, capacity, index dim]), written in place as the layer's keys are.
INDEXER = "indexer"


def is_state_name(name: str) -> bool:
    """Whether the cache tensor ``name`` is a recurrent state (not keys or values)."""
    kind = name.rsplit(".", 1)[-1]
    return kind.split("_", 1)[0] in STATE_KINDS


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
    (equal in most models; multi-head latent attention's keys are wider: DeepSeek-V3's 192 against 128) and dtype;
    ``indexer_dim`` the width of an indexed layer's indexer keys (DeepSeek sparse attention's one-head key cache,
    0 without: :data:`INDEXER`); ``indexer_writes`` the names of the model's cache-layer methods that write them
    (transformers' ``update_indexer``; MiniMax-M3's block indexer's ``update_index``), which the step's cache layer
    answers to (not part of the layout's identity)."""

    heads: int
    key_dim: int
    value_dim: int
    dtype: torch.dtype
    indexer_dim: int = 0
    indexer_writes: tuple[str, ...] = field(default=("update_indexer",), compare=False)
    #: the generated tokens the model's own cache layer keeps beside its prompt's, evicting older ones (a reference
    #: sliding window's: :mod:`pipeline.generation.kept_windows`); 0: every one, as the step keeps them
    window: int = field(default=0, compare=False)

    @classmethod
    def of(
        cls,
        keys: torch.Tensor,
        values: torch.Tensor,
        indexer: torch.Tensor | None = None,
        writes: tuple[str, ...] = ("update_indexer",),
    ) -> CachedLayer:
        """The layer of a cache's 4-D ``keys`` and ``values`` [batch, heads, tokens, width] (and an indexed layer's
        indexer keys [batch, (1,) tokens, width], written by the methods ``writes``)."""
        width = int(indexer.shape[-1]) if indexer is not None else 0
        return cls(int(keys.shape[1]), int(keys.shape[-1]), int(values.shape[-1]), keys.dtype, width, writes)

    def kinds(self) -> tuple[str, ...]:
        """The name kinds of the layer's tensors, in step-input order."""
        return ("key", "value", INDEXER) if self.indexer_dim else ("key", "value")

    def storage(self, rows: int, capacity: int) -> list[torch.Tensor]:
        """The layer's static key and value storage of ``capacity`` tokens (and its indexer keys'), zeros."""
        widths = (self.key_dim, self.value_dim)
        kv = [torch.zeros(rows, self.heads, capacity, width, dtype=self.dtype) for width in widths]
        indexer = [torch.zeros(rows, 1, capacity, self.indexer_dim, dtype=self.dtype)] if self.indexer_dim else []
        return kv + indexer


@dataclass(frozen=True)
class CacheLayout:
    """The cache inputs of a step graph: per tensor its name, shape after the batch axis, and dtype."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]

    @property
    def layers(self) -> int:
        """The number of cached layers."""
        if self._pairs:  # keys and values: a pair per layer
            return len(self.names) // 2
        return len({name.split(".")[1] for name in self.names})

    @property
    def _pairs(self) -> bool:
        """Whether the layout is each layer's keys and values alone (no state, no indexer keys)."""
        return all(self.in_place) and not any(name.endswith(f".{INDEXER}") for name in self.names)

    @property
    def capacity(self) -> int:
        """The cache's sequence capacity (tokens): the positions of its first keys (0 without keys: Mamba's)."""
        return next((s[1] for n, s in zip(self.names, self.shapes, strict=True) if not is_state_name(n)), 0)

    @property
    def present_names(self) -> tuple[str, ...]:
        """The matching outputs, ``present.{i}.{kind}``."""
        if self._pairs:
            return tuple(present_name(i, kind) for i in range(self.layers) for kind in ("key", "value"))
        return tuple(present_name(int(layer), kind) for _, layer, kind in (n.split(".", 2) for n in self.names))

    @property
    def in_place(self) -> tuple[bool, ...]:
        """Per tensor: may its ``present`` output share its ``past`` input's memory (keys and values: the step writes
        the new positions into a copy of its input), or must it be another buffer (a recurrent state: the step
        computes the new state from the old one over many nodes, which must all read the old)."""
        return tuple(not is_state_name(name) for name in self.names)

    def bytes_per_row(self) -> int:
        """Cache bytes for one batch row."""
        return sum(
            int(np.prod(s)) * torch.empty((), dtype=d).element_size()
            for s, d in zip(self.shapes, self.dtypes, strict=True)
        )


def cache_layout(io: IOSpec, layers: int) -> CacheLayout:
    """The layout of the ``past_key_values.{i}.{kind}`` inputs of ``io``: each layer's keys and values (and indexer
    keys), then its recurrent states (:data:`STATE_KINDS`), as the step graph takes them."""
    specs = {t.name: t for t in io.inputs}
    names = tuple(
        name
        for i in range(layers)
        for name in (
            *(past_name(i, kind) for kind in ("key", "value", INDEXER) if past_name(i, kind) in specs),
            *(t.name for t in io.inputs if t.name.startswith(past_name(i, "")) and is_state_name(t.name)),
        )
    )
    if layers and not any(name.startswith(past_name(layers - 1, "")) for name in names):
        raise KeyError(past_name(layers - 1, "key"))  # the last layer holds tensors (a layer between may hold none)
    shapes = tuple(tuple(int(d) for d in specs[n].shape[1:]) for n in names)
    return CacheLayout(names, shapes, tuple(specs[n].torch_dtype for n in names))
