"""Col2Im as a Gather of the overlapping patch values of every output pixel and a ReduceSum (the parser rejects
Col2Im).

``X[n, c*K + j, l]`` (kernel position j of K, block l of L) is added to the output pixel that kernel position j of
block l lands on, if inside the image. For every output pixel the list of its contributions (j*L + l, in the
order of increasing j, as ONNX Runtime accumulates them) is padded to the longest with an index of an appended
zero: ``Reshape [N, C, K*L] -> Pad (one zero) -> Gather [N, C, P, M] -> ReduceSum over M -> Reshape``. Unlike a
MatMul with a 0/1 scatter matrix it multiplies nothing, so inf and NaN stay where they are, and it holds P*M
indices instead of a K*L x P matrix.

Needs ``image_shape`` and ``block_shape`` constant and the input's last two dimensions static (the batch may be
dynamic); any number of spatial dimensions, strides, dilations and pads.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from passes.parser_fixes.values import ValueResolver, dtype_of
from passes.rules import Facts, RewriteContext, RewriteRule

#: Larger index tables stay a Col2Im (4M int64 indices: 32 MiB).
MAX_INDEX_ELEMENTS = 1 << 22

_TYPES = frozenset({"float32", "float16", "float64"})


@dataclass(frozen=True)
class Col2ImPlan:
    """Col2Im with static sizes: channels, image size and, per output pixel, the patch values that add up into it."""

    channels: int  # C
    image: tuple[int, ...]
    indices: np.ndarray  # [P, M] into the flattened [K*L + 1] patch values (K*L is the appended zero)
    uses_zero: bool  # some pixel has fewer than M contributions
    dtype: np.dtype


class Col2ImToGather(RewriteRule[Col2ImPlan]):
    """``Col2Im`` -> ``Reshape``, ``Pad``, ``Gather``, ``ReduceSum``, ``Reshape`` (see module doc)."""

    name = "col2im_to_gather"
    ops = frozenset({"Col2Im"})

    def check(self, node: gs.Node, facts: Facts) -> Col2ImPlan | str:
        """A plan when the input's type and every size are static and supported; else the reason."""
        x = node.inputs[0]
        dtype = dtype_of(x)
        if str(dtype) not in _TYPES:
            return f"{dtype} input: rewritten for float32, float16 and float64 only"
        resolver = ValueResolver(facts.opset)
        image, block = resolver.resolve(node.inputs[1]), resolver.resolve(node.inputs[2])
        if image is None or block is None or image.size != block.size:
            return "image_shape and block_shape are not constants of the same length"
        shape = x.shape
        if shape is None or len(shape) != 3 or not all(isinstance(d, int | np.integer) for d in shape[1:]):
            return "the input's channel and block dimensions are not static"
        image_t, block_t = tuple(image.tolist()), tuple(block.tolist())
        kernel, blocks = int(np.prod(block_t)), int(shape[2])
        if kernel == 0 or shape[1] % kernel:
            return f"{shape[1]} input channels are not a multiple of the {kernel} kernel positions"
        attrs = _attrs(node, len(image_t))
        counts = _block_counts(image_t, block_t, *attrs)
        if int(np.prod(counts)) != blocks:
            return f"the input has {blocks} blocks, the attributes give {int(np.prod(counts))}"
        if int(np.prod(image_t)) * kernel > MAX_INDEX_ELEMENTS:
            return f"the index table would exceed MAX_INDEX_ELEMENTS = {MAX_INDEX_ELEMENTS}"
        assert dtype is not None
        table = contributions(image_t, block_t, counts, *attrs)
        return Col2ImPlan(int(shape[1]) // kernel, image_t, table, bool((table == kernel * blocks).any()), dtype)

    def rewrite(self, plan: Col2ImPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """Reshape the patches, Gather the contributions of every pixel, ReduceSum them, Reshape to the image."""
        x, dtype = ctx.node.inputs[0], plan.dtype
        patches = ctx.typed(dtype).Reshape(x, np.array([0, plan.channels, -1], np.int64))
        if plan.uses_zero:
            patches = ctx.typed(dtype).Pad(patches, np.array([0, 0, 0, 0, 0, 1], np.int64), mode="constant")
        indices = plan.indices if plan.indices.shape[1] > 1 else plan.indices[:, 0]
        gathered = ctx.typed(dtype).Gather(patches, ctx.constant(indices, "pixel_sources"), axis=2)
        if plan.indices.shape[1] > 1:
            gathered = ctx.typed(dtype).ReduceSum(gathered, np.array([3], np.int64), keepdims=0)
        shape = np.array([0, plan.channels, *plan.image], np.int64)
        return [ctx.typed(dtype).Reshape(gathered, shape)]


def _attrs(node: gs.Node, spatial: int) -> tuple[list[int], list[int], list[int]]:
    dilations = list(node.attrs.get("dilations", [1] * spatial))
    pads = list(node.attrs.get("pads", [0] * 2 * spatial))
    strides = list(node.attrs.get("strides", [1] * spatial))
    return dilations, pads, strides


def _block_counts(
    image: tuple[int, ...], block: tuple[int, ...], dilations: list[int], pads: list[int], strides: list[int]
) -> list[int]:
    s = len(image)
    return [(image[i] + pads[i] + pads[s + i] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(s)]


def contributions(
    image: tuple[int, ...],
    block: tuple[int, ...],
    counts: list[int],
    dilations: list[int],
    pads: list[int],
    strides: list[int],
) -> np.ndarray:
    """``[prod(image), M]``: for each output pixel, the flat indices ``j*L + l`` that add to it in increasing order,
    padded with ``K*L`` (the appended zero)."""
    spatial = len(image)
    offsets = np.array(list(itertools.product(*(range(b) for b in block))), np.int64).reshape(-1, spatial)
    positions = np.array(list(itertools.product(*(range(c) for c in counts))), np.int64).reshape(-1, spatial)
    begin = np.array(pads[:spatial], np.int64)
    pixel = positions[None] * np.array(strides) - begin + offsets[:, None] * np.array(dilations)  # [K, L, S]
    inside = np.all((pixel >= 0) & (pixel < np.array(image)), axis=-1)
    kernel, n_blocks = offsets.shape[0], positions.shape[0]
    source = np.arange(kernel * n_blocks).reshape(kernel, n_blocks)[inside]  # j-major: ONNX Runtime's order
    target = np.ravel_multi_index(tuple(pixel[inside].T), image) if source.size else source
    order = np.argsort(target, kind="stable")
    per_pixel = np.bincount(target, minlength=int(np.prod(image)))
    width = max(int(per_pixel.max(initial=0)), 1)
    rank = np.arange(order.size) - np.repeat(np.cumsum(per_pixel) - per_pixel, per_pixel)
    table = np.full((per_pixel.size, width), kernel * n_blocks, np.int64)
    table[target[order], rank] = source[order]
    return table
