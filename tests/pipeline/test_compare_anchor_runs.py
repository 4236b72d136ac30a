"""The parts of the anchored rule (``pipeline.accuracy.anchor``) on their own, without a conversion: which tensors
anchor, the widened tolerance and its line, ``PrecisionMode``'s exceptions (no kernel, writes into float32, guards)
and ``AnchorRuns`` (its runs, its cached state, a model it cannot run, its notes). The rule end to end, on converted
models, is test_compare_anchor.py."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from converters.settings import DEFAULT_TOLERANCES, Tolerance
from pipeline.accuracy.anchor import (
    ANCHOR_DTYPES,
    FACTORS,
    NO_ANCHOR,
    AnchorRuns,
    PrecisionMode,
    anchor_type,
    anchored_tolerance,
)
from pipeline.runtime.io_spec import TensorSpec

FLOAT32, FLOAT16, BFLOAT16 = (DEFAULT_TOLERANCES[t] for t in ("float32", "float16", "bfloat16"))


def test_the_anchor_types_and_factors() -> None:
    assert dict(ANCHOR_DTYPES) == {"float32": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
    assert dict(FACTORS) == {"float32": 2.0, "float16": 3.0, "bfloat16": 3.0}


@pytest.mark.parametrize("computed_in", ["float32", "float16", "bfloat16"])
def test_a_default_tolerance_anchors_to_the_type_it_is_computed_in(computed_in: str) -> None:
    tolerance = DEFAULT_TOLERANCES[computed_in]
    assert anchor_type(computed_in, tolerance, False) == computed_in
    assert anchor_type(computed_in, tolerance, True) == ""  # the user gave it: kept as given
    assert anchor_type(computed_in, dataclasses.replace(tolerance, source="derived"), False) == ""
    assert anchor_type(computed_in, dataclasses.replace(tolerance, atol=tolerance.atol * 2), False) == ""


def test_other_types_and_other_types_defaults_do_not_anchor() -> None:
    assert anchor_type("int64", DEFAULT_TOLERANCES["int64"], False) == ""
    assert anchor_type("float64", DEFAULT_TOLERANCES["float64"], False) == ""
    assert anchor_type("float16", FLOAT32, False) == ""  # float32's tolerance on a float16 tensor: someone chose it


def test_the_float32_anchor_widens_the_elementwise_rule_only() -> None:
    reference = np.array([3.0, -4.0, 0.0, 0.0])  # RMS 2.5
    own = reference + np.array([0.0, 0.001, -0.002, 0.0])
    widened, line = anchored_tolerance(FLOAT32, reference, own, "float32")
    assert widened.rms_atol == pytest.approx(2.0 * 0.002 / 2.5) and widened.rms == 0.0
    assert (widened.atol, widened.rtol) == (FLOAT32.atol, FLOAT32.rtol)
    assert line == "PyTorch float64 vs float32: max 0.002"


def test_a_float32_output_as_close_to_the_float64_answer_passes_though_it_rounds_the_other_way() -> None:
    from pipeline.accuracy.stats import tolerance_ratio

    reference = np.array([3.0, -4.0, 0.0, 0.0])  # PyTorch float32, RMS 2.5
    exact = reference + np.array([0.0, 0.001, -0.002, 0.0])  # float64: PyTorch float32 is 0.002 off at most
    ours = exact + np.array([0.0, 0.0, -0.003, 0.0])  # 0.003 from the exact answer, 0.005 (2.5x) from float32
    plain, _ = anchored_tolerance(FLOAT32, reference, exact, "float32")
    assert tolerance_ratio(ours, reference, plain) > 1  # judged against PyTorch float32 alone it fails
    widened, line = anchored_tolerance(FLOAT32, reference, exact, "float32", ours)
    assert tolerance_ratio(ours, reference, widened) <= 1
    assert line == "PyTorch float64 vs float32: max 0.002; the output vs float64: max 0.003"
    farther = exact + np.array([0.0, 0.0, -0.0041, 0.0])  # beyond 2x PyTorch's own 0.002 from the exact answer
    kept, line = anchored_tolerance(FLOAT32, reference, exact, "float32", farther)
    assert kept == plain and tolerance_ratio(farther, reference, kept) > 1
    assert line == "PyTorch float64 vs float32: max 0.002"
    half, _ = anchored_tolerance(FLOAT16, reference, exact, "float16", ours)  # half anchors are not the exact answer
    assert half == anchored_tolerance(FLOAT16, reference, exact, "float16")[0]


def test_the_half_anchor_widens_the_elementwise_and_rms_rules() -> None:
    reference = np.array([3.0, -4.0, 0.0, 0.0])
    own = reference + np.array([0.02, 0.0, 0.0, 0.0])  # max 0.02, RMS 0.01
    widened, line = anchored_tolerance(FLOAT16, reference, own, "float16")
    assert widened.rms_atol == pytest.approx(3.0 * 0.02 / 2.5) and widened.rms == pytest.approx(3.0 * 0.01 / 2.5)
    assert line == "PyTorch float16 vs float32: max 0.02, RMS 0.004 x RMS"
    bf16, line = anchored_tolerance(BFLOAT16, reference, own, "bfloat16")
    assert bf16.rms_atol == BFLOAT16.rms_atol and bf16.rms == BFLOAT16.rms  # never below the fixed tolerance
    assert line.startswith("PyTorch bfloat16 vs float32: max 0.02")


def test_nothing_to_anchor_to_leaves_the_tolerance_and_says_nothing() -> None:
    assert anchored_tolerance(FLOAT16, np.array([]), np.array([]), "float16") == (FLOAT16, "")
    zeros = np.zeros(4)
    assert anchored_tolerance(FLOAT16, zeros, zeros + 1.0, "float16") == (FLOAT16, "")  # RMS of the reference 0
    assert anchored_tolerance(FLOAT32, np.ones(3), np.full(3, np.nan), "float32")[0] is FLOAT32


def test_an_anchor_that_leaves_its_range_is_said_per_type() -> None:
    reference = np.ones(4)
    widened, line = anchored_tolerance(FLOAT32, reference, np.full(4, np.inf), "float32")
    assert widened is FLOAT32
    assert line == (
        "PyTorch's own float64 is inf or NaN on 4 of 4 elements where float32 is finite: the model's values leave "
        f"float64's range; {NO_ANCHOR}"
    )
    widened, line = anchored_tolerance(BFLOAT16, reference, np.full(4, np.inf), "bfloat16")
    assert "bfloat16's range; no anchor" in line and "has float32's range" not in line
    # where float32 is not finite either, PyTorch's own inf is no loss
    reference = np.array([1.0, np.inf, 2.0, 3.0])
    own = np.array([1.1, np.inf, 2.0, 3.0])
    widened, line = anchored_tolerance(FLOAT16, reference, own, "float16")
    assert "inf or NaN" not in line and widened.rms_atol > FLOAT16.rms_atol
    with_nan = anchored_tolerance(FLOAT16, reference, np.array([1.1, np.inf, np.nan, 3.0]), "float16")[1]
    assert "inf or NaN on 1 of 4 elements" in with_nan and with_nan.endswith(", judged on the finite rest")


def test_precision_mode_runs_an_op_without_a_kernel_in_float32_and_names_it() -> None:
    a = torch.tensor([[4.0, 1.0], [1.0, 3.0]])
    with torch.no_grad(), PrecisionMode(torch.float16) as mode:
        inverse = torch.linalg.inv(a)
        doubled = inverse * 2
    assert any("inv" in op for op in mode.float32_ops), mode.float32_ops
    assert all(op.startswith("aten.") for op in mode.float32_ops)
    assert inverse.dtype == torch.float32 and doubled.dtype == torch.float16
    assert torch.allclose(inverse, torch.linalg.inv(a), atol=1e-3)
    with torch.no_grad(), PrecisionMode(torch.float64) as exact:
        assert torch.linalg.inv(a).dtype == torch.float64
    assert not exact.float32_ops


def test_precision_mode_computes_moe_grouped_products_in_float64() -> None:
    """PyTorch's ``_grouped_mm`` (transformers' MoE experts) has no float64 kernel: the float64 run writes it out as one
    product per group, so that a MoE model's anchor is a float64 answer (it ran in float32, named in the report)."""
    tokens, weights = torch.randn(6, 8, dtype=torch.float64), torch.randn(3, 8, 16, dtype=torch.float64)
    ends = torch.tensor([2, 2, 6], dtype=torch.int32)
    with torch.no_grad(), PrecisionMode(torch.float64) as mode:
        product = torch._grouped_mm(tokens.float(), weights.float(), ends)
    assert product.dtype == torch.float64 and not mode.float32_ops
    expected = torch.cat([tokens[:2] @ weights[0], tokens[2:6] @ weights[2]])
    assert torch.allclose(product, expected, rtol=0, atol=1e-12)  # float64's own rounding, not float32's


