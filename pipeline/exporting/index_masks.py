"""transformers' attention masks built by broadcasting their index functions, not ``torch.vmap``, while exporting.

transformers builds an SDPA or eager mask from a function of ``(batch, head, query, key)`` indices. Its own mask
functions it broadcasts over index tensors shaped ``[B,1,1,1]``, ``[1,H,1,1]``, ``[1,1,Q,1]`` and ``[1,1,1,K]``; a mask
built with a function handed to it (``create_bidirectional_mask(..., and_mask_function=...)``: T5Gemma 2's sliding
window, an image-token overlay) it maps with ``torch.vmap`` over the four axes, as it cannot be sure such a function
is written on indices. torch.export keeps the vmap's batching in the program (``_add_batch_dim``), and after a
data-dependent check earlier in the forward (a multimodal encoder's count of its image tokens,
``torch._check_tensor_all``) the ONNX translation's decomposition fails inside it ("your tensor may have escaped from
inside a function being vmapped ... gen_vmap_plumbing").

Within :func:`index_masks`, the vmap expansion first calls the function on the broadcast index tensors, as
transformers does for its own functions, and keeps that mask when it is boolean, of four axes, and broadcasts to the
vmap's shape; a function that cannot run on broadcast indices (it branches in Python on an index's value) is mapped
with vmap as before. Both give the same mask for a function written element by element on its indices, which
transformers' mask functions are; the conversion's validation compares the graph with the model run eagerly, with
vmap.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch

from pipeline.exporting.patching import SharedPatch

logger = logging.getLogger(__name__)


def _broadcast_first(vmapped: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[..., Any]:
    def expansion(mask_function: Callable[..., Any]) -> Callable[..., Any]:
        def mask(*indices: torch.Tensor) -> Any:
            shape = tuple(index.shape[0] for index in indices)  # symbolic sizes stay symbolic
            broadcast = [
                index.reshape([-1 if axis == position else 1 for axis in range(len(indices))])
                for position, index in enumerate(indices)
            ]
            try:
                built = mask_function(*broadcast)
            except Exception as error:  # noqa: BLE001 - not written on indices: transformers' vmap, as it does
                logger.debug("mask function %r runs with vmap: %s", mask_function, error)
                built = None
            if isinstance(built, torch.Tensor) and built.dtype == torch.bool and built.dim() == len(shape):
                try:
                    return built.expand(shape)
                except RuntimeError:  # a shape that does not broadcast to the four axes: vmap decides
                    pass
            return vmapped(mask_function)(*indices)

        return mask

    return expansion


def _patch() -> SharedPatch | None:
    try:
        from transformers import masking_utils
    except ImportError:  # no transformers: nothing builds its masks
        return None
    if "_vmap_expansion_sdpa" not in masking_utils.__dict__:  # another transformers: its masks as it builds them
        return None
    return SharedPatch(masking_utils, "_vmap_expansion_sdpa", _broadcast_first)


_PATCH: SharedPatch | None = None
_LOOKED = False


def index_masks() -> Any:
    """A context in which transformers builds its SDPA and eager masks by broadcasting the mask function over index
    tensors before it tries ``torch.vmap`` (a no-op without transformers, or with one that builds them otherwise)."""
    global _PATCH, _LOOKED
    if not _LOOKED:  # transformers is imported on first use, not with the exporter
        _PATCH, _LOOKED = _patch(), True
    return _PATCH.held() if _PATCH is not None else contextlib.nullcontext()
