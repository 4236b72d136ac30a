"""TensorRT's side of generation: the cache in device buffers the engine updates in place.

Each layer's ``past_key_values.{i}.key/value`` input and its ``present.{i}.key/value`` output get the same device
address (TensorRT's KV-cache-update layer writes the network input's memory: the output is an alias), so nothing
is copied between steps; only the logits leave the device. The engine's second optimization profile (sequence 1)
runs the decode steps, the first the prompt. Each request has its own runner and cache buffers (the module's request
slots); the steps of concurrent requests take turns on the engine's execution context. Written against the TensorRT
10/11 runtime API (the names are checked against 10.16 and 11.4 by ``tests/pipeline/test_tensorrt_api.py``); it has
not run here (no GPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from converters.errors import BuildError

if TYPE_CHECKING:
    import tensorrt as trt

    from pipeline.runtime.generation.layout import CacheLayout


class TrtCacheRunner:
    """One decoder step at a time on a TensorRT ``EngineRunner`` (``pipeline.runtime.tensorrt.runner``)."""

    def __init__(self, runner: Any, layout: CacheLayout, prompt: Any = None) -> None:
        self.runner = runner
        self.layout = layout
        #: a recurrent model's prompt graph's engine runner (the runs of several tokens, on the same buffers), or None
        self.prompt = prompt
        self.cache: list[torch.Tensor] = []
        #: the buffers the step writes: the cache's own (keys and values, in place), another for a recurrent state
        #: (swapped with the cache's after each step: the new state is computed from the old one over many layers)
        self.written: list[torch.Tensor] = []

    def start(self, batch: int) -> None:
        """Zeroed device buffers for ``batch`` rows, one per cache tensor."""
        device = self.runner.device
        self.cache = [
            torch.zeros((batch, *shape), dtype=dtype, device=device)
            for shape, dtype in zip(self.layout.shapes, self.layout.dtypes, strict=True)
        ]
        self.written = [
            b if same else torch.zeros_like(b) for b, same in zip(self.cache, self.layout.in_place, strict=True)
        ]

    def run(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, past_length: int
    ) -> torch.Tensor:
        """One step (a run of several tokens on the prompt graph's engine, when there is one); the cache buffers are
        read and written in place; the logits come back on the CPU."""
        runner = self.prompt if self.prompt is not None and input_ids.shape[1] > 1 else self.runner
        engine: trt.ICudaEngine = runner.engine
        context: trt.IExecutionContext = runner.context
        device = runner.device
        profile = 1 if input_ids.shape[1] == 1 and engine.num_optimization_profiles > 1 else 0
        # the engine's one context serves every request in turn; this request's cache is bound at each turn
        with runner.exclusive() as stream:
            runner.select_profile(profile, stream)
            feeds = {
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "position_ids": position_ids,
                "past_length": torch.tensor(past_length, dtype=torch.int64),
            }
            keep = [self._bind(runner, name, tensor.to(device).contiguous()) for name, tensor in feeds.items()]
            names = zip(self.layout.names, self.layout.present_names, self.cache, self.written, strict=True)
            for past, present, buffer, written in names:
                self._bind(runner, past, buffer)
                context.set_tensor_address(present, written.data_ptr())  # keys, values: the input's memory
            logits = torch.empty(
                tuple(context.get_tensor_shape("logits")), dtype=runner.dtypes["logits"], device=device
            )
            context.set_tensor_address("logits", logits.data_ptr())
            if not context.execute_async_v3(stream.cuda_stream):
                raise BuildError("TensorRT failed to run the decoder step", fix="see TensorRT's log above")
            del keep
            self.cache, self.written = self.written, self.cache  # the same buffers but a state's
            result = logits.float()
        return result.cpu()

    def reorder(self, rows: torch.Tensor) -> None:
        """The device buffers' rows moved in place (their addresses stay), on the engine's stream after its last
        step."""
        with self.runner.exclusive():  # torch's current stream, made to wait for the engine's work before
            index = rows.to(self.runner.device)
            for buffer in self.cache:  # a state's other buffer is written whole by the next step
                buffer.copy_(buffer.index_select(0, index))

    @staticmethod
    def _bind(runner: Any, name: str, tensor: torch.Tensor) -> torch.Tensor:
        context: trt.IExecutionContext = runner.context
        if name in runner.inputs:  # TensorRT drops inputs nothing reads
            context.set_input_shape(name, tuple(tensor.shape))
            context.set_tensor_address(name, tensor.data_ptr())
        return tensor
