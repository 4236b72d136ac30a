"""The real parser as the judge (pipeline.compatibility.judge, pipeline.compatibility.real) and the static table
calibrated against it.

Every graph of the corpus (single-op graphs of tests/pipeline/parser_corpus.py, the final graphs of test models) is
judged by the static table and by TensorRT-RTX's real parser and builder; each disagreement must be recorded in
pipeline/compatibility/data/real_parser_calibration.csv with its reason, and each recorded one must still happen.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx_models import onnx_model
from parser_corpus import CASES, resize

import pipeline
from pipeline.compatibility.real import parse_with

trt = pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is in the dev extra: pip install tensorrt-rtx")
ROOT = Path(__file__).resolve().parents[2]
RTX = f"TensorRT-RTX {trt.__version__} ONNX parser"


def recorded() -> dict[str, dict[str, str]]:
    with resources.files("pipeline.compatibility.data").joinpath("real_parser_calibration.csv").open() as handle:
        return {row["case"]: row for row in csv.DictReader(handle)}


def verdicts(model: onnx.ModelProto) -> tuple[set[str], set[str]]:
    """(nodes the static table rejects, nodes the real parser and builder reject; "<build>" for a build failure)."""
    static = {p.node for p in pipeline.check(model, parser="static").problems}
    real = {p.node for p in pipeline.check(model, parser="tensorrt-rtx", build=True).problems}
    return static, real


def agree(static: set[str], real: set[str]) -> bool:
    """Both accept, or both reject with the parser's rejected nodes among the table's (the parser stops importing at
    the first node that fails, so it may name fewer) or the builder failing where the table names the node."""
    if not static or not real:
        return static == real
    return real <= static or real == {"<build>"}


def test_auto_judge_is_tensorrt_rtx_and_accepts_cubic_resize() -> None:
    report = pipeline.check(resize(mode="cubic"))
    assert report.parser == RTX and report.trt_version == trt.__version__
    assert report.ok and report.counts() == {"supported": 1}
    assert report.summary().startswith(f"{RTX} check: 1 nodes")


def test_rejected_node_carries_the_parsers_reason_and_a_fix() -> None:
    det = onnx_model(
        [helper.make_node("Det", ["x"], ["y"], name="det")],
        [("x", TensorProto.FLOAT, [3, 3])],
        [("y", TensorProto.FLOAT, None)],
    )
    (problem,) = pipeline.check(det).problems
    assert (problem.node, problem.op, problem.status) == ("det", "Det", "unsupported")
    assert "checkDet" in problem.reason and "UNSUPPORTED_NODE" in problem.reason
    assert problem.fix.startswith("register a converter for 'Det'")  # the static rule's fix for the same node
    assert pipeline.check(det, parser="static").parser == "static table (TensorRT 11.1 operator matrix)"


def test_parse_with_builds_through_the_backend_build_code() -> None:
    x = onnx_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [("x", TensorProto.FLOAT, ["b", 3])],
        [("y", TensorProto.FLOAT, None)],
    )
    verdict = parse_with(x, "tensorrt-rtx", build=True, settings=pipeline.Settings(dynamic={"x": {0: ("b", 1, 4, 8)}}))
    assert verdict.accepted and verdict.built and verdict.engine is not None and verdict.engine[:4] == b"vtrt"
    assert verdict.judge == f"{RTX} and builder" and verdict.build_seconds is not None
    report = pipeline.check(x, parser="tensorrt-rtx", build=True)  # undeclared dims are built as 1
    assert report.ok and report.parser == f"{RTX} and builder"


def test_build_failure_is_reported_as_a_problem() -> None:
    report = pipeline.check(CASES["TopK K=4000"](), parser="tensorrt-rtx", build=True)
    (problem,) = report.problems
    assert problem.node == "<build>" and problem.status == "build failed" and "TensorRT-RTX" in problem.reason


def test_parser_choice_errors() -> None:
    with pytest.raises(pipeline.InputError, match="unknown parser 'trt'"):
        pipeline.check(resize(mode="cubic"), parser="trt")
    with pytest.raises(pipeline.BuildError, match=r"(?s)`import tensorrt` fails.*fix: pip install 'tensorrt'"):
        pipeline.check(resize(mode="cubic"), parser="tensorrt")
    with pytest.raises(pipeline.InputError, match="build=True needs a real builder"):
        pipeline.check(resize(mode="cubic"), parser="static", build=True)
    # a TensorRT version other than the installed TensorRT's is the static table's question
    assert pipeline.check(resize(mode="cubic"), "10.16").parser.startswith("static table (TensorRT 10.16")


def test_cli_check_names_the_judge(tmp_path: Path) -> None:
    path = tmp_path / "cubic.onnx"
    onnx.save(resize(mode="cubic"), path)
    run = [sys.executable, "-m", "pipeline", "check", str(path)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{RTX} check: 1 nodes (1 supported)")
    static = subprocess.run([*run, "--parser", "static"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert static.returncode == 0 and static.stdout.startswith("static table")


@pytest.mark.parametrize("case", sorted(CASES))
def test_static_table_agrees_with_the_real_parser_or_says_why(case: str) -> None:
    static, real = verdicts(CASES[case]())
    note = recorded().get(case)
    if note is None or note["resolution"] == "fixed":
        assert agree(static, real), f"{case}: static rejects {static}, {RTX} rejects {real}: fix rules.py or record it"
    else:
        assert not agree(static, real), f"{case} is recorded as a disagreement but both now say the same: drop it"
        assert note["static_table"] == ("reject" if static else "accept")
        assert note["real_parser"] == ("reject" if real else "accept")
        assert note["scope"] in ("version", "rtx") and note["reason"]


def test_every_recorded_case_is_in_the_corpus() -> None:
    assert set(recorded()) <= set(CASES)


def cnn() -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, stride=2),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    )
    return model.eval(), torch.randn(2, 3, 16, 16)


def transformer(kind: str) -> tuple[torch.nn.Module, Any]:
    import transformers

    torch.manual_seed(0)
    small = {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 32, "intermediate_size": 64}
    if kind == "vit":
        config = transformers.ViTConfig(image_size=32, patch_size=8, **small)
        return transformers.ViTModel(config).eval(), torch.randn(1, 3, 32, 32)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=2, use_cache=False
        )
        return transformers.GPT2LMHeadModel(config).eval(), torch.randint(0, 300, (1, 12))
    config = transformers.BertConfig(vocab_size=300, **small)
    ids = torch.randint(0, 300, (2, 12))
    return transformers.BertModel(config).eval(), ((), {"input_ids": ids, "attention_mask": torch.ones_like(ids)})


@pytest.mark.parametrize("name", ["cnn", "bert", "gpt2", "vit"])
def test_test_models_final_graphs_agree(name: str) -> None:
    """The final graphs of the test models: the table and the real parser/builder both accept every node."""
    model, sample = cnn() if name == "cnn" else transformer(name)
    module = pipeline.convert(model, sample, backend="onnxruntime", validate=False, check_parser="static")
    static, real = verdicts(module.onnx)
    assert static == real == set(), f"{name}: static rejects {static}, {RTX} rejects {real}"
