"""The comparison's report files, its Polygraphy command (run with the ONNX Runtime backend), and the CLI on a
tiny BERT with a planted error."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
import torch
from test_compare_plots import count_color, decode_png
from torch import nn

import pipeline
from converters.context import ConverterContext
from converters.registry import ConverterRegistry
from pipeline.comparison import plots

ROOT = Path(__file__).resolve().parents[2]
POLYGRAPHY = Path(sys.executable).parent / "polygraphy"


@torch.library.custom_op("comparereport::scale", mutates_args=())
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@scale.register_fake
def _(x: torch.Tensor, factor: float) -> torch.Tensor:
    return torch.empty_like(x)


def scale_registry(error: float) -> ConverterRegistry:
    registry = ConverterRegistry()

    @registry.register("comparereport::scale")
    def convert(ctx: ConverterContext) -> gs.Tensor:
        return ctx.op.Mul(ctx.input("x"), np.float32(ctx.attrs["factor"] * (1 + error)))

    return registry


class Block(nn.Module):
    def __init__(self, custom: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.custom = custom

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.lin(x))
        return x + (torch.ops.comparereport.scale(h, 0.5) if self.custom else h)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block(i == 2) for i in range(4)])
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.blocks(x)
        return self.head(features), features.sum(dim=-1)


def run_report(error: float, directory: Path, **options: object) -> pipeline.ComparisonReport:
    torch.manual_seed(0)
    return pipeline.compare(
        Net().eval(),
        torch.randn(4, 8),
        converters=scale_registry(error),
        per_layer=True,
        random_inputs=2,
        output_dir=directory,
        **options,
    )


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[pipeline.ComparisonReport, Path]:
    directory = tmp_path_factory.mktemp("planted")
    return run_report(0.01, directory), directory


@pytest.fixture(scope="module")
def exact(tmp_path_factory: pytest.TempPathFactory) -> tuple[pipeline.ComparisonReport, Path]:
    directory = tmp_path_factory.mktemp("exact")
    return run_report(0.0, directory, dynamic={"x": {0: ("batch", 1, 4, 8)}}), directory


def test_report_files_open(planted: tuple[pipeline.ComparisonReport, Path]) -> None:
    report, directory = planted
    names = sorted(p.name for p in directory.iterdir())
    assert names == sorted(
        [
            "final.onnx",
            "inputs.json",
            "reference_outputs.json",
            "report.json",
            "report.md",
            "layers.png",
            "histogram_out_0.png",
            "histogram_out_1.png",
        ]
    )
    data = json.loads((directory / "report.json").read_text())
    assert data["passed"] is False and data["rule"] == report.rule
    assert data["per_layer"]["first_divergence"]["module"] == "blocks.2"
    assert any("scale" in n["name"] for n in data["per_layer"]["first_divergence"]["suspect_nodes"])
    assert {o["output"] for o in data["outputs"]} == {"out_0", "out_1"}
    assert all({"max_abs", "p99_rel", "cosine", "outside", "atol", "rtol"} <= set(o) for o in data["outputs"])
    assert data["polygraphy_command"].startswith("polygraphy run ") and data["files"]["graph"].endswith("final.onnx")
    markdown = (directory / "report.md").read_text()
    assert "**First divergence: `blocks.2`**" in markdown and "rtol * |ref|" in markdown
    assert "![max absolute error along depth](layers.png)" in markdown and "```bash\npolygraphy run" in markdown
    onnx.checker.check_model(onnx.load(str(directory / "final.onnx")))
    table = report.table(directory)
    assert "first divergence  blocks.2 (Block)" in table and "FAIL" in table.splitlines()[0]


def test_the_table_states_the_rule_in_one_short_line_and_points_at_the_full_one(
    planted: tuple[pipeline.ComparisonReport, Path],
) -> None:
    report, directory = planted
    rule_lines = [line for line in report.table(directory).splitlines() if line.startswith("rule")]
    assert len(rule_lines) == 1 and len(rule_lines[0]) <= 120, rule_lines
    assert "report.md" in rule_lines[0] and len(report.rule) > 300  # the full rule is in the report files
    assert report.rule in (directory / "report.md").read_text()


def test_plots_exist_and_show_data(planted: tuple[pipeline.ComparisonReport, Path]) -> None:
    _, directory = planted
    for name in ("histogram_out_0.png", "histogram_out_1.png"):
        pixels = decode_png((directory / name).read_bytes())
        assert pixels.shape == (420, 720, 3) and count_color(pixels, plots.SERIES[0]) > 200
    depth = decode_png((directory / "layers.png").read_bytes())
    assert count_color(depth, plots.FAIL_COLOR) > 50 and count_color(depth, plots.PASS_COLOR) > 50


def polygraphy(report: pipeline.ComparisonReport, directory: Path) -> subprocess.CompletedProcess[str]:
    command = report.polygraphy_command(directory, tensorrt=False)
    assert command[:2] == ["polygraphy", "run"]
    return subprocess.run([str(POLYGRAPHY), *command[1:]], capture_output=True, text=True, timeout=300)


def test_polygraphy_command_runs_with_onnxruntime(exact: tuple[pipeline.ComparisonReport, Path]) -> None:
    report, directory = exact
    assert report.passed and report.inputs == 5  # sample, 2 random, and the dynamic batch's min and max
    done = polygraphy(report, directory)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "PASSED" in done.stdout + done.stderr
    with_trt = report.polygraphy_command(directory)
    assert with_trt[3:5] == ["--trt", "--strongly-typed"]
    assert with_trt[5:11] == [
        "--trt-min-shapes",
        "x:[1,8]",
        "--trt-opt-shapes",
        "x:[4,8]",
        "--trt-max-shapes",
        "x:[8,8]",
    ]
    assert [a for a in with_trt if a not in with_trt[3:11]] == report.polygraphy_command(directory, tensorrt=False)


def test_polygraphy_command_fails_where_the_comparison_fails(planted: tuple[pipeline.ComparisonReport, Path]) -> None:
    report, directory = planted
    done = polygraphy(report, directory)
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr


BERT_FILE = """
    import sys

    sys.path.insert(0, TESTS_DIR)
    import tests_environment  # torchvision's operator schemas: transformers' BertModel imports torchvision

    import numpy as np
    import torch
    import transformers

    import converters


    @torch.library.custom_op("plantedbert::gelu", mutates_args=())
    def planted_gelu(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x)


    @planted_gelu.register_fake
    def _(x):
        return torch.empty_like(x)


    class PlantedGelu(torch.nn.Module):
        def forward(self, x):
            return torch.ops.plantedbert.gelu(x)


    def build():
        config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=64, type_vocab_size=2)
        torch.manual_seed(0)
        model = transformers.BertModel(config).eval()
        model.encoder.layer[1].intermediate.intermediate_act_fn = PlantedGelu()
        return model


    def registry():
        reg = converters.default_registry()

        @reg.register("plantedbert::gelu")
        def one_percent_off(ctx):
            x = ctx.input("x")
            erf = ctx.op.Erf(ctx.op.Mul(x, np.float32(2 ** -0.5)))
            return ctx.op.Mul(ctx.op.Mul(x, np.float32(0.505)), ctx.op.Add(erf, np.float32(1.0)))

        return reg
