"""backend="tensorrt-rtx" on this CPU-only machine: the real TensorRT-RTX parser and builder make the engine (ahead
of time), which is kept in the module, the artifact and the engine cache; the engine cannot run here (no CUDA), so the
same final graph runs on ONNX Runtime, as the warning, the report and the CLI say."""

from __future__ import annotations

import subprocess
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx_models import onnx_model

import pipeline
from converters.settings import Settings
from pipeline.backends.tensorrt.build import build_engine
from pipeline.runtime.executors import EngineNotRunnableWarning
from pipeline.runtime.io_spec import IOSpec, TensorSpec
from pipeline.runtime.tensorrt.identity import build_options, device_identity
from pipeline.runtime.tensorrt.library import TENSORRT_RTX, bind_polygraphy

trt = pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is in the dev extra: pip install tensorrt-rtx")
ROOT = Path(__file__).resolve().parents[2]
DYNAMIC = {name: {0: ("batch", 1, 2, 4), 1: ("seq", 4, 16, 32)} for name in ("input_ids", "attention_mask")}


def engine_is_tensorrt_rtx(plan: bytes) -> bool:
    """A TensorRT-RTX plan starts with its magic ``vtrt`` (TensorRT's are ``ftrt``); its runtime cannot say more
    without a GPU (``get_engine_validity`` fails with "CUDA driver version is insufficient")."""
    return plan[:4] == b"vtrt"


def tiny_bert() -> tuple[torch.nn.Module, Any]:
    import transformers

    config = transformers.BertConfig(
        vocab_size=500, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 500, (2, 16))
    return model, ((), {"input_ids": ids, "attention_mask": torch.ones_like(ids)})


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, pipeline.ConvertedModule, list[str]]:
    model, sample = tiny_bert()
    cache = tmp_path_factory.mktemp("cache")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = pipeline.convert(model, sample, backend="tensorrt-rtx", dynamic=DYNAMIC, cache_dir=str(cache))
    return model, module, [str(w.message) for w in caught if issubclass(w.category, EngineNotRunnableWarning)]


def test_bert_builds_a_tensorrt_rtx_engine_and_says_where_it_runs(bert: Any, tmp_path: Path) -> None:
    model, module, warned = bert
    assert module.backend == "tensorrt-rtx"
    assert module.engine_bytes is not None and len(module.engine_bytes) > 100_000
    reason = module.report.backend_reason
    assert "engine built for compute capabilities 8.0, 8.6, 8.9, 12.0" in reason
    assert "not runnable here: no CUDA device" in reason and "running the same graph on ONNX Runtime" in reason
    assert warned and "not runnable here" in warned[0]
    assert module.report.compatibility is not None
    assert module.report.compatibility["parser"] == f"TensorRT-RTX {trt.__version__} ONNX parser"
    assert module.report.accuracy is not None and module.report.accuracy.passed
    # the artifact holds the same engine, and records the library and its targets
    path = module.save(tmp_path / "bert.ptrt")
    with zipfile.ZipFile(path) as archive:
        assert archive.read("engine.plan") == module.engine_bytes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = pipeline.load(path)
    assert any(issubclass(w.category, EngineNotRunnableWarning) for w in caught)
    assert loaded.backend == "tensorrt-rtx" and loaded.engine_bytes == module.engine_bytes
    assert "not runnable here: no CUDA device" in loaded.report.backend_reason
    ids = torch.randint(0, 500, (3, 24))  # another batch and sequence length inside the profile
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        got = loaded(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_engine_has_the_declared_profile(bert: Any) -> None:
    """The engine is real: TensorRT-RTX's builder took the profile from the declared dynamic dimensions."""
    _, module, _ = bert
    options = build_options(module.io, module.settings)
    assert options["profile"]["input_ids"] == [[1, 4], [2, 16], [4, 32]]
    assert module.engine_bytes is not None and engine_is_tensorrt_rtx(module.engine_bytes)


def small_graph() -> tuple[onnx.ModelProto, IOSpec]:
    model = onnx_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [("x", TensorProto.FLOAT, [2, 3])],
        [("y", TensorProto.FLOAT, None)],
    )
    io = IOSpec((TensorSpec("x", "float32", (2, 3)),), (TensorSpec("y", "float32", (2, 3)),), "", (), "", (), ())
    return model, io


