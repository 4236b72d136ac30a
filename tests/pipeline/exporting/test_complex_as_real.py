"""Complex arithmetic inside a model (rotary embeddings written with ``torch.polar`` and ``view_as_complex``) is
written as real arithmetic before the ONNX translation (pipeline.exporting.complex_as_real): the graph has no
complex tensor, matches PyTorch, and TensorRT-RTX builds it. DeepSeek-V2 and Llama 4, whose exports failed on
``aten.unsqueeze`` of a complex tensor, convert. Tiny models with random weights, built from their configs."""

from __future__ import annotations

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' models
import torch
import transformers
from rtx_build import assert_builds

import pipeline
from pipeline.exporting import program_fixes


class ComplexRope(torch.nn.Module):
    """Every rule's op on complex tensors: polar, view_as_complex/real, products (complex, real tensor, number),
    a division by a real tensor, unsqueeze, conj, abs, angle, exp, real, imag, a sum, transposes, cat and slices."""

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * torch.arange(1, 5).float()
        cis = torch.polar(torch.ones_like(freqs), freqs).unsqueeze(1)  # [batch, 1, length, 4]
        z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # [batch, heads, length, 4]
        rotated = torch.view_as_real(z * cis * 0.5).flatten(3)
        w = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) / (1 + positions[:, None, :, None])
        joined = torch.cat([w, z.transpose(1, 2).transpose(1, 2)], dim=-1)[..., 2:6]
        mixed = (w.conj() * z).abs() + torch.angle(w + z) + torch.exp(w / 3).real - (z - w).imag
        return rotated, mixed + torch.view_as_real(joined).sum(-1)


def _sample() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(2, 3, 5, 8), torch.arange(5).expand(2, 5)


def test_complex_ops_are_real_in_the_graph_and_match() -> None:
    model, sample = ComplexRope(), _sample()
    module = pipeline.convert(model, sample)
    types = {v.type.tensor_type.elem_type for v in (*module.onnx.graph.value_info, *module.onnx.graph.output)}
    assert not types & {14, 15}  # no COMPLEX64 or COMPLEX128 tensor
    assert module.report.compatibility is not None and module.report.compatibility["problems"] == []
    got, want = module(*sample), model(*sample)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_without_the_rewrite_the_exporter_refuses_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(program_fixes, "complex_as_real", lambda program: 0)
    with pytest.raises(pipeline.ExportError, match="complex"):
        pipeline.convert(ComplexRope(), _sample())


def test_complex_ops_build_with_tensorrt_rtx() -> None:
    assert_builds(pipeline.convert(ComplexRope(), _sample(), validate=False))


class SplitComplexFrequencies(torch.nn.Module):
    """QwenImage's ControlNet: complex rotary frequencies stored in a buffer, split per axis (``split_with_sizes``),
    unbound and chunked, each part used on its own."""

    def __init__(self) -> None:
        super().__init__()
        angles = torch.arange(6).float() / 7
        self.register_buffer("turn", torch.polar(torch.ones(6), angles), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        freqs = positions[..., None].float() * torch.arange(1, 7).float()
        cis = torch.polar(torch.ones_like(freqs), freqs) * self.turn  # [batch, length, 6]
        frame, height, width = cis.split([1, 2, 3], dim=-1)
        first, second = cis.unbind(0)
        left, right = cis.chunk(2, dim=-1)
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))  # [batch, length, 6]
        joined = torch.cat([frame, height * 2, width.conj()], dim=-1) * z
        return torch.view_as_real(joined + (first * second)[None] + torch.cat([right, left], dim=-1)).flatten(2)


def test_complex_lists_split_unbound_and_chunked_match_and_build() -> None:
    model, sample = SplitComplexFrequencies(), (torch.randn(2, 5, 12), torch.arange(5).expand(2, 5))
    module = pipeline.convert(model, sample)
    types = {v.type.tensor_type.elem_type for v in (*module.onnx.graph.value_info, *module.onnx.graph.output)}
    assert not types & {14, 15}
    torch.testing.assert_close(module(*sample), model(*sample), rtol=1e-4, atol=1e-5)
    assert_builds(module)


class AutocastOffRope(torch.nn.Module):
    """Z-Image's rotary embedding: complex frequencies indexed by position ids, padded per sequence, inside an
    autocast region that turns autocast off."""

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", enabled=False):
            table = torch.polar(torch.ones(16, 4), torch.arange(64).float().reshape(16, 4) / 9)
            cis = table[ids]  # [batch, length, 4]
            padded = torch.nn.utils.rnn.pad_sequence([cis[0], cis[1, :3]], batch_first=True)
            z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
            return torch.view_as_real(z * padded).flatten(2)


def test_complex_ops_in_an_inert_autocast_region_indexed_and_padded_convert() -> None:
    model = AutocastOffRope()
    sample = (torch.randn(2, 5, 8), torch.tensor([[0, 3, 5, 7, 9], [1, 2, 4, 6, 8]]))
    module = pipeline.convert(model, sample)
    torch.testing.assert_close(module(*sample), model(*sample), rtol=1e-4, atol=1e-5)
    assert_builds(module)


class ComplexPower(torch.nn.Module):
    """A complex op the rewrite has no rule for: nothing is rewritten and the error names the op, as before."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.view_as_complex(x.reshape(4, 4, 2))
        return torch.view_as_real(z**3).unsqueeze(0)


def test_a_complex_op_without_a_rule_leaves_the_program_to_the_exporter() -> None:
    with pytest.raises(pipeline.ExportError) as caught:
        pipeline.convert(ComplexPower(), torch.randn(32))
    assert "aten.pow" in str(caught.value)


def _ids(length: int) -> torch.Tensor:
    return torch.randint(3, 100, (2, length), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    "config",
    [
        transformers.DeepseekV2Config(
            vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
            topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=16, max_position_embeddings=64,
        ),
        transformers.Llama4TextConfig(
            vocab_size=128, hidden_size=64, intermediate_size=64, intermediate_size_mlp=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=2, max_position_embeddings=64,
        ),
    ],
    ids=["deepseek_v2", "llama4_text"],
)  # fmt: skip
def test_complex_rotary_decoders_convert_and_match(config: transformers.PretrainedConfig) -> None:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    sample = {"input_ids": _ids(8)}
    module = pipeline.convert(model, ((), sample), validation_inputs=1)
    assert module.report.accuracy is not None and module.report.accuracy.passed
    assert module.report.compatibility is not None and module.report.compatibility["problems"] == []
    with torch.no_grad():
        want = model(**sample).logits
    torch.testing.assert_close(module(**sample).logits, want, rtol=1e-4, atol=1e-4)
