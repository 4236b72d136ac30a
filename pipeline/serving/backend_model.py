"""The model a Triton Python-backend instance runs: one artifact, loaded with :func:`pipeline.load`.

Each model directory's ``model.py`` (written by :mod:`pipeline.serving.repository`) puts this environment's
packages on the stub's path and hands over to :func:`triton_model`. It imports the runtime only.

- A plain artifact answers every batch of requests with one call of its graph: the requests Triton's dynamic
  batcher gathered are concatenated on the batch dimension, run together and split again. Requests whose other
  dimensions differ run as separate calls. A request the module refuses (a size outside the converted range) gets
  that error alone; the others are answered.
- A generation artifact is decoupled: each request is a prompt (``input_ids``, optionally ``attention_mask``; an
  encoder-decoder's encoder inputs and optionally ``decoder_input_ids``; a vision-language model's prompt and image
  inputs such as ``pixel_values``, with its processor's per-token inputs: Kosmos-2's ``image_embeds_position_mask``,
  the cross-attention masks of a model whose text cross-attends to its images) and gets one response per step with
  the next token of every row, then an empty final response. The generate options
  (``max_new_tokens``, ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, ``seed``,
  ``eos_token_id``, ``pad_token_id``, ``max_length``, ``min_new_tokens``, ``min_length``, ``no_repeat_ngram_size``)
  are request parameters. Requests run on threads, each holding
  one of the module's request slots (its own cache) for its whole stream.

Tensors cross the stub through DLPack only (see :mod:`pipeline.serving.server` for why).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from converters.errors import PipelineError

logger = logging.getLogger(__name__)

#: request parameters a generation request may carry, and the type each is read as
GENERATE_OPTIONS: dict[str, Callable[[Any], Any]] = {
    "max_new_tokens": int,
    "max_length": int,
    "do_sample": bool,
    "temperature": float,
    "top_k": int,
    "top_p": float,
    "repetition_penalty": float,
    "seed": int,
    "eos_token_id": int,
    "pad_token_id": int,
    "min_new_tokens": int,
    "min_length": int,
    "no_repeat_ngram_size": int,
}
TOKENS_OUTPUT = "tokens"


def triton_model(args: dict[str, Any], pb_utils: Any) -> Any:
    """The served model for one instance (``args`` as Triton gives ``initialize``)."""
    from pipeline.runtime.generation.module import GenerativeModule
    from pipeline.runtime.generation.two_graphs import TwoGraphModule
    from pipeline.runtime.loading import load

    config = json.loads(args["model_config"])
    parameters = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
    threads = int(parameters["threads"]) if parameters.get("threads") else None
    spinning = parameters["spinning"] == "True" if parameters.get("spinning") else None
    module = load(parameters["artifact"], threads=threads, spinning=spinning)
    if isinstance(module, GenerativeModule | TwoGraphModule):
        return GenerationModel(module, pb_utils, tuple(entry["name"] for entry in config.get("input", ())))
    return GraphModel(module, pb_utils, batched=config.get("max_batch_size", 0) > 0)


def _tensor(pb_utils: Any, name: str, value: torch.Tensor) -> Any:
    return pb_utils.Tensor.from_dlpack(name, torch.utils.dlpack.to_dlpack(value.contiguous()))


def _error(pb_utils: Any, err: BaseException) -> Any:
    message = str(err) if isinstance(err, PipelineError) else f"{type(err).__name__}: {err}"
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


class GraphModel:
    """A plain artifact: each gathered batch of requests is one call of the graph where their shapes agree."""

    def __init__(self, module: Any, pb_utils: Any, *, batched: bool) -> None:
        self.module = module
        self.pb_utils = pb_utils
        self.batched = batched
        self.inputs = [spec.name for spec in module.io.inputs]
        self.outputs = [spec.name for spec in module.io.outputs]

    def _read(self, request: Any) -> list[torch.Tensor]:
        tensors = []
        for name in self.inputs:
            given = self.pb_utils.get_input_tensor_by_name(request, name)
            if given is None:  # Triton refuses a request without a declared input; kept for clarity
                raise PipelineError(f"request has no input {name!r}")
            tensors.append(torch.from_dlpack(given).clone())
        return tensors

    def execute(self, requests: list[Any]) -> list[Any]:
        """One response per request, in order."""
        responses: list[Any] = [None] * len(requests)
        groups: dict[tuple[Any, ...], list[tuple[int, list[torch.Tensor]]]] = {}
        for index, request in enumerate(requests):
            try:
                tensors = self._read(request)
            except Exception as err:  # noqa: BLE001 - the error goes to the client that sent it
                responses[index] = _error(self.pb_utils, err)
                continue
            key = tuple((t.dtype, tuple(t.shape[1:]) if self.batched else tuple(t.shape)) for t in tensors)
            groups.setdefault(key if self.batched else (index,), []).append((index, tensors))
        for members in groups.values():
            self._run_group(members, responses)
        return responses

    def _run_group(self, members: list[tuple[int, list[torch.Tensor]]], responses: list[Any]) -> None:
        if len(members) > 1:
            joined = [torch.cat(column) for column in zip(*(tensors for _, tensors in members), strict=True)]
            try:
                outputs = self.module.run_flat(joined)
            except Exception:  # noqa: BLE001 - one bad request must not fail the others: run them one by one
                for member in members:
                    self._run_group([member], responses)
                return
            sizes = [tensors[0].shape[0] for _, tensors in members]
            parts = [torch.split(output, sizes) for output in outputs]
            for position, (index, _) in enumerate(members):
                responses[index] = self._response([part[position] for part in parts])
            return
        index, tensors = members[0]
        try:
            responses[index] = self._response(self.module.run_flat(tensors))
        except Exception as err:  # noqa: BLE001 - the error goes to the client that sent it
            responses[index] = _error(self.pb_utils, err)

    def _response(self, outputs: list[torch.Tensor]) -> Any:
        tensors = [_tensor(self.pb_utils, name, value) for name, value in zip(self.outputs, outputs, strict=True)]
        return self.pb_utils.InferenceResponse(output_tensors=tensors)

    def finalize(self) -> None:
        """Nothing to release beyond the module."""


class GenerationModel:
    """A generation artifact in decoupled mode: each request streams its tokens from a thread of its own."""

    def __init__(self, module: Any, pb_utils: Any, inputs: tuple[str, ...] = ("input_ids", "attention_mask")) -> None:
        self.module = module
        self.pb_utils = pb_utils
        self.inputs = inputs  # the request's tensors (the first required), passed to stream() by name
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def execute(self, requests: list[Any]) -> None:
        """Start one stream per request; responses go through each request's sender."""
        for request in requests:
            thread = threading.Thread(target=self._stream, args=(request,), name="triton-generate", daemon=True)
            with self._lock:
                self._threads.add(thread)
            thread.start()

    def _stream(self, request: Any) -> None:
        sender = request.get_response_sender()
        final = self.pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            tensors, options = self._request(request)
            for token in self.module.stream(**tensors, **options):
                tokens = token.reshape(-1, 1).to(torch.int64)
                sender.send(
                    self.pb_utils.InferenceResponse(output_tensors=[_tensor(self.pb_utils, TOKENS_OUTPUT, tokens)])
                )
            sender.send(flags=final)
        except Exception as err:  # noqa: BLE001 - the error goes to the client that sent it
            logger.info("generation request failed: %s", err)
            sender.send(_error(self.pb_utils, err), flags=final)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _request(self, request: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The request's tensors by name (the optional ones it holds) and its generate options."""
        tensors = {}
        for name in self.inputs:
            given = self.pb_utils.get_input_tensor_by_name(request, name)
            if given is not None:
                tensors[name] = torch.from_dlpack(given).clone()
        options = request_options(request.parameters())
        return tensors, options

    def finalize(self) -> None:
        """Let running streams end (the server waits for them on shutdown)."""
        with self._lock:
            running = list(self._threads)
        for thread in running:
            thread.join(timeout=30)


def request_options(parameters: str | dict[str, Any]) -> dict[str, Any]:
    """The generate options of a request's parameters (JSON text, as the Python backend gives them)."""
    given = json.loads(parameters) if isinstance(parameters, str) else dict(parameters)
    unknown = sorted(set(given) - set(GENERATE_OPTIONS))
    if unknown:
        raise PipelineError(
            f"unknown generate option(s) {', '.join(unknown)} in the request parameters",
            fix=f"the options served are {', '.join(GENERATE_OPTIONS)}",
        )
    options = {}
    for key, value in given.items():
        try:
            options[key] = _parse(GENERATE_OPTIONS[key], value)
        except (TypeError, ValueError) as err:
            raise PipelineError(f"generate option {key}={value!r} is not a {GENERATE_OPTIONS[key].__name__}") from err
    return options


def _parse(kind: Callable[[Any], Any], value: Any) -> Any:
    if kind is bool and isinstance(value, str):
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(value)
        return value.lower() in ("true", "1")
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    return kind(value)
