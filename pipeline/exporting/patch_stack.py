"""Every patch the export stage applies to PyTorch, transformers and onnxscript, in one place, in two stacks.

Each patch is its own module, which says what it changes and why; this module is the list, in the order they are
entered. Both stacks are scoped to one export (every patch is restored when it ends) and, where a patch replaces a
shared function, shared between threads exporting at once (:class:`~pipeline.exporting.patching.SharedPatch`).

While **tracing** (``torch.export``, :func:`tracing_patches`):

- :func:`~pipeline.exporting.composites.static_composites`: composite ops with a branch on tensor values traced
  through an equivalent Python form;
- :func:`~pipeline.exporting.module_to.unchanged_module_to_is_free`: a ``module.to(...)`` in ``forward`` that
  changes nothing traced as nothing;
- :func:`~pipeline.exporting.moe_dispatch.dense_expert_dispatch`: experts chosen by a Python loop over their tokens
  dispatched densely;
- :func:`~pipeline.exporting.index_masks.index_masks`: transformers' masks built by broadcasting their index
  functions, not ``torch.vmap``;
- :func:`~pipeline.exporting.traced_branches.branches_as_recorded` (and ``real_values_decide``): Python branches on
  tensor data taken as the sample takes them, when the first trace failed on them;
- :func:`~pipeline.exporting.errors.partial_graph_unprinted`: torch.export's partial graph kept out of its error.

While **translating** to ONNX (``torch.onnx.export`` of the program, :func:`translation_patches`):

- :func:`~pipeline.exporting.translation_table.reused_translation_table`: the registry of ATen translations built
  once per process;
- :func:`~pipeline.exporting.rewriter_guard.linear_multi_output_matching`: onnxscript's optimizer in linear time;
- :func:`~pipeline.exporting.exact_identities.exact_identity_constants`: ``x + 0`` removed only where the constant
  is exactly 0 (an epsilon of ``1e-8`` is kept);
- :func:`~pipeline.exporting.torch_folding.torch_constant_folding`: folded ``exp``, ``pow``, ``sin``... are
  PyTorch's values, not numpy's;
- :func:`~pipeline.exporting.local_decompositions.local_decompositions`: decompositions node by node, not a retrace;
- :func:`~pipeline.exporting.type_promotion.fast_type_promotion`: type promotion without running every node again.

A new patch joins its stack here, with its line above.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from pipeline.exporting import errors as export_errors
from pipeline.exporting.composites import static_composites
from pipeline.exporting.exact_identities import exact_identity_constants
from pipeline.exporting.index_masks import index_masks
from pipeline.exporting.local_decompositions import local_decompositions
from pipeline.exporting.module_to import unchanged_module_to_is_free
from pipeline.exporting.moe_dispatch import dense_expert_dispatch
from pipeline.exporting.rewriter_guard import linear_multi_output_matching
from pipeline.exporting.torch_folding import torch_constant_folding
from pipeline.exporting.traced_branches import Branches, branches_as_recorded, real_values_decide
from pipeline.exporting.translation_table import reused_translation_table
from pipeline.exporting.type_promotion import fast_type_promotion


@contextlib.contextmanager
def tracing_patches(
    model: torch.nn.Module, branches: Branches | None, *, unchanged_to: bool, real_values: bool
) -> Iterator[None]:
    """The patches of one ``torch.export`` of ``model``: ``branches`` recorded from the sample (None: traced as
    written), ``unchanged_to`` (``Tensor.to`` of an unchanged tensor traced as free; False after torch.export's
    verifier refused it), ``real_values`` (the sample's values decide guards on data-dependent sizes)."""
    with (
        static_composites(unchanged_to),
        unchanged_module_to_is_free(),
        dense_expert_dispatch(model),
        index_masks(),
        branches_as_recorded(branches),
        real_values_decide(branches) if real_values and branches is not None else contextlib.nullcontext(),
        export_errors.partial_graph_unprinted(),
    ):
        yield


@contextlib.contextmanager
def translation_patches() -> Iterator[None]:
    """The patches of one ONNX translation (``torch.onnx.export`` of a torch.export program)."""
    with (
        reused_translation_table(),
        linear_multi_output_matching(),
        exact_identity_constants(),
        torch_constant_folding(),
        local_decompositions(),
        fast_type_promotion(),
    ):
        yield
