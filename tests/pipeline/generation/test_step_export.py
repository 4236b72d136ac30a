"""What the export of the cached step costs, and that what it writes does not change.

torch.export traces of the step (pipeline/generation/step.py) the mask that lets every query see its own position
once per step, not once per layer, and conversions that change nothing (``Tensor.to`` of the dtype a tensor has, a
float32 RMSNorm's casts) as nothing (pipeline/exporting/composites.py), exactly as PyTorch runs them eagerly. The
exporter's decompositions of the program are done node by node where that is exact
(pipeline/exporting/local_decompositions.py) instead of retracing it twice: the same graph, checked here against
the retrace's."""

from __future__ import annotations

import collections
from typing import Any

import pytest
import tiny_models
import torch
import transformers
from transformers.masking_utils import (
    causal_mask_function,
    chunked_causal_mask_function,
    sdpa_mask,
    sliding_window_causal_mask_function,
)

import pipeline
from converters.defaults import default_registry
from pipeline.exporting.composites import static_composites
from pipeline.generation.conversion import prepare_step
from pipeline.generation.step_attention import step_mask
from pipeline.settings import Settings


def tiny_llama(layers: int = 2) -> transformers.LlamaForCausalLM:
    return tiny_models.tiny_llama(num_hidden_layers=layers)


def traced_ops(layers: int) -> collections.Counter[str]:
    """The ops torch.export traces of the tiny Llama's cached step, as the export stage traces it."""
    ids = torch.randint(1, 90, (1, 6), generator=torch.Generator().manual_seed(1))
    settings = Settings.from_kwargs({"generation": {"max_length": 32, "max_batch": 2}})
    step, sample, _, _ = prepare_step(tiny_llama(layers), ids, settings, default_registry())
    args, kwargs = sample
    with static_composites(), torch.no_grad():
        program = torch.export.export(step, args, kwargs, strict=False)
    return collections.Counter(str(n.target) for n in program.graph.nodes if n.op == "call_function")


def test_the_step_traces_its_own_position_mask_once_and_no_conversion_that_changes_nothing() -> None:
    one, three = traced_ops(1), traced_ops(3)
    assert one["aten.eq.Tensor"] == three["aten.eq.Tensor"] == 1  # per step, not per layer
    for op in ("aten.to.dtype", "aten._assert_tensor_metadata.default"):
        assert three[op] == one[op]  # none per layer (the cache writes and the float32 RMSNorms convert nothing)
    assert three["pipeline_generation.attention.default"] == 3 and three["pipeline_generation.kv_write.default"] == 6


def test_the_step_mask_lets_padding_see_itself_and_is_not_widened_again() -> None:
    """A left-padded row's padding queries see their own position only (finite attention rows); the attention
    takes that mask as it is."""
    padding = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0]]).bool()  # 2 pads, 3 tokens, room for 3 more
    mask = step_mask(batch_size=1, q_length=3, kv_length=8, q_offset=2, kv_offset=0, attention_mask=padding)
    assert mask is not None and mask.shape == (1, 1, 3, 8)
    expected = torch.tensor(
        [[0, 0, 1, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 0, 0, 0]], dtype=torch.bool
    )
    assert torch.equal(mask[0, 0], expected)
    queries_at_padding = step_mask(
        batch_size=1, q_length=2, kv_length=8, q_offset=0, kv_offset=0, attention_mask=padding
    )
    assert queries_at_padding is not None and torch.equal(
        queries_at_padding[0, 0, :, :2], torch.eye(2, dtype=torch.bool)
    )


@pytest.mark.parametrize(
    "pattern",
    [
        causal_mask_function,
        sliding_window_causal_mask_function(3),
        chunked_causal_mask_function(4, torch.tensor([0, 2])),
    ],
    ids=["causal", "sliding window", "chunked"],
)
def test_the_step_mask_ands_the_padding_as_transformers_does(pattern: Any) -> None:
    """The step mask is transformers' ``sdpa_mask`` with the 2-D mask, plus each query's own position, for the
    model's pattern (causal,
    a sliding window, chunks), a prompt and a decode step, and a 2-D mask shorter than the keys (padded with
    False)."""
    generator = torch.Generator().manual_seed(0)
    for steps, past, capacity in ((5, 0, 12), (1, 7, 12), (3, 4, 12), (2, 0, 9)):
        for columns in (capacity, capacity - 2):
            padding = torch.rand(2, columns, generator=generator) > 0.3
            call: dict[str, Any] = {"q_length": steps, "kv_length": capacity, "q_offset": past, "kv_offset": 0}
            call.update(batch_size=2, mask_function=pattern, attention_mask=padding)
            reference = sdpa_mask(**call, allow_is_causal_skip=False)
            own = torch.arange(capacity).view(1, 1, 1, -1) == (torch.arange(steps) + past).view(1, 1, -1, 1)
            mask = step_mask(**call)
            assert mask is not None and reference is not None and torch.equal(mask, reference | own)


