"""The model-level suite (``tests/model_suite.py``) in CI: a stratified sample of whole models converted with
TensorRT-RTX (export, passes, the real build, validation against PyTorch on ONNX Runtime) in fp32 and fp16, and the
model lists held to what they promise (every timm module, torchvision's four groups, 60+ transformers architectures
of every kind, diffusers' UNets, DiT/SD3/Flux and VAEs). The full run is ``benchmarks/model_coverage.py``.

``MODEL_SUITE=<regex>`` runs the models whose ids match instead of the sample (marked slow).
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

import model_suite
import pytest
from model_sources import ModelCase
from rtx_build import SKIP_REASON

from pipeline.precision.buildable import rtx_available

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "model_coverage.csv"
CASE_TIMEOUT = 240.0
# One small model per source and kind that has converted, matched and built in both precisions (diffusers: its
# output containers are issue 25's; timm: when its table rows land).
SAMPLE = ("torchvision/deeplabv3_mobilenet_v3_large", "transformers/bert", "transformers/gpt2")

needs_rtx = pytest.mark.skipif(not rtx_available(), reason=SKIP_REASON)


def _selection() -> tuple[list[str], bool]:
    pattern = os.environ.get("MODEL_SUITE", "")
    if not pattern:
        return list(SAMPLE), False
    return [i for i in model_suite.all_cases() if re.search(pattern, i)], True


SELECTED, SLOW = _selection()


def _params() -> list[object]:
    marks = [pytest.mark.slow] if SLOW else []
    return [pytest.param(i, p, id=f"{i}-{p}", marks=marks) for i in SELECTED for p in model_suite.PRECISIONS]


def _case(case_id: str) -> ModelCase:
    return model_suite.all_cases((case_id.split("/", 1)[0],))[case_id]


@needs_rtx
@pytest.mark.parametrize(("case_id", "precision"), _params())
def test_model_converts_matches_and_builds(case_id: str, precision: str) -> None:
    """The sample converts with TensorRT-RTX, matches PyTorch and builds; any model ends in ok or OUR error."""
    outcome = model_suite.run_ours(_case(case_id), precision, CASE_TIMEOUT)
    if SLOW:
        assert outcome.status not in ("crash", "timeout"), f"{case_id} ({precision}): {outcome.reason}"
    else:
        assert outcome.ok, f"{case_id} ({precision}): {outcome.status}: {outcome.reason}"


def test_lists_cover_what_the_suite_promises() -> None:
    """Every timm module has its model, torchvision's four groups are complete, 60+ transformers architectures
    span every kind, diffusers has UNets, DiT/SD3/Flux transformers and VAEs."""
    import json

    import timm
    import torchvision

    cases = model_suite.all_cases()
    by_source: dict[str, list[ModelCase]] = {}
    for case in cases.values():
        by_source.setdefault(case.source, []).append(case)
    modules = json.loads((ROOT / "tests" / "model_sources" / "timm_smallest.json").read_text())
    assert set(modules) >= set(timm.list_modules()) - {"_builder"}, "regenerate timm_smallest.json"
    assert {c.family for c in by_source["timm"]} == set(modules)
    models = torchvision.models
    for group in (models, models.segmentation, models.video, models.optical_flow):
        assert set(models.list_models(module=group)) <= {c.name for c in by_source["torchvision"]}
    kinds = {c.family for c in by_source["transformers"]}
    assert len(by_source["transformers"]) >= 60
    assert kinds >= {"encoder", "decoder", "encoder-decoder", "vision", "audio", "multimodal", "moe", "state-space"}
    assert {c.family for c in by_source["diffusers"]} == {"unet", "transformer", "vae"}


def test_table_rows_are_suite_models() -> None:
    """The committed table (``benchmarks/model_coverage.py``) holds suite models in known classes only."""
    if not TABLE.exists():
        pytest.skip(f"{TABLE} is not written yet")
    with TABLE.open(newline="") as f:
        rows = list(csv.DictReader(f))
    ids = set(model_suite.all_cases())
    assert rows and all(f"{r['source']}/{r['model']}" in ids for r in rows)
    for side in ("fp32", "fp16", "plain"):
        assert {r[side] for r in rows} <= set(model_suite.STATUSES), side


def test_a_model_pytorch_cannot_run_is_not_counted() -> None:
    """A model whose own forward fails on its sample is class ``pytorch`` (nothing to convert), not a failure."""
    import torch

    def build() -> tuple[torch.nn.Module, torch.Tensor]:
        return torch.nn.Linear(3, 2), torch.randn(1, 4)  # the wrong width: PyTorch itself raises

    outcome = model_suite.run_ours(ModelCase("test", "wrong-width", "none", build))
    assert outcome.status == "pytorch" and "mat1 and mat2" in outcome.reason


@needs_rtx
def test_ok_through_the_fallback_says_so_in_its_reason() -> None:
    """A model TensorRT-RTX takes only in part converts (ONNX Runtime runs the rest) and its row says so: the
    table counts those apart from models TensorRT takes whole."""
    import torch

    class DistinctLevels(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            levels = torch.unique(torch.round(torch.sigmoid(self.scale(x)) * 4))  # Unique: not in TensorRT-RTX
            return self.scale(x) * levels.sum()

    def build() -> tuple[torch.nn.Module, torch.Tensor]:
        torch.manual_seed(0)
        return DistinctLevels().eval(), torch.randn(2, 8)

    outcome = model_suite.run_ours(ModelCase("test", "distinct-levels", "none", build))
    assert outcome.ok and outcome.reason.startswith("segments: "), outcome
    assert "Unique" in outcome.reason and "run on ONNX Runtime" in outcome.reason
    linear = ModelCase("test", "linear", "none", lambda: (torch.nn.Linear(8, 4), torch.randn(2, 8)))
    whole = model_suite.run_ours(linear)
    assert whole.ok and whole.reason == "", whole


def _coverage_script():  # type: ignore[no-untyped-def]
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("model_coverage", ROOT / "benchmarks" / "model_coverage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("model_coverage", module)
    spec.loader.exec_module(module)
    return module


def test_time_ratios_count_only_rows_timed_warm() -> None:
    """A row timed without the warm-up (its first side paid the process's first-use costs) stays out of the table's
    time ratios; the page says how many were left out."""
    script = _coverage_script()

    def row(name: str, fp32: float, plain: float, timing: str) -> dict[str, str]:
        return {
            "model": name,
            "source": "timm",
            "family": name,
            "owner": "",
            "fp32": "ok",
            "fp32_reason": "",
            "fp32_seconds": str(fp32),
            "fp16": "ok",
            "fp16_reason": "",
            "fp16_seconds": str(fp32),
            "plain": "ok",
            "plain_reason": "",
            "plain_seconds": str(plain),
            "timing": timing,
        }

    rows = [row("a", 14.4, 5.2, ""), row("b", 4.0, 5.0, "warm"), row("c", 6.0, 5.0, "warm"), row("d", 5.0, 5.0, "warm")]
    assert script._time_ratio(rows, "fp32") == "1.00x"  # 0.8, 1.0, 1.2; the cold 2.77 left out
    assert script._time_ratio(rows[:1], "fp32") == "-"
    assert "1 rows timed without that warm-up" in script.markdown(rows, "python benchmarks/model_coverage.py")
    assert "without that warm-up" not in script.markdown(rows[1:], "python benchmarks/model_coverage.py")
