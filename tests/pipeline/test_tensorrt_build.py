"""The TensorRT build stage, on the CPU: settings -> Polygraphy config, profiles, parser reports, engine portability.

The Polygraphy config is built in a subprocess with the real TensorRT 10.16 and 11.4 bindings (the shared trt-api
tool), so the enum members and the config Polygraphy would apply are the real ones; only building needs a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from test_backends import SETUP, VERSIONS, prepare_trt_api

from converters.errors import BuildError
from converters.settings import Settings
from pipeline.backends.tensorrt.build import ParseFailure, parse_error
from pipeline.runtime.io_spec import IOSpec, TensorSpec
from pipeline.runtime.tensorrt.identity import build_options, engine_mismatch
from pipeline.runtime.tensorrt.profiles import optimization_profiles, profile_shapes


def io_spec() -> IOSpec:
    return IOSpec(
        inputs=(TensorSpec("x", "float32", ("batch", 3, "side", "side")), TensorSpec("ids", "int64", (2, 5))),
        outputs=(TensorSpec("y", "float16", ("batch", 10)),),
        input_tree="",
        input_leaves=(),
        output_tree="",
        output_leaves=(),
        signature=(),
    )


DYNAMIC = {"x": {0: ("batch", 1, 4, 16), 2: ("side", 32, 64, 128), 3: ("side", 32, 64, 128)}}


def test_profile_from_declared_dynamic_dims_only() -> None:
    shapes = profile_shapes(io_spec(), Settings(dynamic=DYNAMIC))
    assert shapes == {"x": ((1, 3, 32, 32), (4, 3, 64, 64), (16, 3, 128, 128))}
    (profile,) = optimization_profiles(io_spec(), Settings(dynamic=DYNAMIC))
    assert (profile["x"].min, profile["x"].opt, profile["x"].max) == shapes["x"]
    assert list(profile.keys()) == ["x"]  # the static input keeps its own shape (Polygraphy fills it in)
    assert profile_shapes(io_spec(), Settings()) == {}


def test_build_options_hold_every_engine_setting_and_nothing_else() -> None:
    options = build_options(io_spec(), Settings(dynamic=DYNAMIC, trt_workspace_bytes=1 << 30, seed=3))
    assert options == {
        "profile": {"x": [[1, 3, 32, 32], [4, 3, 64, 64], [16, 3, 128, 128]]},
        "dynamic": [
            {"input": "x", "axis": axis, "name": name, "min": lo, "opt": opt, "max": hi, "multiple": 1}
            for axis, (name, lo, opt, hi) in DYNAMIC["x"].items()
        ],
        "trt_workspace_bytes": 1 << 30,
        "trt_tactic_shared_memory_bytes": None,
        "trt_builder_optimization_level": None,
        "trt_tf32": False,
        "trt_version_compatible": False,
        "trt_hardware_compatibility": "none",
        "trt_compute_capabilities": [],
        "generation": None,
        "profiles": [],
        "shape_tensor_values": [],
        "strip_weights": False,
        "refittable": False,
        "sparse_weights": False,
    }
    json.dumps(options)  # it goes into the cache key as JSON


def test_unknown_hardware_compatibility_is_an_input_error() -> None:
    import pipeline

    with pytest.raises(pipeline.InputError, match="unknown trt_hardware_compatibility 'ampere'"):
        Settings(trt_hardware_compatibility="ampere")  # type: ignore[arg-type]


def test_parser_failures_are_reported_per_node_with_the_static_check_reason() -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Unique", ["r"], ["u"], name="unique_1"),
            helper.make_node("ConvInteger", ["u", "w"], ["y"], name="conv_int"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph)
    asked: list[onnx.ModelProto] = []

    def static_check(m: onnx.ModelProto) -> dict[str, str]:
        asked.append(m)
        return {"unique_1": "Unique is not supported by TensorRT's ONNX parser (trt_onnx_ops.csv: N)"}

    failures = [
        ParseFailure("unique_1", "Unique", "No importer registered for op: Unique", "UNSUPPORTED_NODE"),
        ParseFailure("conv_int", "ConvInteger", "No importer registered for op: ConvInteger", "UNSUPPORTED_NODE"),
        ParseFailure("", "", "Failed to parse the model", "MODEL_DESERIALIZE_FAILED"),
    ]
    error = parse_error(failures, model, static_check)
    text = str(error)
    assert isinstance(error, BuildError) and error.node == "unique_1" and asked == [model]
    assert "node 'unique_1' (Unique): No importer registered for op: Unique [UNSUPPORTED_NODE]; static check: " in text
    assert "Unique is not supported" in text
    assert "node 'conv_int' (ConvInteger): No importer registered for op: ConvInteger [UNSUPPORTED_NODE]\n" in text
    assert "graph: Failed to parse the model [MODEL_DESERIALIZE_FAILED]" in text
    assert "fix:" in text and "backend='onnxruntime'" in text

    without = str(parse_error(failures[:1], model, None))
    assert "static check" not in without and "node 'unique_1' (Unique)" in without
    assert "failed without reporting an error" in str(parse_error([], model, None))


HERE = {"tensorrt": "10.16.1.11", "compute_capability": "8.9"}


@pytest.mark.parametrize(
    ("built_for", "settings", "why"),
    [
        (HERE, {}, None),
        ({**HERE, "tensorrt": "10.15.1.29"}, {}, "built with TensorRT 10.15.1.29; this machine has 10.16.1.11"),
        ({**HERE, "tensorrt": "10.15.1.29"}, {"trt_version_compatible": True}, None),
        ({**HERE, "tensorrt": "10.17.0.1"}, {"trt_version_compatible": True}, "built with TensorRT 10.17.0.1"),
        ({**HERE, "tensorrt": "11.4.0.106"}, {"trt_version_compatible": True}, "built with TensorRT 11.4.0.106"),
        ({**HERE, "compute_capability": "8.6"}, {}, "compute capability 8.6; this GPU has 8.9"),
        ({**HERE, "compute_capability": "8.6"}, {"trt_hardware_compatibility": "ampere_plus"}, None),
        ({**HERE, "compute_capability": "8.6"}, {"trt_hardware_compatibility": "same_compute_capability"}, "8.6"),
    ],
)
def test_which_saved_engines_can_run_here(
    built_for: dict[str, str], settings: dict[str, object], why: str | None
) -> None:
    reason = engine_mismatch(built_for, HERE, Settings(**settings))  # type: ignore[arg-type]
    assert reason is None if why is None else why in (reason or "")


CONFIG = """
import json, sys
from pathlib import Path
import torch
from converters.settings import Settings
from pipeline.backends.tensorrt.build import create_config
from pipeline.runtime.tensorrt.runner import torch_dtype, trt_dtype
from pipeline.runtime.io_spec import IOSpec, TensorSpec

