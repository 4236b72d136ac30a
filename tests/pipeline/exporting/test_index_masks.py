"""transformers builds a mask from a mask function handed to it (``and_mask_function=``) with ``torch.vmap``. After a
data-dependent check (a multimodal encoder's count of its image tokens, ``torch._check_tensor_all``) torch.export
leaves vmap's batching in the program and the ONNX translation cannot decompose it ("... gen_vmap_plumbing": T5Gemma
2's encoder with an image). The export broadcasts such a function over index tensors instead
(:mod:`pipeline.exporting.index_masks`): the module converts with its batch and length dynamic, and its mask on other
sizes is the model's, built with vmap."""

from __future__ import annotations

from typing import Any

import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' models
import torch
import transformers
from transformers.masking_utils import create_bidirectional_mask

import pipeline


def window(batch_idx: Any, head_idx: Any, q_idx: Any, kv_idx: Any) -> Any:
    """A bidirectional window of two positions each side, written element by element on its indices (T5Gemma 2's
    encoder hands transformers one like it)."""
    distance = q_idx - kv_idx
    return (distance < 3) & (-distance < 3)


class WindowedScores(torch.nn.Module):
    """Scores [batch, 1, tokens, tokens] masked by transformers' bidirectional SDPA mask of the padding and
    :func:`window`, after a data-dependent check of the mask."""

    def __init__(self) -> None:
        super().__init__()
        self.config = transformers.PretrainedConfig()
        self.config._attn_implementation = "sdpa"

    def forward(self, scores: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``scores`` where the mask keeps a position, -1 elsewhere."""
        torch._check_tensor_all(attention_mask.sum() > 0)  # as transformers checks a count of image tokens
        mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=scores[:, 0],  # its batch and length
            attention_mask=attention_mask,
            and_mask_function=window,  # a function handed to transformers: built with vmap
        )
        assert mask is not None
        return torch.where(mask, scores, torch.full_like(scores, -1.0))


def sample(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """Scores and a right-padded mask (the first row two tokens shorter)."""
    scores = torch.randn(batch, 1, length, length, generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(batch, length, dtype=torch.int64)
    mask[0, -2:] = 0
    return {"scores": scores, "attention_mask": mask}


def test_a_vmapped_mask_function_exports_with_dynamic_batch_and_length() -> None:
    batch, length = ("batch", 1, 2, 4), ("length", 4, 7, 16)
    dynamic = {"scores": {0: batch, 2: length, 3: length}, "attention_mask": {0: batch, 1: length}}
    model = WindowedScores()
    module = pipeline.convert(model, ((), sample(2, 7, 0)), dynamic=dynamic, validate=False)
    for batch, length in ((2, 7), (3, 11)):
        other = sample(batch, length, seed=length)
        want = model(**other)
        assert bool((want == -1).any()) and bool((want != -1).any())  # the window and the padding both cut
        torch.testing.assert_close(module(**other), want, rtol=0, atol=0)