"""


def test_cli_compare_names_the_planted_bert_layer(tmp_path: Path) -> None:
    source = tmp_path / "planted_bert.py"
    source.write_text(textwrap.dedent(BERT_FILE).replace("TESTS_DIR", repr(str(ROOT / "tests"))))
    out = tmp_path / "report"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "compare",
            f"{source}:build",
            "--converters",
            f"{source}:registry",
            "--input",
            "input_ids:2x8:int64",
            "--per-layer",
            "--random-inputs",
            "1",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr  # ran, and an output is outside tolerance
    assert "first divergence  encoder.layer.1.intermediate.intermediate_act_fn (PlantedGelu)" in done.stdout
    assert done.stdout.startswith("comparison  FAIL  BertModel against torch")
    data = json.loads((out / "report.json").read_text())
    assert data["per_layer"]["first_divergence"]["module"] == "encoder.layer.1.intermediate.intermediate_act_fn"
    layers = [layer["module"] for layer in data["per_layer"]["layers"]]
    first = layers.index("encoder.layer.1.intermediate.intermediate_act_fn")
    assert "encoder.layer.0" in layers[:first] and "encoder.layer.1.intermediate.dense" in layers[:first]
    assert all(layer["passed"] for layer in data["per_layer"]["layers"][:first])
    assert (out / "layers.png").stat().st_size > 1000 and (out / "report.md").is_file()
