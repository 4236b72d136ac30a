"""A tiny custom op and its converter, shared by pass tests."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import torch

from converters.context import ConverterContext
from converters.registry import ConverterRegistry


@torch.library.custom_op("passtest::clamp_add", mutates_args=())
def clamp_add(x: torch.Tensor, limit: float) -> torch.Tensor:
    return x.clamp(-limit, limit) + 1.0


@clamp_add.register_fake
def _(x: torch.Tensor, limit: float) -> torch.Tensor:
    return torch.empty_like(x)


class UsesClamp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.passtest.clamp_add(x, 0.5) * 2


CLAMP_REGISTRY = ConverterRegistry()


@CLAMP_REGISTRY.register("passtest::clamp_add")
def convert_clamp_add(ctx: ConverterContext) -> gs.Tensor:
    limit = np.float32(ctx.attrs["limit"])
    return ctx.op.Add(ctx.op.Clip(ctx.inputs[0], -limit, limit), np.float32(1.0))