def test_precision_mode_writes_into_a_float32_tensor_in_place_and_through_out() -> None:
    counter, total = torch.zeros(3), torch.zeros(3)
    with torch.no_grad(), PrecisionMode(torch.float64):
        counter.add_(torch.ones(3) / 3)
        torch.add(torch.ones(3), 1.0 / 3, out=total)
        made = torch.ones(3) / 3
    assert counter.dtype == total.dtype == torch.float32
    assert torch.equal(counter, torch.full((3,), 1 / 3)) and torch.equal(total, torch.full((3,), 4 / 3))
    assert made.dtype == torch.float64 and made[0].item() == 1 / 3  # a tensor it makes itself: float64
    indices = torch.arange(3)
    with PrecisionMode(torch.float16):
        assert (indices * 2).dtype == torch.int64  # integers are not floats to widen or narrow


def test_precision_mode_keeps_a_guard_float32_through_views_to_the_op_that_reads_it() -> None:
    """``x / clamp_min(norm, 1e-12)`` of a zero vector: 1e-12 is 0 in float16, so the guard runs in float32 (as the
    converted graph keeps it), stays float32 through a view, and the division reads it in float32: 0, not NaN."""
    zero = torch.zeros(1, 4)
    with torch.no_grad(), PrecisionMode(torch.float16) as mode:
        norm = zero.norm(dim=-1, keepdim=True)
        guard = norm.clamp_min(1e-12)
        viewed = guard.view(1, 1).expand(1, 4)
        normalised = zero / viewed
        after = normalised + 1
    assert norm.dtype == torch.float16 and guard.dtype == torch.float32 and viewed.dtype == torch.float32
    assert normalised.dtype == torch.float16 and torch.equal(normalised, torch.zeros(1, 4, dtype=torch.float16))
    assert after.dtype == torch.float16 and not mode.float32_ops
    with torch.no_grad(), PrecisionMode(torch.float16):
        unguarded = zero.norm(dim=-1, keepdim=True).clamp_min(0.5)  # 0.5 is a float16 value: no guard
        assert unguarded.dtype == torch.float16
        assert (zero / unguarded.expand(1, 4)).dtype == torch.float16


