"""The cached step's attention op in PyTorch (the reference every step graph is validated against): the fused kernel
where it gives the written-out values, the written-out form where it would not."""

from __future__ import annotations

import pytest
import torch

from pipeline.generation.ops import attention


def _written_out(query, key, value, mask, scale):  # noqa: ANN001, ANN202 - the definition, as the op's docstring has it
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = (torch.matmul(query, key.transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), value)


def _inputs(dtype: torch.dtype, steps: int = 5, capacity: int = 12) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, 4, steps, 8, generator=generator).to(dtype)
    key, value = (torch.randn(2, 2, capacity, 8, generator=generator).to(dtype) for _ in range(2))
    filled = torch.arange(capacity)[None, :] <= (capacity - steps) + torch.arange(steps)[:, None]  # causal, full
    return query, key, value, filled[None, None].expand(2, 1, steps, capacity).clone()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_attention_gives_the_written_out_values(dtype: torch.dtype) -> None:
    query, key, value, mask = _inputs(dtype)
    got = attention(query, key, value, mask, 0.35, 0.0)
    want = _written_out(query, key, value, mask, 0.35)
    if dtype == torch.float16:  # the written-out form itself: its float16 rounding is the reference's
        assert torch.equal(got, want)
    else:
        # (an element near zero takes its tolerance from the values' scale: the CPU's kernel orders its sums otherwise)
        wide = dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5 if wide else 1e-12, atol=1e-7 if wide else 1e-15)


def test_a_query_that_sees_nothing_stays_nan_as_written_out() -> None:
    query, key, value, mask = _inputs(torch.float32)
    mask[1, 0, 2] = False  # row 1's third query sees no position
    got = attention(query, key, value, mask, 0.35, 0.0)
    assert torch.isnan(got[1, :, 2]).all() and not torch.isnan(got[0]).any()
    assert torch.equal(torch.isnan(got), torch.isnan(_written_out(query, key, value, mask, 0.35)))
