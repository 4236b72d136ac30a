"""A converted decoder whose text cross-attends to its images (Mllama, IDEFICS): the image graph run once per request,
then the cached text step, with ``generate()`` as transformers' ``model.generate``.

The image graph gives the cross states (the cross-attention layers' keys and values, and any other image state the
model's decode steps take); the request holds them, repeated for each prompt's beams or drawn sequences, and every
text step reads them. The prompts are prefilled once each, then their cache rows are repeated (as the vision-language
module's). The per-token image masks (which images each token sees) follow transformers' ``generate``: a prompt's
rows padded up to its length with its last row, and every new token's row the last row again. The decoding loop,
options, processors and beam search are the decoder-only module's; only the feed differs. On ONNX Runtime the cache
stays in bound buffers written in place; on a TensorRT engine the feed copies it in and out of each step.

Saved as an encoder-decoder directory (``encoder.ptrt``: the image graph, ``decoder.ptrt``: the step);
``pipeline.load`` reads it back as this module: its step takes a prompt (the decoder-only step's inputs).
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from converters.errors import ArtifactError, InputError
from pipeline.runtime.generation.layout import STEP_INPUTS, cache_layout, past_name, present_name
from pipeline.runtime.generation.options import GenerateOptions, generate_options
from pipeline.runtime.generation.request import Decoding, check_room, resolve
from pipeline.runtime.generation.runners import CopiedNames, RowsOfTwoCaches, bound_runner
from pipeline.runtime.generation.saved_directory import save_directory
from pipeline.runtime.generation.source_and_step import DECODER_FILE, ENCODER_FILE, decode, generate_over
from pipeline.runtime.generation.two_graphs import TwoGraphModule
from pipeline.runtime.module import ConvertedModule

#: The key of the step's generation ``model_options`` that says how the model's ``generate`` prepares a prompt before
#: it hands it to its text decoder's (BLIP's): ``(dropped, ((column, token), ...))``, the tokens (and mask columns)
#: dropped from the prompt's end, then the columns it writes a token of its own into (:func:`edited_prompt`).
PROMPT_EDIT = "prompt_edit"


def prefix_name(layer: int, kind: str) -> str:
    """The image graph's output of the image positions a model caches before its prompt (GIT's), in self-attention
    layer ``layer``'s cache: ``prefix.{layer}.key`` or ``.value`` [batch, heads, image positions, dim]."""
    return f"prefix.{layer}.{kind}"