io = IOSpec((TensorSpec("x", "float32", ("batch", 3, 8, 8)),), (TensorSpec("y", "float32", ("batch", 4)),),
            "", (), "", (), ())
timing = Path(sys.argv[1])
timing.write_bytes(b"an earlier timing cache")
settings = Settings(dynamic={"x": {0: ("batch", 1, 4, 16)}}, trt_workspace_bytes=1 << 30,
                    trt_tactic_shared_memory_bytes=48 << 10, trt_builder_optimization_level=5, trt_tf32=True,
                    trt_version_compatible=True, trt_hardware_compatibility="ampere_plus")
config = create_config(io, settings, timing)
default = create_config(io, Settings(), timing.with_suffix(".absent"))
profile = config.profiles[0]
dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.bool]
print(json.dumps({
    "tf32": [config.tf32, default.tf32],
    "pools": {str(k).split(".")[-1]: v for k, v in config.memory_pool_limits.items()},
    "default_pools": default.memory_pool_limits,
    "level": [config.builder_optimization_level, default.builder_optimization_level],
    "hardware": [str(config.hardware_compatibility_level), str(default.hardware_compatibility_level)],
    "version_compatible": [config.version_compatible, default.version_compatible],
    "timing": [config.timing_cache_path, default.timing_cache_path],
    "profile": [list(profile["x"].min), list(profile["x"].opt), list(profile["x"].max)],
    "precision": [c.fp16 or c.bf16 or c.int8 or c.fp8 or bool(c.precision_constraints) for c in (config, default)],
    "dtypes": [str(torch_dtype(trt_dtype(d))) == str(d) for d in dtypes],
}))
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_settings_become_the_polygraphy_config_with_real_tensorrt_enums(version: str, tmp_path: Path) -> None:
    prepare_trt_api(version)
    timing = tmp_path / "timing.cache"
    script = f'eval "$(bash {SETUP} --env {version})" && exec "$0" -c "$1" "$2"'
    done = subprocess.run(
        ["bash", "-c", script, sys.executable, CONFIG, str(timing)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["tf32"] == [True, False]  # off unless asked for: TF32 would break the fp32 tolerances
    assert got["pools"] == {"WORKSPACE": 1 << 30, "TACTIC_SHARED_MEMORY": 48 << 10}
    assert got["default_pools"] is None
    assert got["level"] == [5, None]
    assert [h.split(".")[-1] for h in got["hardware"]] == ["AMPERE_PLUS", "NONE"]
    assert got["version_compatible"] == [True, False]
    assert got["timing"] == [str(timing), None]  # a missing timing cache is not asked for: it is created
    assert got["profile"] == [[1, 3, 8, 8], [4, 3, 8, 8], [16, 3, 8, 8]]
    assert got["precision"] == [False, False]  # no precision flags, ever
    assert all(got["dtypes"])
