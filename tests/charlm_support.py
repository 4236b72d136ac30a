"""A character-level transformer language model trained on the English text CPython ships
(``pydoc_data/topics.py``, about 465,000 characters of its reference documentation), for the 4-bit tests and
``benchmarks/quantize_charlm.py``: the accuracy task of the 4-bit precisions is its validation perplexity.

The model is a plain pre-norm decoder (token and position embeddings, ``layers`` blocks of causal self-attention
and a 4x GELU MLP, a linear head) whose linear layers are what 4-bit quantization stores; width 256 or more makes
the INT4 block size matter (a block of 128 spans half a row of the 256-wide projections).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from torch import nn

#: Context length of training and evaluation windows.
CONTEXT = 64


def corpus() -> tuple[str, dict[str, int]]:
    """The text (every topic, sorted by name) and its character vocabulary."""
    import pydoc_data.topics as topics

    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    return text, {c: i for i, c in enumerate(sorted(set(text)))}


def encoded() -> tuple[torch.Tensor, torch.Tensor, dict[str, int]]:
    """Train and validation token streams (90/10 split) and the vocabulary."""
    text, vocab = corpus()
    data = torch.tensor([vocab[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(data))
    return data[:split], data[split:], vocab


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


class CharLM(nn.Module):
    """``input_ids [B, T]`` -> logits ``[B, T, vocab]``."""

    def __init__(self, vocab: int, width: int = 256, layers: int = 3, heads: int = 4) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, width), nn.Embedding(CONTEXT, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) + self.position(torch.arange(input_ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def windows(data: torch.Tensor, count: int, seed: int, length: int = CONTEXT) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` random windows of ``length`` tokens and their next-token targets."""
    starts = torch.randint(len(data) - length - 1, (count,), generator=torch.Generator().manual_seed(seed))
    return torch.stack([data[s : s + length] for s in starts]), torch.stack(
        [data[s + 1 : s + length + 1] for s in starts]
    )


def train(
    steps: int | None = None,
    seconds: float | None = None,
    width: int = 256,
    layers: int = 3,
    batch: int = 16,
    seed: int = 0,
) -> tuple[CharLM, int]:
    """AdamW (3e-3, cosine to 10%) on random training windows for ``steps`` steps (deterministic: the tests) or for
    ``seconds`` (the benchmark); the model in eval mode and the steps taken."""
    if (steps is None) == (seconds is None):
        raise ValueError("give steps or seconds")
    train_data, _, vocab = encoded()
    torch.manual_seed(seed)
    model = CharLM(len(vocab), width, layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    start, step = time.perf_counter(), 0
    while True:
        done = step / steps if steps is not None else (time.perf_counter() - start) / (seconds or 1.0)
        if done >= 1.0:
            break
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))
        x, y = windows(train_data, batch, seed=seed * 1_000_003 + step)
        loss = nn.functional.cross_entropy(model(x).reshape(-1, len(vocab)), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
    return model.eval(), step


def validation_batches(count: int = 4, batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed validation windows (``count`` batches of ``batch``)."""
    _, valid, _ = encoded()
    return [windows(valid, batch, seed=10_000 + i) for i in range(count)]


def calibration_batches(count: int = 4, batch: int = 8) -> list[torch.Tensor]:
    """Training text windows for calibration (AWQ's activations)."""
    train_data, _, _ = encoded()
    return [windows(train_data, batch, seed=20_000 + i)[0] for i in range(count)]


def perplexity(run: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """exp(mean next-character cross-entropy) of ``run`` (a model or converted module) over ``batches``."""
    losses = []
    with torch.no_grad():
        for x, y in batches:
            logits = run(x).float()
            losses.append(nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item())
    return float(math.exp(np.mean(losses)))


def greedy(run: torch.nn.Module, prompt: str, characters: int) -> str:
    """``prompt`` continued greedily by ``characters`` characters (a window of :data:`CONTEXT`, left-padded with
    spaces), through ``run`` called on ``[1, CONTEXT]`` token ids."""
    _, vocab = corpus()
    inverse = {i: c for c, i in vocab.items()}
    text = prompt
    with torch.no_grad():
        for _ in range(characters):
            window = text[-CONTEXT:].rjust(CONTEXT)
            ids = torch.tensor([[vocab.get(c, vocab[" "]) for c in window]])
            text += inverse[int(run(ids)[0, -1].argmax())]
    return text[len(prompt) :]
