"""The engine options (README "Engine options"): the settings, the builder flags they become in the real TensorRT-RTX
builder config, what its CPU-only builder builds and refuses here, the engine cache key and the artifact's record,
and ``module.refit`` on ONNX Runtime (matches the new PyTorch model, precision included) and up to the refusal of an
engine that was not built refittable."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import pipeline
from converters.errors import BuildError, ConversionError, InputError
from converters.settings import Settings
from pipeline.runtime.artifact_reading import read_artifact
from pipeline.runtime.tensorrt.identity import build_options
from pipeline.runtime.tensorrt.weights import weight_flag_names


def mlp(seed: int, activation: type[torch.nn.Module] = torch.nn.ReLU) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), activation(), torch.nn.Linear(32, 8)).eval()


SAMPLE = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
FLAGS = ("REFIT", "REFIT_IDENTICAL", "STRIP_PLAN", "WEIGHT_STREAMING", "SPARSE_WEIGHTS")


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return mlp(0)


@pytest.fixture(scope="module")
def on_onnxruntime(original: torch.nn.Module) -> pipeline.ConvertedModule:
    return pipeline.convert(original, SAMPLE, backend="onnxruntime")


@pytest.fixture(scope="module")
def on_rtx(tmp_path_factory: pytest.TempPathFactory) -> pipeline.ConvertedModule:
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is in the dev extra")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the engine cannot run here: EngineNotRunnableWarning
        cache = str(tmp_path_factory.mktemp("cache"))
        return pipeline.convert(
            mlp(0), SAMPLE, backend="tensorrt-rtx", cache_dir=cache, weight_streaming_budget=-1, sparse_weights=True
        )


def test_weight_streaming_budget_below_minus_one_is_an_input_error() -> None:
    with pytest.raises(InputError, match=r"weight_streaming_budget must be -1 \(automatic\)"):
        Settings(weight_streaming_budget=-2)


def test_options_become_flags_of_the_real_tensorrt_rtx_builder_config(on_onnxruntime: pipeline.ConvertedModule) -> None:
    trt = pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is in the dev extra")
    from pipeline.backends.tensorrt.build import create_config, parse_onnx
    from pipeline.runtime.tensorrt.library import TENSORRT_RTX

    cases = [
        ({}, []),
        ({"strip_weights": True}, ["REFIT_IDENTICAL", "STRIP_PLAN"]),
        ({"strip_weights": True, "refittable": True}, ["REFIT", "STRIP_PLAN"]),
        ({"refittable": True}, ["REFIT"]),
        ({"weight_streaming_budget": -1, "sparse_weights": True}, ["WEIGHT_STREAMING", "SPARSE_WEIGHTS"]),
    ]
    for options, flags in cases:
        (builder, network, _), failures = parse_onnx(on_onnxruntime.onnx, library=TENSORRT_RTX)
        assert failures == []
        settings = Settings(**options)
        assert weight_flag_names(settings) == flags
        config = create_config(on_onnxruntime.io, settings, None, TENSORRT_RTX)(builder, network)
        assert {name for name in FLAGS if config.get_flag(getattr(trt.BuilderFlag, name))} == set(flags), options


def test_the_engine_cache_key_has_the_weight_options_and_not_the_streaming_budget(
    on_onnxruntime: pipeline.ConvertedModule,
) -> None:
    io = on_onnxruntime.io
    plain = build_options(io, Settings())
    for changed in ({"strip_weights": True}, {"refittable": True}, {"sparse_weights": True}):
        assert build_options(io, Settings(**changed)) != plain, changed
    streamed = build_options(io, Settings(weight_streaming_budget=-1))
    assert streamed["weight_streaming"] is True  # built in: the engine streams its weights
    assert build_options(io, Settings(weight_streaming_budget=1 << 20)) == streamed  # the budget is set at load
    assert build_options(io, Settings(cuda_graphs=True, trt_runtime_cache=False)) == plain  # runtime only


def test_tensorrt_rtx_builds_streaming_and_sparse_engines_and_the_artifact_records_them(
    on_rtx: pipeline.ConvertedModule, tmp_path: Path
) -> None:
    assert on_rtx.engine_bytes is not None and on_rtx.engine_bytes[:4] == b"vtrt"
    assert on_rtx.report.engine_options is not None
    assert on_rtx.report.engine_options["flags"] == ["WEIGHT_STREAMING", "SPARSE_WEIGHTS"]
    assert "engine    flags WEIGHT_STREAMING, SPARSE_WEIGHTS; weights in the plan" in on_rtx.report.summary()
    path = on_rtx.save(tmp_path / "m.ptrt")
    record = read_artifact(path).metadata["engine"]
    assert record["weights"] == "plan" and record["build"]["weight_streaming"] is True
    assert record["build"]["sparse_weights"] is True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = pipeline.load(path)
    assert again.settings.weight_streaming_budget == -1 and again.engine_bytes == on_rtx.engine_bytes
    assert again.report.engine_options == on_rtx.report.engine_options
    torch.testing.assert_close(again(SAMPLE), mlp(0)(SAMPLE), atol=1e-5, rtol=1e-4)


def test_refit_of_an_engine_not_built_refittable_is_a_build_error_naming_the_setting(
    on_rtx: pipeline.ConvertedModule,
) -> None:
    with pytest.raises(BuildError, match="not built refittable") as e:
        pipeline.refit(on_rtx, mlp(1))
    assert "refittable=True" in str(e.value)


def test_tensorrt_rtx_without_a_gpu_refuses_refittable_and_stripped_builds_with_the_fix(
    on_onnxruntime: pipeline.ConvertedModule,
) -> None:
    """Measured: TensorRT-RTX 1.7.1's CPU-only builder fails on REFIT, REFIT_IDENTICAL and STRIP_PLAN (Myelin's JIT
    needs CUDA) and builds the same graph without them (``on_rtx``). Said as such, with what to do."""
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is in the dev extra")
    from pipeline.backends.tensorrt.build import build_engine
    from pipeline.runtime.tensorrt.library import TENSORRT_RTX

    if torch.cuda.is_available():
        pytest.skip("with a CUDA device the builder builds them")
    settings = Settings(strip_weights=True)
    with pytest.raises(BuildError, match="cannot build a refittable or weight-stripped engine without a CUDA") as e:
        build_engine(on_onnxruntime.onnx, on_onnxruntime.io, settings, None, library=TENSORRT_RTX)
    assert "build on a machine with an NVIDIA GPU" in str(e.value)


def test_refit_on_onnxruntime_matches_the_new_model_and_travels_in_the_artifact(
    on_onnxruntime: pipeline.ConvertedModule, original: torch.nn.Module, tmp_path: Path
) -> None:
    module, new = on_onnxruntime, mlp(1)
    assert not torch.allclose(module(SAMPLE), new(SAMPLE), atol=1e-3)
    assert pipeline.refit(module, new) is module
    torch.testing.assert_close(module(SAMPLE), new(SAMPLE), atol=1e-5, rtol=1e-4)
    assert module.report.accuracy is not None and module.report.accuracy.passed
    assert [name for name, _ in module.report.stages][-2:] == ["refit", "validate"]
    loaded = pipeline.load(module.save(tmp_path / "refit.ptrt"))
    torch.testing.assert_close(loaded(SAMPLE), new(SAMPLE), atol=1e-5, rtol=1e-4)
    # a loaded module has neither the original model nor the sample
    with pytest.raises(InputError, match="needs a sample"):
        pipeline.refit(loaded, mlp(2))
    with pytest.raises(InputError, match="the model it was converted from is gone"):
        pipeline.refit(loaded, mlp(2).state_dict())
    # a state dict is loaded into a copy of the converted model (the user's model is untouched)
    state = {name: value * 2 for name, value in mlp(3).state_dict().items()}
    pipeline.refit(module, state)
    target = mlp(0)
    target.load_state_dict(state)
    torch.testing.assert_close(module(SAMPLE), target(SAMPLE), atol=1e-5, rtol=1e-4)
    assert torch.equal(original[0].weight, mlp(0)[0].weight)
    with pytest.raises(InputError, match="the state dict does not fit the converted model"):
        pipeline.refit(module, {"0.weight": torch.zeros(32, 16)})


def test_refit_with_another_architecture_names_the_first_different_node(
    on_onnxruntime: pipeline.ConvertedModule,
) -> None:
    before = on_onnxruntime(SAMPLE)
    with pytest.raises(ConversionError, match=r"differs from the converted one in more than its weights: node .*Relu"):
        pipeline.refit(on_onnxruntime, mlp(0, torch.nn.Tanh))
    assert np.array_equal(on_onnxruntime(SAMPLE).numpy(), before.numpy())  # unchanged after a refused refit


def test_refit_in_fp16_goes_through_the_precision_stage() -> None:
    module = pipeline.convert(mlp(0), SAMPLE, backend="onnxruntime", precision="fp16")
    pipeline.refit(module, mlp(4))
    halves = [t for t in module.onnx.graph.initializer if t.data_type == 10]  # FLOAT16
    assert halves, "the new weights are float16, as the precision stage made the converted ones"
    assert module.report.accuracy is not None and module.report.accuracy.passed
    expected = mlp(4)(SAMPLE)
    assert (module(SAMPLE) - expected).abs().max().item() < 1e-2 * expected.abs().max().item()