class StandIn:
    """The two things AnchorRuns asks of an I/O spec: the outputs' names and the call a feed makes."""

    def __init__(self, *outputs: str) -> None:
        self.outputs = tuple(TensorSpec(name, "float32", (2, 3)) for name in outputs)

    def feed_to_call(self, feed: dict[str, torch.Tensor]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (feed["x"],), {"index": feed["index"]}


class Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.register_buffer("offset", torch.full((3,), 0.1))
        self.register_buffer("steps", torch.tensor(2))
        self.calls = 0

    def forward(self, x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        assert index.dtype == torch.int64 and self.steps.dtype == torch.int64
        y = self.linear(x) + self.offset
        return y, y[:, index] * self.steps


def feed() -> dict[str, np.ndarray]:
    return {"x": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "index": np.array([2, 0, 1])}


def test_anchor_runs_run_the_model_in_float64_once_per_input() -> None:
    torch.manual_seed(0)
    model = Two().eval()
    runs = AnchorRuns(model, StandIn("y", "z"))  # type: ignore[arg-type]
    got = runs.outputs("float32", feed())
    assert got is not None and list(got) == ["y", "z"]
    with torch.no_grad():
        exact = model.linear.double()(torch.from_numpy(feed()["x"]).double()) + torch.full((3,), 0.1).double()
    model.float()
    assert got["y"].dtype == np.float64 and np.allclose(got["y"], exact.numpy(), rtol=0, atol=1e-15)
    assert np.allclose(got["z"], exact.numpy()[:, [2, 0, 1]] * 2, rtol=0, atol=1e-15)
    assert runs.runs == 1 and runs.seconds > 0 and not runs.refused and runs.note("float32") == ""
    state = runs._state[torch.float64]
    assert state["linear.weight"].dtype == torch.float64 and state["steps"].dtype == torch.int64
    assert model.linear.weight.dtype == torch.float32  # the model itself is not touched
    runs.outputs("float32", feed())
    assert runs.runs == 2 and runs._state[torch.float64] is state and list(runs._state) == [torch.float64]


def test_anchor_runs_in_half_precision_give_pytorchs_own_half_error() -> None:
    torch.manual_seed(0)
    model = Two().eval()
    runs = AnchorRuns(model, StandIn("y", "z"))  # type: ignore[arg-type]
    half = runs.outputs("float16", feed())
    assert half is not None and half["y"].dtype == np.float64
    with torch.no_grad():
        want = model(torch.from_numpy(feed()["x"]), torch.tensor([2, 0, 1]))[0].numpy()
    error = np.abs(half["y"] - want).max()
    assert 0 < error < 5e-3  # float16's rounding, no more
    assert list(runs._state) == [torch.float16]


def test_a_model_without_parameters_runs_on_the_cpu() -> None:
    class Plain(nn.Module):
        def forward(self, x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x / 3, x[:, index]

    got = AnchorRuns(Plain(), StandIn("y", "z")).outputs("float32", feed())  # type: ignore[arg-type]
    assert got is not None and got["y"][0, 0] == -1 / 3


def test_a_model_that_cannot_run_in_the_anchor_type_is_refused_once_with_the_reason() -> None:
    class Picky(Two):
        def forward(self, x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            self.calls += 1
            if x.dtype != torch.float32:
                raise TypeError(f"only float32,\n   please: got   {x.dtype} " + "x" * 300)
            return x, x

    model = Picky()
    runs = AnchorRuns(model, StandIn("y", "z"))  # type: ignore[arg-type]
    assert runs.outputs("float32", feed()) is None and model.calls == 1
    reason = runs.refused["float32"]
    assert reason.startswith("TypeError: only float32, please: got torch.float64 xxx") and len(reason) == 211
    assert runs.outputs("float32", feed()) is None and model.calls == 1  # not tried again
    assert runs.runs == 0 and runs.seconds > 0
    assert runs.note("float32") == f"PyTorch cannot run the model in float64 ({reason}): the fixed tolerance stands"
    assert runs.note("float16") == ""
    assert runs.outputs("float16", feed()) is None and "float16" in runs.refused
    assert runs.note("float16").startswith("PyTorch cannot run the model in float16 (TypeError: only float32,")


def test_the_note_names_the_ops_left_in_float32() -> None:
    class Inverts(nn.Module):
        def forward(self, x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            square = x[:, :2] @ x[:, :2].T + torch.eye(2)
            return torch.linalg.inv(square), x

    runs = AnchorRuns(Inverts(), StandIn("y", "z"))  # type: ignore[arg-type]
    assert runs.outputs("float16", feed()) is not None
    assert runs.float32_ops and runs.note("float16") == (
        "ops computed in float32 in PyTorch's float16 run (no kernel): " + ", ".join(sorted(runs.float32_ops))
    )
    assert runs.note("float32").startswith("ops computed in float32 in PyTorch's float64 run (no kernel): aten.")


def test_tolerance_fields_are_what_the_rule_widens() -> None:
    """The fields anchored_tolerance replaces exist under these names (a rename would fail here first)."""
    assert {f.name for f in dataclasses.fields(Tolerance)} >= {"atol", "rtol", "rms_atol", "rms", "source"}


def test_an_empty_tensor_anchors_without_a_numpy_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "Mean of empty slice" would reach the user's stderr
        assert anchored_tolerance(FLOAT16, np.zeros(0, np.float32), np.zeros(0), "float16") == (FLOAT16, "")


def test_float32_outputs_are_measured_in_float64() -> None:
    """A float32 reference of large values: its mean square overflows float32 (1e40), not float64."""
    reference = np.full(4, 1e20, np.float32)
    anchor = reference.astype(np.float64) * 1.01
    widened, line = anchored_tolerance(FLOAT16, reference, anchor, "float16")
    assert widened.rms_atol == pytest.approx(0.03, rel=1e-3) and widened.rms == pytest.approx(0.03, rel=1e-3)
    assert line == "PyTorch float16 vs float32: max 1e+18, RMS 0.01 x RMS"


def test_the_float16_overflow_line_in_full() -> None:
    line = anchored_tolerance(FLOAT16, np.ones(4), np.full(4, np.inf), "float16")[1]
    assert line == (
        "PyTorch's own float16 is inf or NaN on 4 of 4 elements where float32 is finite: the model's values leave "
        f"float16's range (bfloat16 has float32's range); {NO_ANCHOR}"
    )


def test_a_feed_of_any_layout_reaches_the_model_on_the_device_of_its_weights() -> None:
    """A reversed (negative-stride) view is copied (torch.from_numpy refuses it); the feed goes where the weights are
    (a GPU model's run on its GPU: the meta device stands in for one here)."""
    seen: list[torch.device] = []

    class Records(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3))

        def forward(self, x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            seen.extend([x.device, index.device])
            return torch.ones(2, 3), torch.ones(2, 3)

    reversed_feed = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)[::-1], "index": np.array([2, 0, 1])[::-1]}
    assert AnchorRuns(Records(), StandIn("y", "z")).outputs("float32", reversed_feed) is not None  # type: ignore[arg-type]
    assert seen == [torch.device("cpu")] * 2
    seen.clear()
    runs = AnchorRuns(Records().to("meta"), StandIn("y", "z"))  # type: ignore[arg-type]
    assert runs.outputs("float32", feed()) is not None and seen == [torch.device("meta")] * 2


def test_a_fresh_anchor_run_counts_nothing_and_the_note_lists_every_op() -> None:
    runs = AnchorRuns(Two(), StandIn("y", "z"))  # type: ignore[arg-type]
    assert (runs.runs, runs.seconds, runs.float32_ops, runs.refused) == (0, 0.0, set(), {})
    runs.float32_ops |= {"aten.b.default", "aten.a.default"}
    assert runs.note("float16") == (
        "ops computed in float32 in PyTorch's float16 run (no kernel): aten.a.default, aten.b.default"
    )


def test_a_zero_scalar_is_no_guard() -> None:
    """0 is exact in every type: ``clamp_min(x, 0.0)`` is an ordinary op, computed in float16."""
    with torch.no_grad(), PrecisionMode(torch.float16) as mode:
        clamped = torch.ones(4).clamp_min(0.0)
    assert clamped.dtype == torch.float16 and not mode._guards


def test_anchor_runs_add_up_their_time_and_their_float32_ops() -> None:
    class InvertsInHalf(nn.Module):
        def forward(self, x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            square = x[:, :2] @ x[:, :2].T + torch.eye(2)
            return torch.linalg.inv(square), x

    runs = AnchorRuns(InvertsInHalf(), StandIn("y", "z"))  # type: ignore[arg-type]
    runs.outputs("float16", feed())
    first, ops = runs.seconds, set(runs.float32_ops)
    assert 0 < first < 60 and ops
    runs.outputs("float32", feed())  # float64 has every kernel: no op of its own to add
    assert first < runs.seconds < 60 and runs.float32_ops == ops and runs.runs == 2


def test_a_model_that_returns_other_outputs_than_the_spec_is_an_error() -> None:
    runs = AnchorRuns(Two(), StandIn("y"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="zip"):
        runs.outputs("float32", feed())


def test_an_op_reading_a_guard_takes_all_its_inputs_in_float32_and_keeps_integer_results() -> None:
    """A matmul of a float16 tensor and the float32 guard (torch's mm takes one dtype), an argmax of the guard (its
    int64 result stays int64)."""
    with torch.no_grad(), PrecisionMode(torch.float16):
        guard = torch.full((2, 2), 2.0).clamp_min(1e-12)
        product = torch.ones(2, 2) @ guard
        position = guard.argmax()
    assert (
        guard.dtype == torch.float32
        and product.dtype == torch.float16
        and torch.equal(product, product.new_full((2, 2), 4))
    )
    assert position.dtype == torch.int64


def test_a_write_into_a_float32_tensor_takes_its_other_inputs_in_float32() -> None:
    """A matmul into a float32 ``out=`` (a cache buffer) of tensors the mode made in float64: torch's mm wants one
    dtype, so they are cast to float32 first."""
    out = torch.zeros(2, 2)
    with torch.no_grad(), PrecisionMode(torch.float64):
        made = torch.ones(2, 2)
        torch.mm(made, made, out=out)
        torch.zeros(2, 2).addmm_(made, made)  # in place into a tensor made inside: float64, no write exception
    assert made.dtype == torch.float64 and out.dtype == torch.float32 and torch.equal(out, torch.full((2, 2), 2.0))


def test_tensors_the_model_makes_itself_come_out_in_the_mode_type() -> None:
    """A factory without a dtype makes the default float32, cast on the way out; one asking for float32 is made in
    float64 itself (its values computed there: linspace's sixths are float64's)."""
    with torch.no_grad(), PrecisionMode(torch.float64):
        ones = torch.ones(3)
        asked = torch.linspace(0, 1, 7, dtype=torch.float32)
        counted = torch.arange(3)
    assert ones.dtype == torch.float64 and counted.dtype == torch.int64
    assert asked.dtype == torch.float64 and torch.equal(asked, torch.linspace(0, 1, 7, dtype=torch.float64))
