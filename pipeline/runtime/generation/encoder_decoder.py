"""A converted encoder-decoder (T5, BART, Marian, Whisper, ...): the encoder graph run once per request, then the
cached decoder step, with ``generate()`` as transformers' ``model.generate``.

The encoder graph gives every decoder layer's cross-attention keys and values; the request holds them (repeated for
each prompt's beams or drawn sequences) beside its self-attention cache, and every decoder step reads them. The
decoding loop, the options, the processors and beam search are the decoder-only module's
(:mod:`pipeline.runtime.generation.module`); only the feed differs: the decoder starts from
``decoder_start_token_id`` (or the caller's ``decoder_input_ids``), its positions are the cache's length, and the
encoder's padding is the cross-attention mask.

Saved as a directory (``module.save("out/t5")``): ``encoder.ptrt`` and ``decoder.ptrt``, each a whole artifact;
``pipeline.load("out/t5")`` reads both.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from converters.errors import ArtifactError, InputError
from pipeline.runtime.generation.cross_images import CrossImagesModule
from pipeline.runtime.generation.layout import STEP_INPUTS, cache_layout, cross_name, past_name, present_name
from pipeline.runtime.generation.options import GenerateOptions, generate_options
from pipeline.runtime.generation.request import Decoding, check_room, resolve
from pipeline.runtime.generation.runners import CopiedNames, RowsOfTwoCaches, bound_runner
from pipeline.runtime.generation.saved_directory import save_directory
from pipeline.runtime.generation.source_and_step import (
    DECODER_FILE,
    ENCODER_FILE,
    FIRST_STEP_FILE,
    decode,
    generate_over,
)
from pipeline.runtime.generation.two_graphs import TwoGraphModule
from pipeline.runtime.module import ConvertedModule

#: The step's input holding the encoder's padding mask [batch, source] (1: a token, 0: padding).
ENCODER_MASK = "encoder_attention_mask"


def cross_names(layers: int) -> tuple[str, ...]:
    """``cross.{i}.key``, ``cross.{i}.value`` of every layer, in order."""
    return tuple(cross_name(i, kind) for i in range(layers) for kind in ("key", "value"))


class EncoderDecoderModule(TwoGraphModule):
    """An encoder-decoder converted for generation (``pipeline.convert(model, inputs, generation={...})`` of a
    transformers ``*ForConditionalGeneration``).

    ``generate(input_ids, attention_mask=..., **options)`` (or ``input_features=`` for Whisper) returns the decoder's
    sequences, starting with its start token, as ``model.generate`` does; :meth:`stream` yields the new tokens.
    ``.encoder`` and ``.decoder`` are the two converted graphs; ``.first_step``, where the model's decoder decides in
    Python on its cache's length (its first step takes another branch than the later ones: ProphetNet's), the graph
    of the first decoder step (an empty cache), else None.

    >>> module.generate(input_ids, attention_mask=mask, num_beams=4, max_new_tokens=32)  # doctest: +SKIP
    """

    def __new__(
        cls, encoder: ConvertedModule, decoder: ConvertedModule, first_step: ConvertedModule | None = None
    ) -> Any:
        """An encoder graph and a step that prefills a prompt (it takes the decoder-only step's inputs) are a model
        whose text cross-attends to its images: a :class:`~pipeline.runtime.generation.cross_images.CrossImagesModule`
        is made instead (a saved directory of either kind holds the same two files)."""
        if set(STEP_INPUTS) <= {spec.name for spec in decoder.io.inputs}:
            return CrossImagesModule(encoder, decoder)
        return super().__new__(cls)

    def __init__(
        self, encoder: ConvertedModule, decoder: ConvertedModule, first_step: ConvertedModule | None = None
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        #: the first decoder step's graph, where it differs from the step's (see the class doc)
        self.first_step = first_step
        generation = decoder.settings.generation
        if generation is None or generation.kind != "encoder-decoder":
            raise ArtifactError(
                "the decoder of an encoder-decoder module must be a step converted with generation= of an "
                "encoder-decoder model",
                fix="load a directory written by EncoderDecoderModule.save",
            )
        self._encoder_inputs = tuple(spec.name for spec in encoder.io.inputs)
        self._step_inputs = tuple(spec.name for spec in decoder.io.inputs)
        self._layer_names = tuple(past_name(i, k) for i in range(generation.layers) for k in ("key", "value"))
        self._presents = tuple(present_name(i, k) for i in range(generation.layers) for k in ("key", "value"))
        specs = {spec.name: spec for spec in decoder.io.inputs}
        self._cache_shapes = [tuple(int(d) for d in specs[name].shape[1:]) for name in self._layer_names]
        self._cache_dtypes = [specs[name].torch_dtype for name in self._layer_names]
        logits = next(spec for spec in decoder.io.outputs if spec.name == "logits")
        self._vocabulary = int(logits.shape[-1]) if logits.shape and isinstance(logits.shape[-1], int) else None

    def step_graph(self) -> ConvertedModule:
        """The decoder step (the encoder's settings, report and engine: ``module.encoder``'s)."""
        return self.decoder

    def generate(self, inputs: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | Any:
        """The decoder's sequences [rows, start + new] (rows: prompts x ``num_return_sequences``), as transformers'
        ``model.generate``: the encoder's inputs by name (``input_ids``/``attention_mask``, ``input_features``; the
        first positionally), ``decoder_input_ids`` to start the decoder from (the start token is put first when
        missing), and the options of the decoder-only module's ``generate`` (beam search included). The model's own
        generation config (forced and suppressed tokens, ...) applies under the options given."""
        encoder_inputs, decoder_ids, options = self._split(inputs, kwargs)
        request = generate_options("generate", options, self.generation.model_options)
        with self._request_slots().hold():  # this request's own cache, until its last token
            feed, decoding = self._request(encoder_inputs, decoder_ids, request)
            return generate_over(feed, decoding, request, encoder_decoder=True)

    def stream(self, inputs: torch.Tensor | None = None, **kwargs: Any) -> Generator[torch.Tensor, None, None]:
        """Yield the next token of every row [rows] at each step (see :meth:`generate` for the inputs; the options
        of the decoder-only module's ``stream``)."""
        encoder_inputs, decoder_ids, options = self._split(inputs, kwargs)
        request = generate_options("stream", options, self.generation.model_options)
        with self._request_slots().hold():
            feed, decoding = self._request(encoder_inputs, decoder_ids, request)
            yield from decode(feed, decoding)

    def save(self, path: str | Path) -> Path:
        """Write ``path/encoder.ptrt`` and ``path/decoder.ptrt`` (and ``path/first_step.ptrt`` when the first step
        has a graph of its own), atomically (:func:`save_directory`)."""

        def write(staging: Path) -> None:
            self.encoder.save(staging / ENCODER_FILE)
            self.decoder.save(staging / DECODER_FILE)
            if self.first_step is not None:
                self.first_step.save(staging / FIRST_STEP_FILE)

        files = (ENCODER_FILE, DECODER_FILE, FIRST_STEP_FILE)
        return save_directory(path, files, write, "an encoder-decoder")

    # the request

    def _split(
        self, inputs: torch.Tensor | None, kwargs: dict[str, Any]
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None, dict[str, Any]]:
        options = dict(kwargs)
        given = {name: options.pop(name) for name in self._encoder_inputs if name in options}
        main = self._encoder_inputs[0]
        if inputs is not None:
            if main in given:
                raise InputError(f"{main} given twice (positionally and by name)", fix=f"pass {main} once")
            given[main] = inputs
        if main not in given:
            raise InputError(
                f"generate needs the encoder's {main}", fix=f"pass module.generate({main}, ...) as to model.generate"
            )
        decoder_ids = options.pop("decoder_input_ids", None)
        decoder_mask = options.pop("decoder_attention_mask", None)
        if decoder_mask is not None and not bool((torch.as_tensor(decoder_mask) != 0).all()):
            raise InputError(
                "decoder_attention_mask masks tokens of the decoder's prompt: the step decodes every row's prompt "
                "whole (its decoder mask is all ones, as transformers builds it when none is given)",
                fix="pass decoder prompts without padding (rows of one length, or one request per prompt), and no "
                "decoder_attention_mask",
            )
        return given, decoder_ids, options

    def _request(
        self, given: dict[str, torch.Tensor], decoder_ids: torch.Tensor | None, request: GenerateOptions
    ) -> tuple[_Feed, Decoding]:
        generation = self.generation
        rows = given[self._encoder_inputs[0]].shape[0]
        if rows * request.expand > generation.max_batch:
            raise InputError(
                f"a batch of {rows} x {request.expand} rows, but the step was converted for max_batch="
                f"{generation.max_batch}",
                fix=f"split the batch, or convert with generation={{'max_batch': {rows * request.expand}, ...}}",
            )
        encoded = self._encode(given)
        ids = self._decoder_prompt(decoder_ids, rows)
        ids = ids.repeat_interleave(request.expand, dim=0)
        states = encoded  # one row per prompt: the encoder's outputs as they are (37 MB for Whisper-base: no copy)
        if request.expand > 1:
            states = {name: value.repeat_interleave(request.expand, dim=0) for name, value in encoded.items()}
        decoding = resolve(request, generation, ids, torch.ones_like(ids), self._vocabulary)
        return _Feed(self, ids, states), decoding

    def _encode(self, given: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The encoder graph on the request's inputs: the cross keys and values and the encoder's mask."""
        specs = {spec.name: spec for spec in self.encoder.io.inputs}
        inputs = []
        for name in self._encoder_inputs:
            value = given.get(name)
            if value is None and name == "attention_mask":
                main = given[self._encoder_inputs[0]]
                value = torch.ones(main.shape[:2], dtype=torch.int64)
            if value is None:
                raise InputError(f"the encoder takes {name}", fix=f"pass {name}=... as to model.generate")
            inputs.append(value.cpu().to(specs[name].torch_dtype))
        outputs = dict(zip((o.name for o in self.encoder.io.outputs), self.encoder.run_flat(inputs), strict=True))
        cross = {name: outputs[name] for name in cross_names(self.generation.layers)}
        source = cross[cross_name(0, "key")].shape[-2]
        if ENCODER_MASK in outputs:  # the encoder's own mask over its states (an artifact before it had none)
            return {ENCODER_MASK: outputs[ENCODER_MASK].cpu().to(torch.int64), **cross}
        mask = given.get("attention_mask")
        if mask is not None and mask.shape[-1] != source:
            if not bool((mask != 0).all()):
                # a speech encoder that shortens its input (its mask over frames, its states fewer): the mask over
                # the states is computed inside the model and is not an output of the encoder graph
                raise InputError(
                    f"attention_mask masks some of the encoder's {mask.shape[-1]} input positions, but the encoder "
                    f"returns {source} states: the mask over its states is the model's own, which the converted "
                    "encoder does not return",
                    fix="pass unpadded inputs (one request per input, or inputs of one length) with an attention_mask "
                    "of ones or none",
                )
            mask = None
        if mask is None:
            mask = torch.ones(inputs[0].shape[0], source, dtype=torch.int64)
        return {ENCODER_MASK: mask.cpu().to(torch.int64), **cross}

    def _decoder_prompt(self, decoder_ids: torch.Tensor | None, rows: int) -> torch.Tensor:
        start = self.generation.decoder_start_token_id
        assert start is not None
        first = torch.full((rows, 1), start, dtype=torch.int64)
        if decoder_ids is None:
            return first
        if not isinstance(decoder_ids, torch.Tensor) or decoder_ids.dim() != 2 or decoder_ids.shape[0] != rows:
            raise InputError(
                f"decoder_input_ids must be a tensor [{rows}, tokens] (one row per prompt)",
                fix="pass the decoder's prompt ids, one row per encoder input",
            )
        ids = decoder_ids.cpu().to(torch.int64)
        if bool((ids[:, 0] != start).any()):  # transformers puts the start token first when it is missing
            ids = torch.cat([first, ids], dim=1)
        return ids


class _Feed(RowsOfTwoCaches):
    """One request's decoder steps: ``prefill()`` the decoder's prompt (token by token: the step takes one), then
    ``step(tokens)``; ``reorder(rows)`` moves the self-attention cache rows (the cross states are the same for every
    beam of a prompt, and beams only move within their prompt)."""

    def __init__(self, module: EncoderDecoderModule, ids: torch.Tensor, states: dict[str, torch.Tensor]) -> None:
        self.module = module
        self.ids = ids
        self.states = states
        rows = ids.shape[0]
        self.length = 0
        self.capacity = module._cache_shapes[0][1]
        #: on ONNX Runtime the cache stays in bound buffers written in place (the cross states bound once)
        self.runner = bound_runner(module.decoder.executor, cache_layout(module.decoder.io, module.generation.layers))
        self.cache: list[torch.Tensor] = []
        if self.runner is not None:
            self.runner.start(rows)
            self.held = {name: value.contiguous().numpy() for name, value in states.items()}
        else:
            self.cache = [
                torch.zeros((rows, *shape), dtype=dtype)
                for shape, dtype in zip(module._cache_shapes, module._cache_dtypes, strict=True)
            ]

    def prefill(self) -> torch.Tensor:
        """The decoder's prompt through the step; the logits after its last token."""
        logits = torch.empty(0)
        for position in range(self.ids.shape[1]):
            logits = self._run(self.ids[:, position : position + 1])
        return logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One new token per row [rows]."""
        return self._run(tokens[:, None])

    def _run(self, ids: torch.Tensor) -> torch.Tensor:
        check_room(self.length, self.capacity, "the decoder's cache")
        if self.length == 0 and self.module.first_step is not None:
            return self._first(ids)
        if self.runner is not None:
            logits = self.runner.run(ids, None, None, self.length, self.held)
            self.length += 1
            return logits.float()
        module = self.module
        named = {
            "input_ids": ids,
            "past_length": torch.tensor(self.length, dtype=torch.int64),
            **self.states,
            **dict(zip(module._layer_names, self.cache, strict=True)),
        }
        outputs = module.decoder.executor.run([named[name] for name in module._step_inputs])
        by_name = dict(zip((o.name for o in module.decoder.io.outputs), outputs, strict=True))
        self.cache = [by_name[name] for name in module._presents]
        self.length += 1
        return by_name["logits"].float()

    def _first(self, ids: torch.Tensor) -> torch.Tensor:
        """The first decoder step on its own graph over an empty cache; the cache it writes goes where the step's
        graph reads it (the bound buffers on ONNX Runtime)."""
        module = self.module
        graph = module.first_step
        assert graph is not None
        rows = ids.shape[0]
        self.cache = [
            torch.zeros((rows, *shape), dtype=dtype)
            for shape, dtype in zip(module._cache_shapes, module._cache_dtypes, strict=True)
        ]
        names = CopiedNames(tuple(spec.name for spec in graph.io.inputs), module._layer_names, module._presents)
        logits = self.copied_step(graph, names, {"input_ids": ids, **self.states})
        if self.runner is not None:  # the step reads the buffers bound to its session
            for array, written in zip(self.runner.read_arrays, self.cache, strict=True):
                np.copyto(array, written.numpy())
            self.cache = []
        return logits
