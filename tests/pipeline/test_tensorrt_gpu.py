"""Engine behaviour, on a GPU with TensorRT: build and run ResNet- and BERT-style models, dynamic shapes, the
engine cache (hit, corrupted entry), data-dependent output shapes, the current stream, an fp16 graph, artifacts.

Every test here is marked ``tensorrt`` and skipped, with the reason, where TensorRT cannot run: this project's
machines have no GPU, so none of these has run yet. On a GPU machine: ``pytest -m tensorrt``.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import pipeline
from pipeline.runtime.tensorrt.identity import tensorrt_status

AVAILABLE, WHY = tensorrt_status()
pytestmark = [pytest.mark.tensorrt, pytest.mark.skipif(not AVAILABLE, reason=f"needs TensorRT and a CUDA GPU: {WHY}")]

ROOT = Path(__file__).resolve().parents[2]
FP32 = pipeline.DEFAULT_TOLERANCES["float32"]
FP16 = pipeline.DEFAULT_TOLERANCES["float16"]


def small_resnet() -> tuple[nn.Module, torch.Tensor]:
    spec = importlib.util.spec_from_file_location("example_cnn", ROOT / "examples" / "cnn.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model, sample = example.build()
    return model, sample


def fresh(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def convert(model: nn.Module, sample: Any, tmp_path: Path, **settings: Any) -> pipeline.ConvertedModule:
    return pipeline.convert(model, sample, backend="tensorrt", cache_dir=str(tmp_path / "cache"), **settings)


def expect(model: nn.Module, *args: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model.cuda()(*(a.cuda() for a in args))
    return out


def assert_close(got: torch.Tensor, want: torch.Tensor, tolerance: pipeline.Tolerance = FP32) -> None:
    torch.testing.assert_close(got, want.to(got.device), atol=tolerance.atol, rtol=tolerance.rtol)


def executor(module: pipeline.ConvertedModule) -> Any:
    return module._executor


# -- ResNet-style CNN --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def resnet(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, pipeline.ConvertedModule]:
    model, sample = small_resnet()
    dynamic = {"x": {0: ("batch", 1, 2, 8)}}
    return model, convert(model, sample, tmp_path_factory.mktemp("resnet"), dynamic=dynamic)


def test_resnet_builds_runs_and_matches_pytorch(resnet: tuple[nn.Module, pipeline.ConvertedModule]) -> None:
    model, module = resnet
    assert module.backend == "tensorrt" and module.engine_bytes
    assert module.report.accuracy is not None and module.report.accuracy.passed
    x = fresh(3, 3, 64, 64, seed=11).cuda()
    out = module(x)
    assert out.device == x.device and out.dtype == torch.float32 and out.shape == (3, 10)
    assert_close(out, expect(model, x))
    assert module(x.cpu()).device.type == "cpu"  # outputs come back on the inputs' device


def test_dynamic_batch_at_the_profile_bounds_and_outside(resnet: tuple[nn.Module, pipeline.ConvertedModule]) -> None:
    model, module = resnet
    for batch in (1, 8):
        x = fresh(batch, 3, 64, 64, seed=batch).cuda()
        assert_close(module(x), expect(model, x))
    with pytest.raises(pipeline.InputError, match="outside the declared range"):
        module(fresh(9, 3, 64, 64, seed=9).cuda())
    with pytest.raises(pipeline.InputError, match=r"input 'x' has shape \[9, 3, 64, 64\].*min \[1, 3, 64, 64\]"):
        executor(module).run([fresh(9, 3, 64, 64, seed=9).cuda()])  # the engine's own check, below the module's


def test_non_contiguous_input_on_a_side_stream(resnet: tuple[nn.Module, pipeline.ConvertedModule]) -> None:
    model, module = resnet
    x = fresh(64, 64, 3, 2, seed=5).cuda().permute(3, 2, 0, 1)
    assert not x.is_contiguous()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = module(x)
    stream.synchronize()
    assert_close(out, expect(model, x.contiguous()))


# -- BERT-style transformer --------------------------------------------------------------------------------------------


def test_bert_with_dynamic_batch_and_sequence(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    dims = {0: ("batch", 1, 2, 4), 1: ("seq", 1, 8, 16)}
    sample = {"input_ids": torch.randint(0, 100, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    module = convert(model, ((), sample), tmp_path, dynamic={name: dims for name in sample})
    for batch, seq in ((1, 1), (3, 11), (4, 16)):
        ids = torch.randint(0, 100, (batch, seq), generator=torch.Generator().manual_seed(seq)).cuda()
        mask = torch.ones(batch, seq, dtype=torch.long).cuda()
        mask[0, seq // 2 + 1 :] = 0  # padding in the first row
        got = module(input_ids=ids, attention_mask=mask)
        with torch.no_grad():
            want = model.cuda()(input_ids=ids, attention_mask=mask)
        assert_close(got.last_hidden_state, want.last_hidden_state)
        assert_close(got.pooler_output, want.pooler_output)


# -- data-dependent output shapes (the output allocator) ---------------------------------------------------------------


class Positives(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x > 0)


def test_data_dependent_output_shape_gets_fresh_memory_each_run(tmp_path: Path) -> None:
    module = convert(Positives(), torch.randn(4, 5), tmp_path)
    first_input, second_input = fresh(4, 5, seed=1).cuda(), fresh(4, 5, seed=2).cuda()
    first = module(first_input)
    first_copy = first.clone()
    second = module(second_input)
    assert torch.equal(first, first_copy)  # the second run did not write into the first result
    assert torch.equal(first, torch.nonzero(first_input > 0)) and torch.equal(second, torch.nonzero(second_input > 0))


# -- the engine cache --------------------------------------------------------------------------------------------------


def test_engine_cache_hit_then_corrupted_entry_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, sample = small_resnet()
    first = convert(model, sample, tmp_path, validate=False)
    second = convert(model, sample, tmp_path, validate=False)
    assert (executor(first).cache_status, executor(second).cache_status) == ("built", "hit")
    assert first.engine_bytes == second.engine_bytes
    cache = tmp_path / "cache"
    assert list(cache.glob("timing-trt*.cache")), "the timing cache is kept beside the engines"
    (plan,) = cache.glob("*.plan")
    plan.write_bytes(plan.read_bytes()[:-16])
    with caplog.at_level(logging.WARNING):
        third = convert(model, sample, tmp_path, validate=False)
    assert executor(third).cache_status.startswith("rebuilt")
    assert any("is corrupted" in r.getMessage() for r in caplog.records)
    x = fresh(2, 3, 64, 64, seed=3).cuda()
    assert_close(third(x), expect(model, x))
    other = convert(model, sample, tmp_path, validate=False, trt_builder_optimization_level=1)
    assert executor(other).cache_status == "built"  # another build setting, another entry


# -- an fp16 graph (precision lives in the graph; no builder flag) -----------------------------------------------------


def test_fp16_graph_builds_strongly_typed_and_matches_pytorch_in_fp16(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval().half()
    module = convert(model, torch.randn(4, 16).half(), tmp_path)
    assert module.onnx.graph.input[0].type.tensor_type.elem_type == 10  # FLOAT16 in the graph itself
    x = fresh(4, 16, seed=4, dtype=torch.float16).cuda()
    out = module(x)
    assert out.dtype == torch.float16
    assert_close(out, expect(model, x), FP16)


# -- artifacts ---------------------------------------------------------------------------------------------------------


def test_artifact_with_engine_loads_and_runs(
    resnet: tuple[nn.Module, pipeline.ConvertedModule], tmp_path: Path
) -> None:
    model, module = resnet
    path = module.save(tmp_path / "resnet.ptrt")
    again = pipeline.load(path)
    assert again.backend == "tensorrt" and again.engine_bytes == module.engine_bytes
    x = fresh(2, 3, 64, 64, seed=7).cuda()
    assert_close(again(x), module(x), pipeline.Tolerance(0.0, 0.0))  # the same engine: the same numbers
    on_cpu = pipeline.load(path, backend="onnxruntime")
    assert_close(on_cpu(x.cpu()), expect(model, x))
