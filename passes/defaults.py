"""The default pass list, built by an explicit function (never by import side effects)."""

from __future__ import annotations

from converters.registry import ConverterRegistry
from passes.base import GraphPass
from passes.chained_sums import ChainedSumsAsMatMul
from passes.cleanup.graph import RemoveDeadNodes, RemoveIdentities, TopologicalSort
from passes.cleanup.simplify import MergeScaleChains, MergeSqueezeChains, RemoveIdentityElements
from passes.cleanup.squeeze_axes import ExplicitSqueezeAxes
from passes.folding.fold import FoldConstants
from passes.fusions import fuse_decoder_ops
from passes.lowering import LowerCustomOps
from passes.parser_fixes import parser_fix_passes
from passes.precision.convert import ConvertPrecision
from passes.sibling_matmuls import MergeSiblingMatMuls


def default_passes(converters: ConverterRegistry | None = None) -> tuple[GraphPass, ...]:
    """The passes every conversion runs, in order: lowering with ``converters`` (when given) first, then cleanup,
    constant folding, chains of two constant scalings as one Mul, identity elements bypassed (``x + 0``, ``x * 1``:
    after folding, which makes them constants), explicit Squeeze axes, Unsqueeze and Squeeze chains merged (after the
    explicit axes, so those merge too), RMSNorm and rotate-half RoPE as the opset-23 ops (at opset >= 23; after folding,
    which makes their constants), sibling projections (q/k/v, gate/up: MatMuls of one input and constant weights) as one
    MatMul and a Split, long chains of normalisations' sums as MatMuls (TensorRT-RTX's builder time grows 3x per
    link otherwise), the rewrites of ops TensorRT's parser rejects (after folding, so the constants they need are
    initializers; what they build is folded on the next round), precision (float16/bfloat16 when ``settings.precision``
    asks for it: rules and ``keep_fp32`` islands; ``pipeline.convert`` runs it as its own stage, with measured islands)
    and topological sort."""
    lowering: tuple[GraphPass, ...] = () if converters is None else (LowerCustomOps(converters),)
    return (
        *lowering,
        RemoveIdentities(),
        RemoveDeadNodes(),
        FoldConstants(),
        MergeScaleChains(),
        RemoveIdentityElements(),
        ExplicitSqueezeAxes(),
        MergeSqueezeChains(),
        fuse_decoder_ops(),
        MergeSiblingMatMuls(),
        ChainedSumsAsMatMul(),
        *parser_fix_passes(),
        ConvertPrecision(),
        TopologicalSort(),
    )
