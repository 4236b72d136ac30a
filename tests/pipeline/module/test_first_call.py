"""``pipeline.on_first_call``: converts on the first call with that call's arguments, keeps the original's
attributes, converts again (WARNING) when a call leaves what was converted, refuses (InputError) a call outside the
declared ranges, saves and loads its artifact, and swaps a bound method (``vae.decode``) the same way."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import pipeline


class Denoiser(nn.Module):
    """A denoiser-shaped module: keyword arguments, a config, a return_dict flag, and a decode method."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.config = {"in_channels": 4}

    def forward(self, sample: torch.Tensor, scale: torch.Tensor, return_dict: bool = True) -> Any:
        out = self.proj(sample) * scale
        return {"sample": out} if return_dict else (out,)

    def decode(self, z: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.tanh(self.proj(z))


def test_converts_on_first_call_and_keeps_the_originals_attributes(tmp_path: Path) -> None:
    model = Denoiser().eval()
    batch = ("batch", 1, 2, 4)
    wrapped = pipeline.on_first_call(model, dynamic={"sample": {0: batch}}, artifact=tmp_path / "denoiser")
    assert wrapped.converted is None
    assert wrapped.config == {"in_channels": 4} and wrapped.dtype == torch.float32
    assert wrapped.device == torch.device("cpu") and wrapped.proj is model.proj
    x, s = torch.randn(2, 4), torch.tensor(0.5)
    (got,) = wrapped(sample=x, scale=s, return_dict=False)
    torch.testing.assert_close(got, model(x, s, return_dict=False)[0])
    assert isinstance(wrapped.converted, pipeline.ConvertedModule) and (tmp_path / "denoiser").exists()
    wrapped(sample=torch.randn(4, 4), scale=s, return_dict=False)  # the declared batch range: no new conversion
    assert len(wrapped.conversions) == 1
    with pytest.raises(pipeline.InputError, match=r"size 8 on axis 0 of 'sample', outside the declared range"):
        wrapped(sample=torch.randn(8, 4), scale=s, return_dict=False)
    again = pipeline.on_first_call(model, artifact=tmp_path / "denoiser")  # loads the saved conversion
    (got,) = again(sample=x, scale=s, return_dict=False)
    torch.testing.assert_close(got, model(x, s, return_dict=False)[0])
    assert again.converted is not None and again.converted.backend == "onnxruntime"


def test_a_call_that_leaves_the_conversion_converts_again(caplog: pytest.LogCaptureFixture) -> None:
    model = Denoiser().eval()
    wrapped = pipeline.on_first_call(model, max_conversions=2)
    x, s = torch.randn(2, 4), torch.tensor(0.5)
    wrapped(x, s)
    with caplog.at_level(logging.WARNING):
        got = wrapped(x, s, return_dict=False)  # another constant: converted again, said loudly
    assert "converting Denoiser again" in caplog.text
    torch.testing.assert_close(got[0], model(x, s, return_dict=False)[0])
    assert len(wrapped.conversions) == 2
    torch.testing.assert_close(wrapped(x, s)["sample"], model(x, s)["sample"])  # the first still serves its calls
    with pytest.raises(pipeline.InputError, match=r"fits none of the 2 conversions"):
        wrapped(torch.randn(3, 4), s)


def test_a_bound_method_is_swapped_in_place(caplog: pytest.LogCaptureFixture) -> None:
    model = Denoiser().eval()
    original = model.decode
    model.decode = pipeline.on_first_call(model.decode)  # type: ignore[method-assign]
    z = torch.randn(3, 4)
    with caplog.at_level(logging.WARNING):
        got = model.decode(z, generator=torch.Generator().manual_seed(0))
    assert "passed as None" in caplog.text
    torch.testing.assert_close(got, original(z))
    assert isinstance(model.decode, pipeline.FirstCallMethod) and len(model.decode.conversions) == 1
    with pytest.raises(pipeline.InputError, match="an nn.Module or a bound method"):
        pipeline.on_first_call(torch.tanh)
