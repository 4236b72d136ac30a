"""``convert(..., precision="fp16" | "bf16")`` on real models: real export, the precision stage, ONNX Runtime (float32
emulation of the half graph), PyTorch fp32 as the reference, and TensorRT's static parser check.

Conversions are shared through module-scoped fixtures; every accuracy check uses fresh inputs (never the sample,
the calibration or the validation inputs) and the validation rule with the documented per-dtype tolerance.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from model_zoo import tiny_bert_config
from rtx_build import assert_builds
from torch import nn

import pipeline
from converters.errors import ConversionError
from pipeline.compatibility.static import check
from pipeline.precision.report import load_keep_fp32

transformers = pytest.importorskip("transformers")

BACKEND = "onnxruntime"


def fresh(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def assert_within(got: torch.Tensor, want: torch.Tensor, dtype: str) -> None:
    """The validation rule: |got - want| <= atol or <= rtol * |want|, with the default tolerance of ``dtype``."""
    tolerance = pipeline.DEFAULT_TOLERANCES[dtype]
    assert got.dtype == want.dtype == torch.float32  # outputs keep the model's types
    error = (got - want).abs()
    allowed = torch.clamp(tolerance.rtol * want.abs(), min=tolerance.atol)
    assert bool((error <= allowed).all()), f"worst error / tolerance: {float((error / allowed).max()):.3g}"


def input_types(module: pipeline.ConvertedModule, op: str) -> set[int]:
    inferred = onnx.shape_inference.infer_shapes(module.onnx).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.value_info, *inferred.input]}
    return {types[n.input[0]] for n in module.onnx.graph.node if n.op_type == op}


def island_nodes(module: pipeline.ConvertedModule, source: str) -> dict[str, str]:
    precision = module.report.precision
    assert precision is not None
    return {i.node: i.reason for i in precision.islands if i.source == source}


# -- models ----------------------------------------------------------------------------------------------------------


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 1))
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = nn.functional.max_pool2d(torch.relu(x + self.block(x)), 2)
        return self.head(x.mean(dim=(2, 3)))


def make_cnn() -> CNN:
    torch.manual_seed(0)
    model = CNN().eval()
    for bn in model.modules():
        if isinstance(bn, nn.BatchNorm2d):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    return model


def make_bert() -> nn.Module:
    torch.manual_seed(0)
    return transformers.BertModel(tiny_bert_config()).eval()


def bert_inputs(batch: int, seq: int, seed: int, lengths: list[int]) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 100, (batch, seq), generator=torch.Generator().manual_seed(seed))
    mask = (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": ids, "attention_mask": mask}


CNN_DYNAMIC = {"x": {0: ("batch", 1, 2, 8)}}


@pytest.fixture(scope="module", params=["fp16", "bf16"])
def cnn(request: pytest.FixtureRequest) -> tuple[nn.Module, pipeline.ConvertedModule, str]:
    model = make_cnn()
    module = pipeline.convert(
        model, fresh(2, 3, 16, 16, seed=0), backend=BACKEND, precision=request.param, dynamic=CNN_DYNAMIC
    )
    return model, module, request.param


@pytest.fixture(scope="module", params=["fp16", "bf16"])
def bert(request: pytest.FixtureRequest) -> tuple[nn.Module, pipeline.ConvertedModule, str]:
    model = make_bert()
    module = pipeline.convert(
        model, bert_inputs(2, 8, seed=0, lengths=[8, 5]), backend=BACKEND, precision=request.param
    )
    return model, module, request.param


DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
ONNX_TYPES = {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}


# -- CNN ------------------------------------------------------------------------------------------------------------


def test_cnn_matches_pytorch_fp32_at_every_batch_size(cnn: tuple[nn.Module, pipeline.ConvertedModule, str]) -> None:
    model, module, precision = cnn
    for batch, seed in ((1, 11), (7, 12)):
        x = fresh(batch, 3, 16, 16, seed=seed)
        with torch.no_grad():
            assert_within(module(x), model(x), DTYPES[precision])
    dims = [d.dim_param or d.dim_value for d in module.onnx.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 3, 16, 16]  # dynamic shapes preserved


def test_cnn_computes_all_convolutions_low_and_passes_the_tensorrt_check(
    cnn: tuple[nn.Module, pipeline.ConvertedModule, str],
) -> None:
    _, module, precision = cnn
    report = module.report.precision
    assert report is not None and report.precision == precision
    assert input_types(module, "Conv") == {ONNX_TYPES[precision]}
    assert report.share == 1.0 and report.islands == () and report.casts_added == 2  # one in, one out
    assert module.report.accuracy is not None and module.report.accuracy.passed
    assert check(module.onnx).ok
    assert_builds(module)  # the real TensorRT-RTX builder builds the final graph
    if precision == "bf16":
        assert module.onnx.opset_import[0].version == 22  # Conv and pooling take bfloat16 from opset 22


def test_cnn_artifact_keeps_the_precision_report_and_runs_again(
    cnn: tuple[nn.Module, pipeline.ConvertedModule, str], tmp_path: Path
) -> None:
    _, module, _ = cnn
    again = pipeline.load(module.save(tmp_path / "m.ptrt"))
    assert again.report.precision == module.report.precision
    x = fresh(3, 3, 16, 16, seed=13)
    torch.testing.assert_close(again(x), module(x))


# -- BERT -----------------------------------------------------------------------------------------------------------


def test_bert_matches_pytorch_fp32_on_fresh_padded_inputs(
    bert: tuple[nn.Module, pipeline.ConvertedModule, str],
) -> None:
    model, module, precision = bert
    inputs = bert_inputs(2, 8, seed=21, lengths=[6, 8])
    with torch.no_grad():
        got, want = module(**inputs), model(**inputs)
    assert_within(got.last_hidden_state, want.last_hidden_state, DTYPES[precision])
    assert_within(got.pooler_output, want.pooler_output, DTYPES[precision])


def test_bert_report_shows_share_islands_and_error(bert: tuple[nn.Module, pipeline.ConvertedModule, str]) -> None:
    _, module, precision = bert
    report = module.report.precision
    assert report is not None
    assert report.share == 1.0  # every MatMul and Gemm in the low type
    rules = island_nodes(module, "rule")
    assert {i.op for i in report.islands if i.node in rules} >= {"LayerNormalization", "Softmax"}
    assert sum(i.op == "LayerNormalization" for i in report.islands) == 5
    assert any("beyond" in reason for reason in rules.values())  # finfo(float32).min in the attention mask
    assert report.calibration_error <= 1.0
    accuracy = module.report.accuracy
    tolerance = pipeline.DEFAULT_TOLERANCES[DTYPES[precision]]
    assert accuracy is not None and accuracy.passed
    assert all((o.atol, o.rtol) == (tolerance.atol, tolerance.rtol) for o in accuracy.outputs)
    summary = module.report.summary()
    assert f"precision {precision}: 100.0% of MatMul/Gemm/Conv FLOPs in {DTYPES[precision]}" in summary
    assert f"validated against PyTorch fp32 with the {DTYPES[precision]} tolerance" in summary
    assert check(module.onnx).ok
    assert_builds(module)  # the real TensorRT-RTX builder builds the final graph


# -- user islands by module path ------------------------------------------------------------------------------------


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(2))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def test_user_islands_by_module_path(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = Blocks().eval()
    with caplog.at_level(logging.WARNING):
        module = pipeline.convert(
            model, fresh(4, 16, seed=0), backend=BACKEND, precision="fp16", keep_fp32=("blocks.1", "blocks.9")
        )
    report = module.report.precision
    assert report is not None
    user = [i for i in report.islands if i.source == "user"]
    assert user and all(i.module is not None and i.module.startswith("blocks.1") for i in user)
    assert {i.op for i in user} >= {"Gemm", "Gelu"} or {i.op for i in user} >= {"MatMul", "Gelu"}
    assert report.unmatched_keep_fp32 == ("blocks.9",)
    assert "keep_fp32 entry 'blocks.9' matched no node" in caplog.text
    assert 0.3 < report.share < 0.7  # blocks.0 and head low, blocks.1 float32
    assert_builds(module)  # the real TensorRT-RTX builder builds the final graph
    x = fresh(4, 16, seed=1)
    with torch.no_grad():
        assert_within(module(x), model(x), "float16")


# -- measured islands: activations beyond float16 before a LayerNorm -------------------------------------------------


class Overflow(nn.Module):
    """A Linear whose outputs reach ~1e5 (beyond float16's 65504), then LayerNorm and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 8)
        with torch.no_grad():
            self.up.weight.mul_(80000.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.up(x)))