def test_unchanged_tensor_to_is_the_tensor_itself_as_in_eager_pytorch() -> None:
    x = torch.randn(2, 3)
    with static_composites():
        assert x.to(torch.float32) is x and x.to(dtype=torch.float32, non_blocking=True) is x
        assert x.to("cpu") is x and x.to("cpu", torch.float32) is x and x.to(x) is not None
        assert x.to(torch.float16).dtype == torch.float16 and x.to(torch.float32, copy=True) is not x
        image = torch.randn(1, 2, 3, 4)
        assert image.to(memory_format=torch.channels_last).is_contiguous(memory_format=torch.channels_last)


class _Casts(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x.to(torch.float32), x.to(x.dtype) * 2, x.to(torch.float16)


def test_a_model_returning_its_input_converted_to_its_own_dtype_converts() -> None:
    """The output is the input itself then (as eagerly): the graph passes it through."""
    x = torch.randn(2, 3)
    with static_composites(), torch.no_grad():
        program = torch.export.export(_Casts(), (x,), strict=False)
    ops = collections.Counter(str(n.target) for n in program.graph.nodes if n.op == "call_function")
    assert ops["aten.to.dtype"] == 1  # the float16 one
    module = pipeline.convert(_Casts().eval(), x)
    for got, want in zip(module(x), _Casts()(x), strict=True):
        torch.testing.assert_close(got, want)
    assert module(x)[2].dtype == torch.float16


def test_real_conversions_are_still_traced() -> None:
    """In bfloat16 the RMSNorms' float32 casts (two per norm: three norms) are real conversions, traced; in float32
    they change nothing, and are not."""

    def conversions(dtype: torch.dtype) -> int:
        model = tiny_llama(1).to(dtype)
        with static_composites(), torch.no_grad():
            program = torch.export.export(model, (torch.randint(1, 90, (1, 5)),), {"use_cache": False}, strict=False)
        return sum(str(n.target) == "aten.to.dtype" for n in program.graph.nodes)

    assert conversions(torch.bfloat16) >= conversions(torch.float32) + 2 * 3


# ------------------------------------------------------------------ the exporter's decompositions, node by node


class _Changing(torch.nn.Module):
    """Every op the local decompositions rewrite, and ops they keep."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = torch.nn.Dropout(0.1)
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch = x.shape[0]
        y = self.drop(self.proj(x)).transpose(1, 2).contiguous().reshape(batch, -1)  # clone, then view
        flags = ((x > 0) | (x < -1)) & mask.to("cpu", torch.bool).unsqueeze(-1)
        return y + x.contiguous().reshape(batch, -1), flags.to(torch.float32).sum(-1)


def _exports(model: torch.nn.Module, sample: tuple[torch.Tensor, ...], dynamic: dict, monkeypatch, caplog) -> list:
    """The final graph and outputs of ``model`` converted with the local decompositions and with the retrace, and
    whether the first took the local way."""
    import contextlib
    import logging

    from pipeline.exporting import patch_stack

    results = []
    for local in (True, False):
        if not local:
            monkeypatch.setattr(patch_stack, "local_decompositions", contextlib.nullcontext)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="pipeline.exporting.local_decompositions"):
            module = pipeline.convert(model, sample, dynamic=dynamic, validate=False)
        took = any("node by node" in r.getMessage() for r in caplog.records)
        graph = [(n.op_type, n.domain, [str(a) for a in n.attribute]) for n in module.onnx.graph.node]
        results.append((graph, module(*sample), took))
    return results


def test_local_decompositions_write_the_retraces_graph(monkeypatch, caplog) -> None:
    x, mask = torch.randn(3, 5, 4), torch.tensor([[1, 1, 0, 1, 0]] * 3)
    dynamic = {"x": {0: ("batch", 2, 3, 8)}, "mask": {0: ("batch", 2, 3, 8)}}
    (local, local_out, took), (retraced, retraced_out, _) = _exports(
        _Changing().eval(), (x, mask), dynamic, monkeypatch, caplog
    )
    assert took and local == retraced
    for got, want in zip(local_out, retraced_out, strict=True):
        assert torch.equal(got, want)


def test_the_cached_step_takes_the_local_way_and_writes_the_same_graph(monkeypatch, caplog) -> None:
    import contextlib
    import logging

    from pipeline.exporting import patch_stack

    ids = torch.randint(1, 90, (1, 6), generator=torch.Generator().manual_seed(1))
    modules, took = [], []
    for local in (True, False):
        if not local:
            monkeypatch.setattr(patch_stack, "local_decompositions", contextlib.nullcontext)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="pipeline.exporting.local_decompositions"):
            modules.append(
                pipeline.convert(tiny_llama(), ids, generation={"max_length": 32, "max_batch": 2}, validate=False)
            )
        took.append(any("node by node" in r.getMessage() for r in caplog.records))
    assert took == [True, False]
    first, second = ([(n.op_type, [str(a) for a in n.attribute]) for n in m.onnx.graph.node] for m in modules)
    assert first == second
    prompt = torch.randint(1, 90, (2, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(prompt)
    mask[1, :3] = 0
    assert torch.equal(*(m.generate(prompt, mask, max_new_tokens=8, eos_token_id=[]) for m in modules))


class _Reshaping(torch.nn.Module):
    """The reshapes and differences the local decompositions write: copying and viewing reshapes of strided
    tensors, flattens, and ``diff`` with and without prepend and append (transformers' packed-sequence check)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        copied = x.transpose(1, 2).reshape(x.shape[0], -1)  # a copy, then a view at the inferred shape
        viewed = x.transpose(0, 1).reshape(5, 3, 2, 2)  # strided, yet a view
        flat = x.flatten(1) + x.transpose(1, 2).flatten(1)
        steps = torch.diff(x, dim=1).sum() + torch.diff(x, prepend=x[:, :, :1] - 1, dim=-1).sum()
        return copied + flat, viewed.sum(-1), steps + torch.diff(x, append=x[:1], dim=0).sum()


def test_reshapes_and_differences_are_decomposed_locally_as_the_retrace_writes_them(monkeypatch, caplog) -> None:
    x = torch.randn(3, 5, 4)
    (local, local_out, took), (retraced, retraced_out, _) = _exports(_Reshaping().eval(), (x,), {}, monkeypatch, caplog)
    assert took and local == retraced
    for got, want in zip(local_out, retraced_out, strict=True):
        assert torch.equal(got, want)


def test_a_bert_is_decomposed_locally_to_the_retraces_graph(monkeypatch, caplog) -> None:
    """BERT's attention reshapes a transposed tensor (a copy): node by node, to the same graph."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=96, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    torch.manual_seed(0)
    ids = torch.randint(1, 90, (2, 7), generator=torch.Generator().manual_seed(3))
    (local, local_out, took), (retraced, retraced_out, _) = _exports(
        transformers.BertModel(config).eval(), (ids,), {}, monkeypatch, caplog
    )
    assert took and local == retraced
    assert list(local_out) == list(retraced_out) == ["last_hidden_state", "pooler_output"]
    for name in local_out:
        assert torch.equal(local_out[name], retraced_out[name])


class _Strided(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.diff(x.transpose(1, 2), n=2)  # a second-order difference: the retrace writes it


class _Normed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


@pytest.mark.parametrize("model", [_Strided(), _Normed()], ids=["second-difference", "batch-norm"])
def test_programs_beyond_the_table_are_retraced(model: torch.nn.Module, monkeypatch, caplog) -> None:
    x = torch.randn(3, 5, 4)
    (local, local_out, took), (retraced, retraced_out, _) = _exports(model.eval(), (x,), {}, monkeypatch, caplog)
    assert not took and local == retraced and torch.equal(local_out, retraced_out)
