"""Shared CLI parsing: trtexec-style shapes become dynamic dims, tolerances and bad text give clear InputErrors."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from converters.errors import InputError
from pipeline.cli import build_parser
from pipeline.cli.common import (
    conversion_options,
    model_and_sample,
    read_tolerances,
    shapes_to_dynamic,
    staged_output,
)


def test_trtexec_shapes_make_the_differing_axes_dynamic_and_share_names_across_inputs() -> None:
    dims = shapes_to_dynamic(
        "input_ids:1x8,attention_mask:1x8", "input_ids:4x64,attention_mask:4x64", "input_ids:8x128,attention_mask:8x128"
    )
    assert dims == {
        "input_ids": {0: ("dim0_1_8", 1, 4, 8), 1: ("dim1_8_128", 8, 64, 128)},
        "attention_mask": {0: ("dim0_1_8", 1, 4, 8), 1: ("dim1_8_128", 8, 64, 128)},
    }
    assert shapes_to_dynamic("x:1x3x224x224", "x:8x3x224x224", "x:32x3x224x224") == {"x": {0: ("dim0_1_32", 1, 8, 32)}}
    assert shapes_to_dynamic(None, None, None) == {}


@pytest.mark.parametrize(
    ("shapes", "cause"),
    [
        (("x:1x3", None, "x:4x3"), "go together"),
        (("x:1x3", "y:2x3", "x:4x3"), "different inputs"),
        (("x:1x3", "x:2x3x1", "x:4x3"), "different ranks"),
        (("x:1xthree", "x:2x3", "x:4x3"), "cannot read --min-shapes"),
        (("1x3", "x:2x3", "x:4x3"), "cannot read --min-shapes"),
        (("x:0x3", "x:2x3", "x:4x3"), "size below 1"),
    ],
)
def test_bad_shape_flags_are_input_errors(shapes: tuple[str | None, ...], cause: str) -> None:
    with pytest.raises(InputError, match=cause):
        shapes_to_dynamic(*shapes)


def test_tolerances_and_conversion_options_from_the_command_line() -> None:
    assert read_tolerances(["float32:1e-4:1e-3", "logits:0.01:0.1"]) == {"float32": (1e-4, 1e-3), "logits": (0.01, 0.1)}
    with pytest.raises(InputError, match="cannot read --tolerance"):
        read_tolerances(["logits:a:b"])
    args = build_parser().parse_args(
        [
            "compare",
            "m.py:f",
            "-o",
            "out",
            "--precision",
            "fp16",
            "--tolerance",
            "out:1e-3:1e-2",
            "--min-shapes",
            "x:1x4",
            "--opt-shapes",
            "x:2x4",
            "--max-shapes",
            "x:8x4",
            "--keep-fp32",
            "op:Softmax",
        ]
    )
    options = conversion_options(args)
    assert options["precision"] == "fp16" and options["keep_fp32"] == ("op:Softmax",)
    assert options["tolerances"] == {"out": (1e-3, 1e-2)}
    assert options["dynamic"] == {"x": {0: ("dim0_1_8", 1, 2, 8)}}


def test_input_that_forward_does_not_take_is_named_with_the_real_arguments(tmp_path: Path) -> None:
    spec = tmp_path / "cnn.py"
    spec.write_text("import torch\ndef build():\n    return torch.nn.Linear(4, 3).eval(), torch.randn(2, 4)\n")
    with pytest.raises(InputError) as info:
        model_and_sample(f"{spec}:build", ["foo:2x4"], seed=0)
    text = str(info.value)
    assert "--input foo" in text and "forward() has no argument 'foo'" in text and "--input input:" in text, text


def test_a_fresh_output_directory_gets_the_umask_mode_not_the_staging_directory_0700(tmp_path: Path) -> None:
    out = tmp_path / "out" / "cnn"
    previous = os.umask(0o022)
    try:
        with staged_output(out, ["model.ptrt"]) as staging:
            (staging / "model.ptrt").write_bytes(b"x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755


def test_engine_options_from_the_command_line_with_polygraphy_and_trtexec_names() -> None:
    from pipeline.cli.engine_options import engine_options

    args = build_parser().parse_args(
        [
            "convert",
            "m.py:f",
            "-o",
            "out",
            "--strip-plan",
            "--refittable",
            "--weight-streaming-budget",
            "-1",
            "--sparse-weights",
            "--use-cuda-graph",
            "--no-runtime-cache",
        ]
    )
    assert engine_options(args) == {
        "strip_weights": True,
        "refittable": True,
        "weight_streaming_budget": -1,
        "sparse_weights": True,
        "cuda_graphs": True,
        "trt_runtime_cache": False,
    }
    defaults = engine_options(build_parser().parse_args(["convert", "m.py:f", "-o", "out"]))
    assert defaults == {
        "strip_weights": False,
        "refittable": False,
        "weight_streaming_budget": None,
        "sparse_weights": False,
        "cuda_graphs": False,
        "trt_runtime_cache": True,
    }


def test_main_run_twice_in_one_process_logs_through_one_handler(tmp_path: Path) -> None:
    """A second ``main`` (a notebook, a test) replaces the CLI's log handler: one line per message, and no handler
    left writing to a stream closed since."""
    import logging

    from pipeline.cli import main

    for _ in range(2):
        assert main(["inspect", str(tmp_path / "missing.ptrt")]) != 0
    for name in ("pipeline", "passes", "converters"):
        assert [h.get_name() for h in logging.getLogger(name).handlers].count("pipeline-cli") == 1
