"""Cross-entropy converters: ``torch.nn.functional.linear_cross_entropy``'s chunked ops
(``torch_nn::_linear_cross_entropy_batch_chunked[_no_reduction]``), and the exporter's unbatched
``SoftmaxCrossEntropyLoss`` / ``NegativeLogLikelihoodLoss`` (1-D scores, which ONNX does not define: ONNX Runtime
refuses the graph) given the batch of one that ONNX requires."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
import torch

from converters.aten.case_modules import Ternary
from converters.aten.numeric.linalg_steps import axes
from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry
from converters.settings import Settings

_LINEAR_CROSS_ENTROPY = "torch.nn.modules.linear_cross_entropy"  # defines the torch_nn ops (torch >= 2.13)
_OPTIONS = "torch.nn.modules.linear_cross_entropy_options"


def _unbatched(node: gs.Node, settings: Settings) -> bool:
    """A loss node whose scores are 1-D (one sample, no batch axis)."""
    scores = node.inputs[0]
    return scores.shape is not None and len(scores.shape) == 1


def _class_index(a: torch.Tensor, classes: int) -> torch.Tensor:
    return (a.abs() * 10).long() % classes


@converter_case(
    lambda: Ternary(lambda x, w, t: torch.nn.functional.cross_entropy(x @ w.T, _class_index(t, 5))),
    inputs=[((3,), "float32"), ((5, 3), "float32"), ((), "float32")],
)
@converter_case(
    lambda: Ternary(
        lambda x, w, t: torch.nn.functional.nll_loss((x @ w.T).log_softmax(0), _class_index(t, 4), reduction="none")
    ),
    inputs=[((6,), "float32"), ((4, 6), "float32"), ((), "float32")],
)
def convert_unbatched_loss(ctx: ConverterContext) -> list[gs.Tensor]:
    """``SoftmaxCrossEntropyLoss`` / ``NegativeLogLikelihoodLoss`` of 1-D scores ``(C,)`` and a 0-d target: the
    same op on ``(1, C)`` and ``(1,)`` (what PyTorch computes for an unbatched input), its outputs squeezed back
    (``reduction='none'``: a 0-d loss; the log-probabilities: ``(C,)``)."""
    first = axes(ctx, 0)
    scores = _known(ctx.op.Unsqueeze(ctx.inputs[0], first), ctx.input_dtypes[0], (1, *(ctx.input_shapes[0] or ())))
    target = _known(ctx.op.Unsqueeze(ctx.inputs[1], first), ctx.input_dtypes[1], (1,))
    extra = [t for t in ctx.inputs[2:]]
    outputs = ctx.make_node(ctx.node.op, [scores, target, *extra], dict(ctx.node.attrs), len(ctx.node.outputs))
    reduction = ctx.node.attrs.get("reduction", "mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else str(reduction)
    loss = ctx.op.Squeeze(outputs[0], first) if reduction == "none" else outputs[0]
    return [loss, *(ctx.op.Squeeze(t, first) for t in outputs[1:])]


def _known(tensor: gs.Variable, dtype: Any, shape: tuple[Any, ...] | None) -> gs.Variable:
    """``tensor`` with its dtype and shape recorded: the loss node built on it is rewritten by a later parser fix
    that reads them (the lowering pass infers only the types of a converter's outputs)."""
    tensor.dtype, tensor.shape = dtype, None if shape is None else list(shape)
    return tensor


def _chunked_supported(node: gs.Node, settings: Settings) -> bool:
    """No label smoothing, no gradients asked for, and a mean/sum/none reduction."""
    reduction = node.attrs.get("reduction", b"none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else str(reduction)
    grads = any(int(node.attrs.get(f"compute_{g}_grad", 0)) for g in ("input", "linear_weight", "linear_bias"))
    return float(node.attrs.get("label_smoothing", 0.0)) == 0.0 and not grads and reduction in ("mean", "sum", "none")


_LINEAR_INPUTS: list[tuple[tuple[int, ...], str]] = [((5, 4), "float32"), ((6, 4), "float32"), ((5,), "float32")]


class _LinearCrossEntropy(torch.nn.Module):
    def __init__(self, reduction: str, classes: int) -> None:
        super().__init__()
        self.reduction, self.classes = reduction, classes

    def forward(self, x: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        options = importlib.import_module(_OPTIONS).LinearCrossEntropyOptions(batch_chunk_size=2)
        target = _class_index(t, self.classes)
        target = torch.where(target == 1, -100, target)  # ignored targets too
        return torch.nn.functional.linear_cross_entropy(x, w, target, reduction=self.reduction, options=options)


@converter_case(lambda: _LinearCrossEntropy("mean", 6), inputs=_LINEAR_INPUTS)
@converter_case(lambda: _LinearCrossEntropy("sum", 6), inputs=_LINEAR_INPUTS)
@converter_case(lambda: _LinearCrossEntropy("none", 6), inputs=_LINEAR_INPUTS)
def convert_linear_cross_entropy(ctx: ConverterContext) -> Any:
    """``torch_nn::_linear_cross_entropy_batch_chunked[_no_reduction]``: ``cross_entropy(input @ linear_weight.T
    + linear_bias, target, weight, ignore_index, reduction)`` in one ``MatMul`` and one
    ``SoftmaxCrossEntropyLoss`` (the chunking only bounds PyTorch's memory; the loss is the same up to the order
    of its sums). The scalar op's three gradient outputs are not asked for (validator): empty constants."""
    x, linear_weight, target = ctx.inputs[0], ctx.inputs[1], ctx.inputs[2]
    bias, weight = ctx.input("linear_bias"), ctx.input("weight")
    dtype = ctx.input_dtypes[0] or np.dtype(np.float32)
    logits = ctx.op.MatMul(x, ctx.op.Transpose(linear_weight, perm=[1, 0]))
    if bias is not None:
        logits = ctx.op.Add(logits, bias)
    x_shape, weight_shape = ctx.input_shapes[0], ctx.input_shapes[1]
    known = x_shape is not None and weight_shape is not None
    logits = _known(logits, dtype, (*x_shape[:-1], weight_shape[0]) if known else None)  # type: ignore[index]
    reduction = str(ctx.attrs.get("reduction") or "none")
    inputs = [logits, target] + ([weight] if weight is not None else [])
    loss = ctx.op.SoftmaxCrossEntropyLoss(*inputs, reduction=reduction, ignore_index=int(ctx.attrs["ignore_index"]))
    if len(ctx.node.outputs) == 1:
        return loss
    shapes = [(0, 0), (0, 0), (0,)]  # what the op returns for gradients it was not asked for
    return [loss, *(ctx.constant(np.zeros(s, dtype), "no_grad") for s in shapes)]


def register_loss_converters(registry: ConverterRegistry) -> None:
    """Register the cross-entropy converters on ``registry`` (the chunked ones where torch defines their ops)."""
    registry.register("SoftmaxCrossEntropyLoss", validator=_unbatched)(convert_unbatched_loss)
    registry.register("NegativeLogLikelihoodLoss", validator=_unbatched)(convert_unbatched_loss)
    if importlib.util.find_spec(_LINEAR_CROSS_ENTROPY) is None:
        return  # a torch without linear_cross_entropy: its ops can never appear in a graph
    importlib.import_module(_LINEAR_CROSS_ENTROPY)
    for op in ("_linear_cross_entropy_batch_chunked", "_linear_cross_entropy_batch_chunked_no_reduction"):
        registry.register(f"torch_nn::{op}", validator=_chunked_supported)(convert_linear_cross_entropy)