def edited_prompt(ids: torch.Tensor, mask: torch.Tensor, edit: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts [batch, tokens] and their mask as the model's ``generate`` hands them to its text decoder's
    (:data:`PROMPT_EDIT`): its sequences start with them."""
    dropped, written = int(edit[0]), tuple(edit[1])
    if ids.shape[1] <= dropped:
        raise InputError(
            f"a prompt of {ids.shape[1]} tokens, but the model's generate drops its last {dropped} before decoding",
            fix="pass the processor's output for the prompt (its trailing separator included)",
        )
    ids, mask = ids[:, : ids.shape[1] - dropped].clone(), mask[:, : mask.shape[1] - dropped]
    for column, token in written:
        if int(column) < ids.shape[1]:
            ids[:, int(column)] = int(token)
    return ids, mask


def per_token_rows(mask: torch.Tensor, tokens: int) -> torch.Tensor:
    """A per-token image mask [batch, rows, ...] for ``tokens`` tokens, as transformers' ``generate`` prepares it for
    the prefill: padded at the end with its last row when it has fewer rows, its last ``tokens`` rows taken."""
    rows = mask.shape[1]
    if rows < tokens:
        mask = torch.cat([mask, mask[:, -1:].expand(-1, tokens - rows, *mask.shape[2:])], dim=1)
    return mask[:, -tokens:]


class CrossImagesModule(TwoGraphModule):
    """A decoder whose text cross-attends to its images, converted for generation (``pipeline.convert(mllama,
    {"input_ids": ..., "attention_mask": ..., "pixel_values": ..., ...}, generation={...})``).

    ``generate(input_ids, attention_mask=..., pixel_values=..., <the image graph's other inputs>, <per-token image
    masks>, **options)`` returns the prompts followed by the new tokens, as ``model.generate`` does; :meth:`stream`
    yields the new tokens. ``.encoder`` is the image graph, ``.decoder`` the text step.

    >>> module.generate(ids, attention_mask=mask, pixel_values=pixels, aspect_ratio_ids=ratios,
    ...                 aspect_ratio_mask=tiles, cross_attention_mask=seen, max_new_tokens=32)  # doctest: +SKIP
    """

    def __init__(self, encoder: ConvertedModule, decoder: ConvertedModule) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        generation = decoder.settings.generation
        step_inputs = tuple(spec.name for spec in decoder.io.inputs)
        outputs = tuple(spec.name for spec in encoder.io.outputs)
        layers = generation.layers if generation is not None else 0
        prefix = tuple(prefix_name(i, kind) for i in range(layers) for kind in ("key", "value"))
        #: the image positions the step's cache holds before the prompt (GIT's), written into it before the prefill
        self._prefix = prefix if set(prefix) <= set(outputs) else ()
        states = tuple(name for name in outputs if name not in self._prefix)
        if generation is None or not set(STEP_INPUTS) <= set(step_inputs) or not set(states) <= set(step_inputs):
            raise ArtifactError(
                "the step of a cross-attended image model must be a text step converted with generation= that takes "
                "every output of its image graph",
                fix="load a directory written by CrossImagesModule.save",
            )
        self._image_inputs = tuple(spec.name for spec in encoder.io.inputs)
        options = dict(generation.model_options)
        #: how the model's generate prepares a prompt (:data:`PROMPT_EDIT`), None: as it is given
        self._prompt_edit = options.pop(PROMPT_EDIT, None)
        self._model_options = tuple(options.items())
        self._states = states
        self._step_inputs = step_inputs
        self._layer_names = tuple(past_name(i, k) for i in range(generation.layers) for k in ("key", "value"))
        self._presents = tuple(present_name(i, k) for i in range(generation.layers) for k in ("key", "value"))
        taken = {*STEP_INPUTS, *self._layer_names, *states}
        self._per_token = tuple(name for name in step_inputs if name not in taken)
        self._specs = {spec.name: spec for spec in decoder.io.inputs}
        self._cache_shapes = [tuple(int(d) for d in self._specs[name].shape[1:]) for name in self._layer_names]
        self._cache_dtypes = [self._specs[name].torch_dtype for name in self._layer_names]
        logits = next(spec for spec in decoder.io.outputs if spec.name == "logits")
        self._vocabulary = int(logits.shape[-1]) if logits.shape and isinstance(logits.shape[-1], int) else None

    def step_graph(self) -> ConvertedModule:
        """The text step (the image graph's settings, report and engine: ``module.encoder``'s)."""
        return self.decoder

    @property
    def dropped_prompt_tokens(self) -> int:
        """How many trailing tokens of each prompt the model's ``generate`` drops before decoding (BLIP's
        separator, :data:`PROMPT_EDIT`): the sequences :meth:`generate` returns start with prompts that much shorter
        than the ``input_ids`` given."""
        return int(self._prompt_edit[0]) if self._prompt_edit is not None else 0

    def generate(self, input_ids: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | Any:
        """The prompts followed by the new tokens [rows, prompt + new] (rows: prompts x ``num_return_sequences``), as
        transformers' ``model.generate``: ``input_ids``, ``attention_mask`` (left padding), the image graph's inputs
        by name, the per-token image masks (left out: every token sees every image), and the options of the
        decoder-only module's ``generate`` (beam search included)."""
        ids, mask, images, masks, options = self._split_prompt(input_ids, kwargs)
        request = generate_options("generate", options, self._model_options)
        with self._request_slots().hold():  # this request's own cache, until its last token
            feed, decoding = self._prompt_request(ids, mask, images, masks, request)
            return generate_over(feed, decoding, request, encoder_decoder=False)

    def stream(self, input_ids: torch.Tensor | None = None, **kwargs: Any) -> Generator[torch.Tensor, None, None]:
        """Yield the next token of every row [rows] at each step (see :meth:`generate` for the inputs; the options
        of the decoder-only module's ``stream``)."""
        ids, mask, images, masks, options = self._split_prompt(input_ids, kwargs)
        request = generate_options("stream", options, self._model_options)
        with self._request_slots().hold():
            feed, decoding = self._prompt_request(ids, mask, images, masks, request)
            yield from decode(feed, decoding)

    def save(self, path: str | Path) -> Path:
        """Write ``path/encoder.ptrt`` (the image graph) and ``path/decoder.ptrt`` (the step), atomically: an
        encoder-decoder's directory, which ``pipeline.load`` reads back as this module."""

        def write(staging: Path) -> None:
            self.encoder.save(staging / ENCODER_FILE)
            self.decoder.save(staging / DECODER_FILE)

        return save_directory(path, (ENCODER_FILE, DECODER_FILE), write, "a cross-attended image model")

    # the request

    def _split_prompt(
        self, input_ids: torch.Tensor | None, kwargs: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
        from pipeline.runtime.generation.module import checked_prompt

        options = dict(kwargs)
        given = options.pop("input_ids", None)
        if input_ids is not None and given is not None:
            raise InputError("input_ids given twice (positionally and by name)", fix="pass input_ids once")
        ids = input_ids if input_ids is not None else given
        if ids is None:
            raise InputError("generate needs input_ids (the prompts)", fix="pass module.generate(input_ids, ...)")
        mask = options.pop("attention_mask", None)
        images = {name: options.pop(name) for name in self._image_inputs if name in options}
        missing = [name for name in self._image_inputs if name not in images]
        if missing:
            raise InputError(
                f"generate needs the image inputs {', '.join(missing)} (the image graph's), as the processor gives "
                "them",
                fix=f"pass module.generate(input_ids, attention_mask=..., {missing[0]}=...) as to model.generate",
            )
        masks = {name: options.pop(name) for name in self._per_token if options.get(name) is not None}
        options = {name: value for name, value in options.items() if name not in self._per_token}
        prompt, prompt_mask = checked_prompt(ids, mask, self._vocabulary, "processor")
        if self._prompt_edit is not None:
            prompt, prompt_mask = edited_prompt(prompt, prompt_mask, self._prompt_edit)
        for name, value in masks.items():
            value = torch.as_tensor(value).cpu()
            expected = self._specs[name].shape[2:]
            if value.dim() != len(self._specs[name].shape) or value.shape[0] != prompt.shape[0]:
                raise InputError(
                    f"{name} is {list(value.shape)}: one row per prompt and token [{prompt.shape[0]}, tokens, "
                    f"{', '.join(map(str, expected))}] expected",
                    fix=f"pass the processor's {name} with its input_ids",
                )
            masks[name] = value.to(self._specs[name].torch_dtype)
        for name in self._per_token:
            if name not in masks:  # every token sees every image, as the model without the mask
                shape = [int(d) if isinstance(d, int) else 1 for d in self._specs[name].shape[2:]]
                masks[name] = torch.ones(prompt.shape[0], 1, *shape, dtype=self._specs[name].torch_dtype)
        return prompt, prompt_mask, images, masks, options

    def _prompt_request(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        images: dict[str, torch.Tensor],
        masks: dict[str, torch.Tensor],
        request: GenerateOptions,
    ) -> tuple[_PromptFeed, Decoding]:
        generation = self.generation
        rows, prompt = ids.shape
        if rows * request.expand > generation.max_batch:
            raise InputError(
                f"a batch of {rows} x {request.expand} rows, but the step was converted for max_batch="
                f"{generation.max_batch}",
                fix=f"split the batch, or convert with generation={{'max_batch': {rows * request.expand}, ...}}",
            )
        longest = generation.max_prompt or generation.max_length
        if prompt > longest:
            raise InputError(
                f"a prompt of {prompt} tokens, but the step prefills at most max_prompt={longest} in one run",
                fix=f"convert with generation={{'max_prompt': {prompt}, ...}} or more",
            )
        states = self._encode_images(images, rows)
        expanded = ids.repeat_interleave(request.expand, dim=0)
        decoding = resolve(
            request, generation, expanded, mask.repeat_interleave(request.expand, dim=0), self._vocabulary
        )
        feed = _PromptFeed(self, ids, mask, states, masks, request.expand)
        room = feed.capacity - feed.start - prompt  # image positions before the prompt (GIT's) take room too
        if decoding.new > room:
            raise InputError(
                f"a prompt of {prompt} tokens after {feed.start} image positions plus {decoding.new} new ones exceeds "
                f"the cache capacity max_length={feed.capacity}",
                fix=f"pass max_new_tokens <= {room}, or convert with generation={{'max_length': "
                f"{feed.start + prompt + decoding.new}, ...}}",
            )
        return feed, decoding

    def _encode_images(self, images: dict[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
        """The image graph on the request's images: the cross states, in the step's dtypes."""
        specs = {spec.name: spec for spec in self.encoder.io.inputs}
        values = []
        for name in self._image_inputs:
            value = images[name]
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != rows:
                raise InputError(
                    f"{name} must be a tensor with one leading row per prompt ({rows})",
                    fix=f"pass the processor's {name} for the same prompts",
                )
            expected = specs[name].shape
            fixed = [(i, d) for i, d in enumerate(expected) if isinstance(d, int) and i > 0]
            if len(expected) != value.dim() or any(value.shape[i] != d for i, d in fixed):
                raise InputError(
                    f"{name} is {list(value.shape)}, but the image graph takes {list(expected)} (the sample's images, "
                    "tiles and sizes)",
                    fix="pass images processed as the sample's were, or convert with a sample of this layout",
                )
            values.append(value.cpu().to(specs[name].torch_dtype))
        outputs = self.encoder.run_flat(values)
        names = [spec.name for spec in self.encoder.io.outputs]
        dtypes = {**dict(zip(self._prefix, self._cache_dtypes[: len(self._prefix)], strict=True))}
        dtypes.update({name: self._specs[name].torch_dtype for name in self._states})
        return {name: value.to(dtypes[name]).contiguous() for name, value in zip(names, outputs, strict=True)}


def _repeated(value: torch.Tensor, expand: int) -> torch.Tensor:
    """``value``'s row of each prompt repeated ``expand`` times (its beams or drawn sequences)."""
    return value if expand == 1 else value.repeat_interleave(expand, dim=0).contiguous()


class _PromptFeed(RowsOfTwoCaches):
    """One request's text steps: ``prefill()`` the prompts with their cross states (each prompt once, its cache row
    then repeated ``expand`` times), then ``step(tokens)``; ``reorder(rows)`` moves the cache rows (beam search)."""

    def __init__(
        self,
        module: CrossImagesModule,
        ids: torch.Tensor,
        mask: torch.Tensor,
        states: dict[str, torch.Tensor],
        masks: dict[str, torch.Tensor],
        expand: int,
    ) -> None:
        self.module = module
        prompts, self.prompt = ids.shape
        self.prompts, self.expand = ids, expand
        self.ids = ids.repeat_interleave(expand, dim=0)
        rows = self.ids.shape[0]
        self.capacity = module._cache_shapes[0][1]
        #: the image positions the cache holds before the prompt (GIT's), each layer's keys and values
        self.firsts = [states.pop(name) for name in module._prefix]
        self.start = int(self.firsts[0].shape[-2]) if self.firsts else 0
        if self.start + self.prompt >= self.capacity:
            raise InputError(
                f"a prompt of {self.prompt} tokens after {self.start} image positions, but the step's cache holds "
                f"{self.capacity}",
                fix=f"convert with generation={{'max_length': {self.start + self.prompt + 1}, ...}} or more",
            )
        self.prompt_mask = torch.zeros(prompts, self.capacity, dtype=torch.int64)
        self.prompt_mask[:, : self.start] = 1
        self.prompt_mask[:, self.start : self.start + self.prompt] = mask
        self.mask = self.prompt_mask.repeat_interleave(expand, dim=0)
        self.positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        self.next_position = (self.positions[:, -1:] + 1).repeat_interleave(expand, dim=0)
        #: the prefill's inputs besides the tokens (one row per prompt), and every decode step's (one per row)
        self.first = {**states, **{name: per_token_rows(value, self.prompt) for name, value in masks.items()}}
        self.then = {name: _repeated(value, expand) for name, value in states.items()}
        self.then.update({name: _repeated(value[:, -1:], expand) for name, value in masks.items()})
        self.length = self.start
        self.cache: list[torch.Tensor] = []
        #: on ONNX Runtime the cache stays in bound buffers written in place (a decode step's states bound once); a
        #: cache that starts with image positions is copied in and out (its prefill runs after them)
        layout = cache_layout(module.decoder.io, module.generation.layers)
        self.runner = None if self.firsts else bound_runner(module.decoder.executor, layout)
        if self.runner is not None:
            self.runner.start(rows)
            self.held = {name: np.ascontiguousarray(value.numpy()) for name, value in self.then.items()}

    def prefill(self) -> torch.Tensor:
        """The prompts with their cross states through the step; the logits after their last token."""
        prompts = self.prompts.shape[0]
        if self.runner is not None:
            extra = {name: value.contiguous().numpy() for name, value in self.first.items()}
            logits = self.runner.prefill_leading(self.prompts, self.prompt_mask, self.positions, extra).float()
            self.length += self.prompt
        else:
            self.cache = [
                torch.zeros((prompts, *shape), dtype=dtype)
                for shape, dtype in zip(self.module._cache_shapes, self.module._cache_dtypes, strict=True)
            ]
            for tensor, first in zip(self.cache, self.firsts, strict=False):
                tensor[:, :, : self.start] = first
            logits = self._run(self.prompts, self.prompt_mask, self.positions, self.first)
        if self.expand > 1:
            self.reorder(torch.arange(prompts).repeat_interleave(self.expand))
            logits = logits.repeat_interleave(self.expand, dim=0)
        return logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One new token per row [rows]."""
        check_room(self.length, self.capacity)
        self.mask[:, self.length] = 1
        if self.runner is not None:
            logits = self.runner.run(tokens[:, None], self.mask, self.next_position, self.length, self.held).float()
            self.length += 1
        else:
            logits = self._run(tokens[:, None], self.mask, self.next_position, self.then)
        self.next_position = self.next_position + 1
        return logits

    def _run(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, extra: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        module = self.module
        named = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **extra}
        names = CopiedNames(module._step_inputs, module._layer_names, module._presents)
        return self.copied_step(module.decoder, names, named)