def test_engine_cache_is_keyed_on_library_version_and_targets(tmp_path: Path) -> None:
    from pipeline.backends.tensorrt.build import cached_engine

    model, io = small_graph()
    default = Settings(backend="tensorrt-rtx", cache_dir=str(tmp_path))
    ada = Settings(backend="tensorrt-rtx", cache_dir=str(tmp_path), trt_compute_capabilities=("8.9",))
    assert cached_engine(model, io, default, library=TENSORRT_RTX)[1] == "built"
    assert cached_engine(model, io, default, library=TENSORRT_RTX)[1] == "hit"
    engine, status = cached_engine(model, io, ada, library=TENSORRT_RTX)
    assert status == "built"  # another target: another entry
    assert device_identity(TENSORRT_RTX, ada) == {"tensorrt_rtx": trt.__version__, "compute_capability": "8.9"}
    assert device_identity(TENSORRT_RTX, default)["compute_capability"] == "8.0,8.6,8.9,12.0"
    assert len(list(tmp_path.glob("*.plan"))) == 2


def test_the_engine_cache_size_setting_bounds_the_cache_a_real_build_stores_into(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from pipeline.backends.tensorrt.build import cached_engine
    from pipeline.backends.tensorrt.engine_cache import EngineCache

    model, io = small_graph()
    stale = EngineCache(tmp_path).get_or_build("stale", lambda: b"an engine no one used for a while" * 100).path
    bounded = Settings(backend="tensorrt-rtx", cache_dir=str(tmp_path), trt_engine_cache_size=1000)
    with caplog.at_level(logging.INFO, logger="pipeline.backends.tensorrt.engine_cache"):
        engine, status = cached_engine(model, io, bounded, library=TENSORRT_RTX)
    assert status == "built" and not stale.exists()  # the setting reached the cache: the older entry went
    assert [p.read_bytes() for p in tmp_path.glob("*.plan")] == [engine]  # the new engine is kept, alone over 1000
    assert any("evicted 1 least recently used" in r.getMessage() for r in caplog.records)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("Set trt_engine_cache_size to at least" in message for message in warned), warned
    assert cached_engine(model, io, bounded, library=TENSORRT_RTX)[1] == "hit"


def test_unknown_target_is_an_input_error() -> None:
    model, io = small_graph()
    with pytest.raises(pipeline.InputError, match=r"(?s)trt_compute_capabilities \['9.0'\].*fix: use some of"):
        build_engine(model, io, Settings(trt_compute_capabilities=("9.0",)), None, library=TENSORRT_RTX)


def test_require_engine_runtime_makes_it_an_error() -> None:
    with pytest.raises(pipeline.BuildError, match="require_engine_runtime=True, but the engine cannot run here"):
        pipeline.convert(torch.nn.ReLU(), torch.randn(2, 3), backend="tensorrt-rtx", require_engine_runtime=True)


def test_plugin_nodes_are_a_build_error_naming_the_limitation() -> None:
    node = helper.make_node("MyOp", ["x"], ["y"], name="plugin", domain="mine", plugin_namespace="mine")
    model = onnx_model([node], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, None)])
    _, io = small_graph()
    with pytest.raises(
        pipeline.BuildError, match=r"plugin node\(s\) \['plugin'\], which TensorRT-RTX cannot build"
    ) as e:
        build_engine(model, io, Settings(), None, library=TENSORRT_RTX)
    assert "tensorrt_rtx_bindings.plugin" in str(e.value) and "fix:" in str(e.value)


def test_polygraphy_serves_one_library_per_process() -> None:
    """This process built with TensorRT-RTX: Polygraphy's loaders are bound to it; TensorRT is refused clearly."""
    bind_polygraphy(TENSORRT_RTX)
    from polygraphy.backend.trt import loader

    assert loader.trt.__name__ == "tensorrt_rtx"


