"""Small models the pipeline tests convert: random weights, no hub downloads, with their inputs.

Shared by ``tests/pipeline/test_convert_models.py`` (fp32 conversions) and ``tests/pipeline/test_rtx_builds.py``
(their fp16 and bf16 final graphs built with TensorRT-RTX).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def fresh(*shape: int, seed: int) -> torch.Tensor:
    """A float input drawn with its own generator: never the sample, never a validation input."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def fresh_ids(*shape: int, high: int, seed: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def padding_mask(lengths: list[int], seq: int) -> torch.Tensor:
    """An int64 attention mask, 1 for the first ``length`` tokens of each row, 0 after."""
    return (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AvgPool2d(2),
        )
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def make_cnn(seed: int = 0) -> CNN:
    """A CNN whose batch norms have non-trivial running statistics and affine parameters."""
    torch.manual_seed(seed)
    model = CNN()
    with torch.no_grad():
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
    return model.eval()


class TwoInTwoOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.proj(x) + y
        return torch.relu(h), (x * y).sum(-1)


class DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(5, 8)
        self.cls = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        h = torch.tanh(self.body(x))
        return {"logits": self.cls(h), "hidden": [h, h.mean(-1)], "attentions": None}


class ListOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(5, 2)
        self.b = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> list[Any]:
        return [self.a(x), None, self.b(x).softmax(-1)]


class Gated(nn.Module):
    """Three tensor arguments that may be passed positionally or by keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * mask + bias


class KeywordOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * scale


def tiny_bert_config(**overrides: Any) -> Any:
    settings: dict[str, Any] = {
        "vocab_size": 100,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "type_vocab_size": 2,
    }
    import transformers

    return transformers.BertConfig(**(settings | overrides))


def bert_inputs(batch: int, seq: int, seed: int, lengths: list[int] | None = None) -> dict[str, torch.Tensor]:
    lengths = lengths if lengths is not None else [max(1, seq - i) for i in range(batch)]
    return {
        "input_ids": fresh_ids(batch, seq, high=100, seed=seed),
        "attention_mask": padding_mask(lengths, seq),
        "token_type_ids": (torch.arange(seq)[None, :] >= seq // 2).long().expand(batch, seq).contiguous(),
    }


def hf_resnet_model() -> nn.Module:
    """transformers ResNet with non-trivial batch-norm statistics; takes pixel_values (2, 3, 32, 32)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=5
    )
    model = transformers.ResNetForImageClassification(config).eval()
    with torch.no_grad():
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.running_mean.uniform_(-0.3, 0.3)
            bn.running_var.uniform_(0.5, 1.5)
    return model


def hf_vit_model() -> nn.Module:
    """transformers ViT on 16x16 images in 4x4 patches; takes pixel_values (2, 3, 16, 16)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=5,
    )
    return transformers.ViTForImageClassification(config).eval()


def gpt2_model() -> nn.Module:
    """transformers GPT2Model, 2 layers of width 32; takes input_ids (batch, seq) < 100, use_cache=False."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2Model(config).eval()


def llama_model() -> nn.Module:
    """transformers LlamaModel, 2 layers of width 32, grouped-query attention (2 heads, 1 KV head)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    return transformers.LlamaModel(config).eval()
