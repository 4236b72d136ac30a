"""Converters end to end: custom ops exported as opaque nodes, registry rules, the lowering pass and its errors."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
import torch
from torch import nn

import pipeline
from converters.context import ConverterContext
from converters.registry import ConverterRegistry, Priority
from converters.settings import Settings

# -- a torch.library op: two tensor inputs (one optional), a float, an int list, a string, two outputs -----------


@torch.library.custom_op("convtest::scale_shift", mutates_args=())
def scale_shift(
    x: torch.Tensor, bias: torch.Tensor | None, alpha: float, dims: list[int], mode: str
) -> tuple[torch.Tensor, torch.Tensor]:
    shifted = x + (bias if bias is not None else 0.0)
    reduced = shifted.sum(dim=dims, keepdim=True) if mode == "sum" else shifted.amax(dim=dims, keepdim=True)
    return x * alpha, shifted - reduced


@scale_shift.register_fake
def _(x: torch.Tensor, bias: torch.Tensor | None, alpha: float, dims: list[int], mode: str) -> tuple[torch.Tensor, ...]:
    return torch.empty_like(x), torch.empty_like(x)


def convert_scale_shift(ctx: ConverterContext) -> list[gs.Tensor]:
    x, bias = ctx.input("x"), ctx.input("bias")
    scaled = ctx.op.Mul(x, ctx.constant(np.float32(ctx.attrs["alpha"])))
    shifted = x if bias is None else ctx.op.Add(x, bias)
    axes = ctx.constant(np.array(ctx.attrs["dims"], np.int64))
    reduce = ctx.op.ReduceSum if ctx.attrs["mode"] == "sum" else ctx.op.ReduceMax
    return [scaled, ctx.op.Sub(shifted, reduce(shifted, axes, keepdims=1))]


class UsesScaleShiftTwice(nn.Module):
    def forward(self, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, c = torch.ops.convtest.scale_shift(x, b, 2.0, [1], "sum")
        d, e = torch.ops.convtest.scale_shift(a, None, -0.5, [0, 1], "max")
        return c + d * e


def scale_shift_registry() -> ConverterRegistry:
    registry = ConverterRegistry()
    registry.register("convtest::scale_shift")(convert_scale_shift)
    return registry


def test_custom_op_with_mixed_arguments_used_twice() -> None:
    model = UsesScaleShiftTwice()
    x, b = torch.randn(3, 4), torch.randn(3, 4)
    module = pipeline.convert(model, (x, b), converters=scale_shift_registry(), backend="onnxruntime")
    ops = [n.op_type for n in module.onnx.graph.node]
    assert "scale_shift" not in ops and {"ReduceSum", "ReduceMax"} <= set(ops)
    names = [n.name for n in module.onnx.graph.node if n.op_type in ("ReduceSum", "ReduceMax")]
    assert all("scale_shift" in name and "/" in name for name in names)  # named after the node they replaced
    x2, b2 = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(module(x2, b2), model(x2, b2), rtol=1e-5, atol=1e-5)


def test_opaque_node_carries_typed_attributes() -> None:
    seen: list[dict[str, object]] = []

    def spy(ctx: ConverterContext) -> list[gs.Tensor]:
        seen.append({**ctx.attrs, "bias": ctx.input("bias") is not None, "shapes": ctx.input_shapes})
        return convert_scale_shift(ctx)

    registry = ConverterRegistry()
    registry.register(torch.ops.convtest.scale_shift)(spy)
    pipeline.convert(
        UsesScaleShiftTwice(),
        (torch.randn(3, 4), torch.randn(3, 4)),
        converters=registry,
        backend="onnxruntime",
        validate=False,
    )
    assert seen[0] == {"alpha": 2.0, "dims": [1], "mode": "sum", "bias": True, "shapes": [(3, 4), (3, 4)]}
    assert seen[1]["alpha"] == -0.5 and seen[1]["dims"] == [0, 1] and seen[1]["bias"] is False


# -- the GeLU override, as in Torch-TensorRT's tutorial ------------------------------------------------------------


def gelu_registry() -> ConverterRegistry:
    registry = ConverterRegistry()

    def tanh_only(node: gs.Node, settings: Settings) -> bool:
        return bool(node.attrs.get("approximate") == "tanh")

    @registry.register("Gelu", priority=Priority.HIGH, validator=tanh_only)
    def gelu_tanh(ctx: ConverterContext) -> gs.Tensor:
        x = ctx.inputs[0]
        cube = ctx.op.Mul(ctx.op.Mul(x, x), x)
        inner = ctx.op.Mul(ctx.op.Add(x, ctx.op.Mul(cube, np.float32(0.044715))), np.float32(np.sqrt(2 / np.pi)))
        return ctx.op.Mul(ctx.op.Mul(x, np.float32(0.5)), ctx.op.Add(ctx.op.Tanh(inner), np.float32(1.0)))

    return registry


@pytest.mark.parametrize(("approximate", "overridden"), [("tanh", True), ("none", False)])
def test_gelu_override_only_for_tanh(approximate: str, overridden: bool) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(approximate=approximate)).eval()
    module = pipeline.convert(model, torch.randn(4, 8), converters=gelu_registry(), backend="onnxruntime")
    ops = [n.op_type for n in module.onnx.graph.node]
    assert ("Tanh" in ops) is overridden and ("Gelu" in ops) is not overridden
    x = torch.randn(5, 8) * 3
    module = pipeline.convert(
        model,
        torch.randn(4, 8),
        converters=gelu_registry(),
        backend="onnxruntime",
        dynamic={"input": {0: ("batch", 1, 4, 8)}},
    )
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x), rtol=1e-5, atol=1e-5)


# -- folding a constant weight at conversion time ------------------------------------------------------------------


@torch.library.custom_op("convtest::scaled_linear", mutates_args=())
def scaled_linear(x: torch.Tensor, weight: torch.Tensor, scale: float) -> torch.Tensor:
    return x @ (weight * scale).T


@scaled_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, scale: float) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


class ScaledLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.convtest.scaled_linear(x, self.weight, 0.25)


def test_converter_folds_a_constant_weight() -> None:
    registry = ConverterRegistry()

    @registry.register("convtest::scaled_linear")
    def fold(ctx: ConverterContext) -> gs.Tensor:
        weight = ctx.inputs[1]
        assert isinstance(weight, gs.Constant), "a parameter reaches the converter as a constant"
        folded = ctx.constant((weight.values * ctx.attrs["scale"]).T.astype(np.float32), "weight_t")
        return ctx.op.MatMul(ctx.inputs[0], folded)

    model = ScaledLinear().eval()
    module = pipeline.convert(model, torch.randn(3, 4), converters=registry, backend="onnxruntime")
    graph = module.onnx.graph
    assert [n.op_type for n in graph.node] == ["MatMul"]
    assert [tuple(i.dims) for i in graph.initializer] == [(4, 6)]  # only the folded weight, transposed
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x), rtol=1e-5, atol=1e-5)


# -- dynamic shapes and the dynamic-shape flag ---------------------------------------------------------------------


def test_static_only_converter_is_skipped_for_dynamic_batch() -> None:
    registry = scale_shift_registry()
    used: list[str] = []

    @registry.register("convtest::scale_shift", priority=Priority.HIGH, supports_dynamic_shapes=False)
    def static_only(ctx: ConverterContext) -> list[gs.Tensor]:
        used.append("static")
        return convert_scale_shift(ctx)

    model = UsesScaleShiftTwice()
    sample = (torch.randn(3, 4), torch.randn(3, 4))
    pipeline.convert(model, sample, converters=registry, backend="onnxruntime")
    assert used == ["static", "static"]  # static shapes: the HIGH candidate wins
    used.clear()
    dynamic = {"x": {0: ("batch", 1, 3, 8)}, "b": {0: ("batch", 1, 3, 8)}}
    module = pipeline.convert(model, sample, converters=registry, backend="onnxruntime", dynamic=dynamic)
    assert used == []  # dynamic batch: it is skipped and the STANDARD one is used
    x, b = torch.randn(7, 4), torch.randn(7, 4)
    torch.testing.assert_close(module(x, b), model(x, b), rtol=1e-5, atol=1e-5)


def test_no_candidate_for_dynamic_shapes_is_a_clear_error() -> None:
    registry = ConverterRegistry()
    registry.register("convtest::scale_shift", supports_dynamic_shapes=False)(convert_scale_shift)
    dynamic = {"x": {0: ("batch", 1, 3, 8)}, "b": {0: ("batch", 1, 3, 8)}}
    with pytest.raises(pipeline.ConversionError) as info:
        pipeline.convert(
            UsesScaleShiftTwice(),
            (torch.randn(3, 4), torch.randn(3, 4)),
            converters=registry,
            backend="onnxruntime",
            dynamic=dynamic,
        )
    assert "supports_dynamic_shapes=False" in str(info.value)


# -- an op with no converter ---------------------------------------------------------------------------------------


class Block(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.convtest.scale_shift(x, None, 1.0, [1], "sum")[1]


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_op_without_converter_error_lists_op_count_node_module_and_decorator() -> None:
    with pytest.raises(pipeline.ConversionError) as info:
        pipeline.convert(Blocks(), torch.randn(2, 4), converters=ConverterRegistry(), backend="onnxruntime")
    text = str(info.value)
    assert "convtest::scale_shift x3" in text
    assert "from module 'blocks.0'" in text
    assert "@converters.register('convtest::scale_shift')" in text
    assert "node 'node_scale_shift" in text


def test_converter_returning_wrong_count_names_the_converter() -> None:
    registry = ConverterRegistry()

    @registry.register("convtest::scale_shift")
    def one_output(ctx: ConverterContext) -> gs.Tensor:
        return ctx.op.Identity(ctx.inputs[0])

    with pytest.raises(pipeline.ConversionError, match=r"one_output for convtest::scale_shift returned 1 value"):
        pipeline.convert(Blocks(), torch.randn(2, 4), converters=registry, backend="onnxruntime")


def test_converter_returning_wrong_dtype_is_caught() -> None:
    registry = ConverterRegistry()

    @registry.register("convtest::scale_shift")
    def wrong_dtype(ctx: ConverterContext) -> list[gs.Tensor]:
        return [ctx.op.Cast(ctx.inputs[0], to=7), ctx.op.Identity(ctx.inputs[0])]  # 7: int64

    with pytest.raises(pipeline.ConversionError, match=r"wrong_dtype.*output 0 is int64, the op's output is float32"):
        pipeline.convert(Blocks(), torch.randn(2, 4), converters=registry, backend="onnxruntime")


# -- registry misuse ---------------------------------------------------------------------------------------------


def test_target_that_names_no_op() -> None:
    registry = ConverterRegistry()
    with pytest.raises(pipeline.ConversionError, match=r"(?s)convtest::scale_shfit names no torch op.*import"):
        registry.register("convtest::scale_shfit")
    with pytest.raises(pipeline.ConversionError, match=r"(?s)'gelu' names no ONNX op.*did you mean 'Gelu'"):
        registry.register("gelu")


def test_overload_packet_where_an_overload_is_needed() -> None:
    with pytest.raises(pipeline.ConversionError, match=r"(?s)overload packet.*aten::mean.default"):
        ConverterRegistry().register(torch.ops.aten.mean)
    with pytest.raises(pipeline.ConversionError, match=r"(?s)names no overload.*aten::mean.dim"):
        ConverterRegistry().register("aten::mean.nope")


def test_duplicate_registration_and_removal() -> None:
    registry = scale_shift_registry()
    with pytest.raises(pipeline.ConversionError, match=r"already registered"):
        registry.register("convtest::scale_shift")(convert_scale_shift)
    assert registry.remove("convtest::scale_shift") == 1
    with pytest.raises(pipeline.ConversionError, match=r"nothing registered"):
        registry.remove("convtest::scale_shift")


def test_priority_then_registration_order_and_skip_reasons() -> None:
    registry = ConverterRegistry()
    calls: list[str] = []
    for name, priority, accept in (
        ("first_std", Priority.STANDARD, True),
        ("high_no", Priority.HIGH, False),
        ("second_std", Priority.STANDARD, True),
    ):

        def fn(ctx: ConverterContext, name: str = name) -> None:
            calls.append(name)

        fn.__qualname__ = name
        registry.register("Relu", priority=priority, validator=lambda n, s, a=accept: a)(fn)
    node = gs.Node("Relu", "r", inputs=[gs.Variable("x", np.float32, (2,))], outputs=[gs.Variable("y")])
    selection = registry.select(node, next(registry.op_keys()), Settings(), dynamic=False)
    assert selection.entry is not None and selection.entry.name == "first_std"
    assert [(e.name, reason) for e, reason in selection.skipped] == [("high_no", "its validator rejected the node")]


# -- ops defined with Library.define, and the user's own translation table ----------------------------------------

_LIB = torch.library.Library("convtest2", "DEF")
_LIB.define("clamp_sq(Tensor x, float limit, bool square=True) -> Tensor")


def _clamp_sq(x: torch.Tensor, limit: float, square: bool = True) -> torch.Tensor:
    y = x.clamp(-limit, limit)
    return y * y if square else y


_LIB.impl("clamp_sq", _clamp_sq, "CPU")
_LIB.impl("clamp_sq", lambda x, limit, square=True: torch.empty_like(x), "Meta")


class ClampSq(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.convtest2.clamp_sq(x, 0.5, False) + torch.ops.convtest2.clamp_sq(x, 1.0)


def convert_clamp_sq(ctx: ConverterContext) -> gs.Tensor:
    limit = ctx.attrs["limit"]
    y = ctx.op.Clip(ctx.inputs[0], np.float32(-limit), np.float32(limit))
    return ctx.op.Mul(y, y) if ctx.attrs["square"] else y


def test_library_define_op_with_bool_default() -> None:
    registry = ConverterRegistry()
    registry.register("convtest2::clamp_sq")(convert_clamp_sq)
    module = pipeline.convert(ClampSq(), torch.randn(4, 4) * 2, converters=registry, backend="onnxruntime")
    x = torch.randn(4, 4) * 2
    torch.testing.assert_close(module(x), ClampSq()(x), rtol=1e-5, atol=1e-5)


def test_user_translation_table_takes_precedence() -> None:
    from onnxscript import opset18 as op

    def translate(x, limit, square=True):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        clipped = op.Clip(x, op.Constant(value_float=-limit), op.Constant(value_float=limit))
        return op.Mul(clipped, clipped) if square else clipped

    module = pipeline.convert(
        ClampSq(),
        torch.randn(4, 4) * 2,
        converters=ConverterRegistry(),
        backend="onnxruntime",
        custom_translation_table={torch.ops.convtest2.clamp_sq.default: translate},
    )
    assert "clamp_sq" not in [n.op_type for n in module.onnx.graph.node]
    x = torch.randn(4, 4) * 2
    torch.testing.assert_close(module(x), ClampSq()(x), rtol=1e-5, atol=1e-5)