def test_cli_convert_tensorrt_rtx(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "convert",
            "examples/cnn.py:build",
            "--backend",
            "tensorrt-rtx",
            "-o",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "backend   tensorrt-rtx" in done.stdout
    assert (
        "not runnable here: no CUDA device" in done.stdout and "running the same graph on ONNX Runtime" in done.stdout
    )
    assert "MB tensorrt-rtx engine in the artifact" in done.stdout
    with zipfile.ZipFile(tmp_path / "model.ptrt") as archive:
        assert engine_is_tensorrt_rtx(archive.read("engine.plan"))


BLOCKED = """
import sys
sys.modules["tensorrt_rtx"] = None  # as on a machine without TensorRT-RTX (and without TensorRT)
sys.modules["tensorrt"] = None
import onnx, torch, pipeline
from onnx import TensorProto, helper
x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "xy")
g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
print(pipeline.check(helper.make_model(g)).parser)
try:
    pipeline.convert(torch.nn.ReLU(), torch.randn(2), backend="tensorrt-rtx")
except pipeline.BuildError as exc:
    print(str(exc).replace(chr(10), " "))
"""


def test_without_the_library_check_uses_the_table_and_the_backend_says_how_to_install() -> None:
    done = subprocess.run([sys.executable, "-c", BLOCKED], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    parser, error = done.stdout.splitlines()[-2:]
    assert parser == "static table (TensorRT 11.1 operator matrix)"
    assert "TensorRT-RTX is needed here but `import tensorrt_rtx` fails" in error
    assert "fix: pip install 'tensorrt-rtx'" in error


@pytest.mark.parametrize(("tf32", "targets"), [(False, ()), (True, ("8.9",)), (False, ("8.6", "12.0"))])
def test_settings_become_the_real_tensorrt_rtx_builder_config(tf32: bool, targets: tuple[str, ...]) -> None:
    from pipeline.backends.tensorrt.build import create_config, parse_onnx

    model, io = small_graph()
    (builder, network, _), failures = parse_onnx(model, library=TENSORRT_RTX)
    assert failures == []
    settings = Settings(trt_tf32=tf32, trt_compute_capabilities=targets, trt_workspace_bytes=1 << 28)
    config = create_config(io, settings, None, TENSORRT_RTX)(builder, network)
    assert config.get_flag(trt.BuilderFlag.TF32) is tf32  # on by default in TensorRT-RTX: cleared unless asked for
    assert config.get_memory_pool_limit(trt.MemoryPoolType.WORKSPACE) == 1 << 28
    assert config.num_compute_capabilities == len(targets)
    chosen = [config.get_compute_capability(i) for i in range(len(targets))]
    assert chosen == [getattr(trt.ComputeCapability, "SM" + cc.replace(".", "")) for cc in targets]


def test_auto_says_tensorrt_rtx_can_build_an_engine_here() -> None:
    from pipeline.runtime.executors import select_backend

    choice = select_backend("auto")
    if choice.name != "onnxruntime":
        pytest.skip("TensorRT runs here: auto picks it")
    assert "TensorRT not usable" in choice.reason
    assert f"TensorRT-RTX {TENSORRT_RTX.version()} can build" in choice.reason
    assert "backend='tensorrt-rtx'" in choice.reason


def test_compare_and_bench_offer_tensorrt_rtx_and_say_what_ran(bert: Any) -> None:
    from pipeline.cli import build_parser
    from pipeline.cli.bench import backend_label

    model, module, _ = bert
    sample = tiny_bert()[1]
    report = pipeline.compare(model, sample, random_inputs=0, module=module)
    rtx = next(r for r in report.runners if r.name == "tensorrt-rtx")
    assert rtx.skipped is not None and "can build the engine here but not run it: no CUDA device" in rtx.skipped
    assert "skipped     tensorrt-rtx: TensorRT-RTX" in report.table()
    with pytest.raises(pipeline.BuildError, match="cannot compare tensorrt-rtx: TensorRT-RTX .* not run it"):
        pipeline.compare(model, sample, backends=["tensorrt-rtx"], random_inputs=0, module=module)
    for command in (["compare", "m.py:build", "-o", "out"], ["bench", "m.py:build"]):
        chosen = build_parser().parse_args([*command, "--backend", "tensorrt-rtx"]).backend
        assert chosen in ("tensorrt-rtx", ["tensorrt-rtx"])
    assert module.runs_on == "onnxruntime"
    label = backend_label({"backend": module.backend, "runs_on": module.runs_on})
    assert label == "converted (tensorrt-rtx engine not run: onnxruntime timed)"


def test_weights_handed_to_the_parser_in_place_give_the_network_a_plain_parse_gives() -> None:
    """parse_onnx gives TensorRT-RTX's parser a light graph and each large weight by address (no 2nd copy of the
    weights serialised): the network's layers and constant weights are those of the whole model parsed."""
    import numpy as np
    from onnx import numpy_helper

    from pipeline.backends.tensorrt.build import library_logger, parse_onnx

    weight = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)  # 12 KB: handed over apart
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 48])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (_, network, parser), failures = parse_onnx(model, library=TENSORRT_RTX)
    assert failures == [] and list(parser.weights) == ["w"]

    logger = library_logger(TENSORRT_RTX)
    builder = trt.Builder(logger)
    plain = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    plain_parser = trt.OnnxParser(plain, logger)
    assert plain_parser.parse(model.SerializeToString())

    def constants(net: Any) -> list[np.ndarray]:
        found = []
        for layer in (net.get_layer(i) for i in range(net.num_layers)):
            if layer.type == trt.LayerType.CONSTANT:
                layer.__class__ = trt.IConstantLayer  # the binding hands out the base class (as Polygraphy casts it)
                found.append(np.array(layer.weights))
        return found

    assert network.num_layers == plain.num_layers
    got, want = constants(network), constants(plain)
    assert len(got) == 1 and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert np.array_equal(got[0].reshape(weight.shape), weight)