def test_activations_beyond_float16_need_measured_islands() -> None:
    torch.manual_seed(0)
    model = Overflow().eval()
    sample = fresh(4, 16, seed=0)
    x = fresh(4, 16, seed=31)
    with torch.no_grad():
        want = model(x)
        assert float(model.up(x).abs().max()) > 65504
    bare = dict(precision_rules=False, precision_search=False, validate=False)
    without = pipeline.convert(model, sample, backend=BACKEND, precision="fp16", precision_measure=False, **bare)
    with torch.no_grad():
        got = without(x)
    assert not bool(torch.isfinite(got).all()) or float((got - want).abs().max()) > 1.0
    calibration = [fresh(4, 16, seed=s) for s in (1, 2, 3)]
    measured = pipeline.convert(model, sample, backend=BACKEND, precision="fp16", calibration=calibration, **bare)
    with torch.no_grad():
        assert_within(measured(x), want, "float16")
    islands = island_nodes(measured, "measured")
    assert islands and all("float16's largest" in reason for reason in islands.values())
    assert measured.report.precision is not None and measured.report.precision.calibration_inputs == 3
    assert_builds(measured)  # the real TensorRT-RTX builder builds the final graph


# -- accuracy-driven search, saved and reused ------------------------------------------------------------------------


class Cancellation(nn.Module):
    """(h + 1000) - 1000: float16 keeps steps of 0.5 around 1000, so h loses its fraction unless kept float32."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.b(torch.relu(self.a(x)))
        return self.head((h + 1000.0) - 1000.0)


def test_search_finds_the_cancelling_nodes_and_its_result_can_be_reused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Cancellation().eval()
    sample = fresh(4, 16, seed=0)
    # PyTorch's own float16 cancels as much (the anchored rule would pass it): the fixed rule makes the search run
    module = pipeline.convert(model, sample, backend=BACKEND, precision="fp16", accuracy_anchor=False)
    report = module.report.precision
    assert report is not None and report.search is not None
    assert sorted(i.op for i in report.islands if i.source == "search") == ["Add", "Sub"]
    assert report.share == 1.0  # pruning put the Linear layers back in float16
    assert report.search.error_before > 1.0 >= report.search.error_after
    assert_builds(module)  # the real TensorRT-RTX builder builds the final graph
    saved = report.save_keep_fp32(tmp_path / "islands.json")
    again = pipeline.convert(
        model,
        sample,
        backend=BACKEND,
        precision="fp16",
        keep_fp32=load_keep_fp32(saved),
        precision_search=False,
        accuracy_anchor=False,
    )
    assert again.report.precision is not None
    assert {i.node for i in again.report.precision.islands if i.source == "user"} == {
        i.node for i in report.islands if i.source == "search"
    }
    x = fresh(4, 16, seed=41)
    with torch.no_grad():
        assert_within(again(x), model(x), "float16")


# -- no silent degradation -------------------------------------------------------------------------------------------


def test_little_low_precision_compute_warns_and_strict_raises(caplog: pytest.LogCaptureFixture) -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3)).eval()
    sample = fresh(1, 3, 12, 12, seed=0)
    settings: dict[str, Any] = dict(backend=BACKEND, precision="bf16", opset=20, validate=False)
    with caplog.at_level(logging.WARNING):
        module = pipeline.convert(model, sample, **settings)
    report = module.report.precision
    assert report is not None and report.share == 0.0
    assert "only 0.0% of MatMul/Gemm/Conv FLOPs runs in bfloat16" in caplog.text
    assert "export with opset=22" in report.warnings[-1]
    with pytest.raises(ConversionError, match="opset=22"):
        pipeline.convert(model, sample, precision_strict=True, **settings)


def test_cli_takes_precision_and_keep_fp32() -> None:
    from pipeline.cli import build_parser

    args = build_parser().parse_args(["convert", "m.py:f", "-o", "out", "--precision", "bf16", "--keep-fp32", "head"])
    assert (args.precision, args.keep_fp32) == ("bf16", ["head"])


def test_precision_values_are_checked() -> None:
    with pytest.raises(pipeline.InputError, match="unknown precision"):
        pipeline.Settings(precision="int3")  # type: ignore[arg-type]
    assert pipeline.Settings(precision="fp16", keep_fp32="head").keep_fp32 == ("head",)  # one entry, not letters


def test_float32_outputs_are_validated_with_the_low_type_tolerance() -> None:
    from pipeline.precision.stage import validation_settings

    settings = pipeline.Settings(precision="fp16", tolerances={"float16": (5e-3, 5e-2), "logits": (1.0, 1.0)})
    judged = validation_settings(settings)
    assert judged.tolerance_for("y", "float32") == pipeline.Tolerance(5e-3, 5e-2)
    assert judged.tolerance_for("logits", "float32") == pipeline.Tolerance(1.0, 1.0)  # by name still wins
    bf16 = validation_settings(pipeline.Settings(precision="bf16"))
    assert bf16.tolerance_for("y", "float32") == pipeline.DEFAULT_TOLERANCES["bfloat16"]
    assert (
        validation_settings(pipeline.Settings()).tolerance_for("y", "float32") == pipeline.DEFAULT_TOLERANCES["float32"]
    )
