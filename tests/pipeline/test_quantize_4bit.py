"""``precision="int4"`` and ``"nvfp4"`` on a small transformer language model (random weights): every MatMul
weight but the kept head in 4 bits, validated on ONNX Runtime, built by the real TensorRT-RTX builder for the
targets the format needs (chosen from the precision), the artifact a fraction of the fp32 one, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from charlm_support import CharLM
from rtx_build import rtx_build_error

import pipeline
from converters.errors import InputError
from converters.settings import Settings
from pipeline.cli import main

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(0))


def tiny_lm() -> torch.nn.Module:
    torch.manual_seed(0)
    return CharLM(40, width=128, layers=1).eval()


def four_bit_weights(model: onnx.ModelProto) -> dict[str, int]:
    """MatMul node -> the ONNX type of the initializer behind its weight's DequantizeLinear chain."""
    producers = {o: n for n in model.graph.node for o in n.output}
    types = {t.name: t.data_type for t in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type != "MatMul":
            continue
        tensor = node.input[1]
        while tensor in producers and producers[tensor].op_type in ("Cast", "Transpose", "DequantizeLinear"):
            producer = producers[tensor]
            if producer.op_type == "DequantizeLinear" and producer.input[0] in types:
                found[node.name] = types[producer.input[0]]
                break
            tensor = producer.input[0]
    return found


def test_int4_puts_every_matmul_weight_but_the_head_in_4_bits_and_builds(tmp_path: Path) -> None:
    model = tiny_lm()
    module = pipeline.convert(model, SAMPLE, precision="int4", block_size=64)
    report = module.report.quantization
    assert report is not None and module.report.accuracy is not None and module.report.accuracy.passed
    assert report.precision == "int4" and report.method == "max" and len(report.quantized) == 4  # qkv, proj, fc1, fc2
    reasons = {s.reason.split(":")[0] for s in report.skipped}
    assert reasons == {"both inputs are activations (no constant weight)", "keep_head"}
    assert set(four_bit_weights(module.onnx).values()) == {onnx.TensorProto.INT4}
    assert report.relative_error < 0.05
    assert "MatMulNBits at accuracy level 1" in module.report.summary()
    assert rtx_build_error(module.onnx) is None  # TensorRT-RTX's default targets: 8.0 and later
    fp32_bytes = 4 * sum(p.numel() for p in model.parameters())
    assert module.save(tmp_path / "int4.ptrt").stat().st_size < 0.45 * fp32_bytes  # embeddings and head: fp16
    loaded = pipeline.load(tmp_path / "int4.ptrt")
    assert loaded.report.quantization is not None and loaded.report.quantization.precision == "int4"
    with torch.no_grad():
        np.testing.assert_array_equal(loaded(SAMPLE).numpy(), module(SAMPLE).numpy())


def test_nvfp4_targets_compute_capability_12_and_builds_there() -> None:
    pytest.importorskip("tensorrt_rtx")
    module = pipeline.convert(tiny_lm(), SAMPLE, precision="nvfp4", backend="tensorrt-rtx", keep_head=False)
    assert module.settings.trt_compute_capabilities == ("12.0",)  # chosen from the precision
    assert module.engine_bytes is not None and len(module.engine_bytes) > 0
    report = module.report.quantization
    assert report is not None and report.dtype == "float4e2m1" and report.weight_share == 1.0
    assert len(report.quantized) == 5  # the head too: keep_head=False
    assert set(four_bit_weights(module.onnx).values()) == {onnx.TensorProto.FLOAT4E2M1}
    assert not any(n.domain == "trt" for n in module.onnx.graph.node)  # weight-only unless nvfp4_activations
    assert any("exact emulation" in note for note in report.notes)
    assert module.report.accuracy is not None and module.report.accuracy.passed


@pytest.mark.parametrize(("precision", "targets"), [("nvfp4", ("8.9",)), ("int4", ("7.5", "8.6"))])
def test_targets_that_cannot_take_the_type_are_an_error(precision: str, targets: tuple[str, ...]) -> None:
    with pytest.raises(InputError, match=f"precision={precision!r} cannot run on compute capability {targets[0]}"):
        pipeline.convert(tiny_lm(), SAMPLE, precision=precision, trt_compute_capabilities=targets)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"precision": "int8", "calibration_method": "awq"}, "chooses 4-bit weight scales"),
        ({"precision": "int4", "calibration_method": "entropy"}, "quantizes weights only"),
        ({"precision": "int4", "block_size": 100}, "power of two"),
    ],
)
def test_bad_4bit_settings_are_clear_errors(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        Settings(**settings)


def test_cli_converts_int4_with_a_block_size(tmp_path: Path) -> None:
    spec = tmp_path / "lm.py"
    spec.write_text(
        "import sys, torch\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "from charlm_support import CharLM\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return CharLM(40, width=64, layers=1).eval(), torch.randint(0, 40, (1, 8))\n"
    )
    out = tmp_path / "out"
    code = main(
        [
            "convert",
            f"{spec}:build",
            "-o",
            str(out),
            "--precision",
            "int4",
            "--block-size",
            "32",
            "--quantize-fallback",
            "fp32",
            "--no-validate",
        ]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())["quantization"]
    assert report["precision"] == "int4" and len(report["quantized"]) == 4
    assert any("one scale per 32 input channels" in note for note in report["notes"])
