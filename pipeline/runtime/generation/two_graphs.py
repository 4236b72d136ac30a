"""What the generation modules made of two converted graphs share (an encoder-decoder's encoder and decoder step, a
vision-language model's vision graph and text step): the step's settings, report and backend as the module's own
(their saved directory: :mod:`pipeline.runtime.generation.saved_directory`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from converters.generation_settings import GenerationSettings
from pipeline.runtime.generation.module import HeldRequests
from pipeline.runtime.module import ConvertedModule


class TwoGraphModule(HeldRequests, torch.nn.Module):
    """A module whose cached step (:meth:`step_graph`) holds its generation settings; the other graph's settings,
    report and engine are its own attribute's. Calling the module generates. Each request (a ``generate`` call, an
    open ``stream()``) holds one of ``request_slots`` from its first graph run to its last: its cache is its own, and
    requests beyond the slots wait (:class:`~pipeline.runtime.generation.module.HeldRequests`)."""

    def step_graph(self) -> ConvertedModule:
        """The converted step: its settings, report and engine are the module's."""
        raise NotImplementedError

    @property
    def generation(self) -> GenerationSettings:
        """The step's generation settings (capacity, batch, special tokens, the model's defaults)."""
        generation = self.step_graph().settings.generation
        assert generation is not None
        return generation

    @property
    def report(self) -> Any:
        """The step's conversion report (the other graph's is its own attribute's ``.report``)."""
        return self.step_graph().report

    @property
    def backend(self) -> str:
        """The backend both graphs run on."""
        return self.step_graph().backend

    @property
    def settings(self) -> Any:
        """The step's settings (the other graph's is its own attribute's ``.settings``)."""
        return self.step_graph().settings

    @property
    def engine_bytes(self) -> bytes | None:
        """The step's TensorRT engine, or None (the other graph's is its own attribute's ``.engine_bytes``)."""
        return self.step_graph().engine_bytes

    def save_onnx(self, path: str | Path) -> list[Path]:
        """The step's final graph to ``path`` (the other graph's: its own attribute's ``.save_onnx``)."""
        return self.step_graph().save_onnx(path)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """Each module's own ``generate``."""
        raise NotImplementedError

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """``generate`` (a converted generative model is called to generate)."""
        return self.generate(*args, **kwargs)
