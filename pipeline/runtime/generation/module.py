"""The converted decoder step with ``generate()``: the decoding loop, plain Python around one step.

The same loop serves every backend: the executor's runner (:mod:`pipeline.runtime.generation.runners`) holds the cache,
the loop holds the tokens, the attention mask and the positions. A prompt longer than the context profile
(``max_prompt``) is prefilled in chunks. The positions follow transformers (``cumsum(attention_mask) - 1``), so a
left-padded batch decodes as ``model.generate`` does.

Requests are independent: ``generate`` from many threads at once, and ``stream()`` generators advanced in any order,
each decode over a cache of their own (:mod:`pipeline.runtime.generation.slots`; at most ``request_slots`` at once).
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator
from typing import Any

import torch

from converters.errors import InputError
from converters.settings import GenerationSettings
from pipeline.runtime.generation.decoding import DecodingOptions, TokenChooser
from pipeline.runtime.generation.layout import cache_layout
from pipeline.runtime.generation.runners import StepRunner, step_runner
from pipeline.runtime.generation.slots import DEFAULT_SLOTS, RequestSlots
from pipeline.runtime.module import ConvertedModule
from pipeline.settings import Settings

#: transformers' default total length when neither max_new_tokens nor max_length is given.
DEFAULT_MAX_LENGTH = 20

_MAKING_SLOTS = threading.Lock()  # a module's request slots are made once, whichever thread asks first


class GenerativeModule(ConvertedModule):
    """A converted cached decoder step (``pipeline.convert(model, input_ids, generation={...})``).

    Calling it runs one step (``input_ids, attention_mask, position_ids, past_length, *past`` -> ``logits`` and
    ``present.{i}.key/value``); :meth:`generate` decodes like transformers' ``model.generate`` and :meth:`stream`
    yields the new tokens as they come.

    >>> out = module.generate(input_ids, max_new_tokens=32)                          # doctest: +SKIP
    >>> for tokens in module.stream(input_ids, do_sample=True, top_p=0.9, seed=0):  # doctest: +SKIP
    ...     print(tokens)
    """

    _slots: RequestSlots | None = None

    @property
    def generation(self) -> GenerationSettings:
        """The generation settings the step was converted with (capacity, batch, special tokens)."""
        assert self.settings.generation is not None
        return self.settings.generation

    @property
    def vocabulary_size(self) -> int | None:
        """The number of logits per position (the model's vocabulary), ``None`` when the graph does not fix it."""
        for spec in self.io.outputs:
            if spec.name == "logits" and spec.shape and isinstance(spec.shape[-1], int):
                return int(spec.shape[-1])
        return None

    @property
    def request_slots(self) -> int:
        """How many requests (``generate`` calls, open ``stream()`` generators) may decode at once, each over its own
        cache of up to ``max_batch`` rows x ``max_length`` tokens (default 4). More wait for a slot
        (``request_timeout``)."""
        return self._request_slots().slots

    @request_slots.setter
    def request_slots(self, value: int) -> None:
        """Allow ``value`` requests at once (a positive int); fewer takes effect as running requests finish."""
        self._request_slots().slots = value

    @property
    def request_timeout(self) -> float | None:
        """Seconds a request waits for a free slot before :class:`RequestSlotsBusy` (default ``None``: it waits)."""
        return self._request_slots().timeout

    @request_timeout.setter
    def request_timeout(self, value: float | None) -> None:
        """Wait at most ``value`` seconds for a slot (``None``: as long as it takes)."""
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
            raise InputError(f"request_timeout must be seconds >= 0 or None, got {value!r}", fix="pass e.g. 30.0")
        self._request_slots().timeout = value

    def runner(self) -> StepRunner:
        """A new step runner of the executor, with a cache of its own (``generate`` takes one from the module's
        request slots instead)."""
        return step_runner(self._executor, cache_layout(self.io, self.generation.layers))

    def _request_slots(self) -> RequestSlots:
        if self._slots is None:
            with _MAKING_SLOTS:
                if self._slots is None:
                    self._slots = RequestSlots(self.runner, DEFAULT_SLOTS)
        return self._slots

    def rebind(self, *args: Any, **kwargs: Any) -> None:
        """:meth:`ConvertedModule.rebind`; the request slots' runners are made anew on the new executor (requests
        running meanwhile finish on the old one)."""
        super().rebind(*args, **kwargs)
        with _MAKING_SLOTS:
            old, self._slots = self._slots, None
        if old is not None:
            self._request_slots().slots, self._request_slots().timeout = old.slots, old.timeout

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        streamer: Any = None,
        **options: Any,
    ) -> torch.Tensor:
        """The prompt followed by the new tokens, [batch, prompt + new] (transformers' return convention); rows
        that stopped early are filled with ``pad_token_id``. ``streamer`` (transformers' ``put``/``end``
        protocol, e.g. ``TextStreamer``) receives the prompt, then each new token. Options: see :meth:`stream`."""
        if streamer is not None:
            streamer.put(input_ids.cpu())
        new = []
        for tokens in self.stream(input_ids, attention_mask, **options):
            new.append(tokens)
            if streamer is not None:
                streamer.put(tokens)
        if streamer is not None:
            streamer.end()
        return torch.cat([input_ids.cpu(), *(t[:, None] for t in new)], dim=1)

    def stream(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        max_new_tokens: int | None = None,
        max_length: int | None = None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        seed: int | None = None,
    ) -> Generator[torch.Tensor, None, None]:
        """Yield the next token of every row [batch] at each step, until ``max_new_tokens`` (or ``max_length``
        in total; default 20 in total, as transformers) or every row has produced an ``eos_token_id`` (default: the
        model's). Greedy unless ``do_sample``; ``temperature``, ``top_k``, ``top_p`` and ``seed`` shape the draw;
        ``repetition_penalty`` as transformers. ``attention_mask`` marks left padding (0)."""
        ids, mask = self._prompt(input_ids, attention_mask)
        new = self._new_tokens(ids.shape[1], max_new_tokens, max_length)
        chooser = TokenChooser(DecodingOptions(do_sample, temperature, top_k, top_p, repetition_penalty, seed))
        eos = self.generation.eos_token_id if eos_token_id is None else _ints(eos_token_id)
        pad = self.generation.pad_token_id if pad_token_id is None else pad_token_id
        with self._request_slots().hold() as runner:  # this request's own cache, until its last token
            yield from self._decode(runner, ids, mask, new, chooser, eos, pad)

    def _decode(
        self,
        runner: StepRunner,
        ids: torch.Tensor,
        mask: torch.Tensor,
        new: int,
        chooser: TokenChooser,
        eos: tuple[int, ...],
        pad: int | None,
    ) -> Iterator[torch.Tensor]:
        batch, prompt = ids.shape
        runner.start(batch)
        full_mask = torch.zeros(batch, self.generation.max_length, dtype=torch.int64)
        full_mask[:, :prompt] = mask
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        logits = self._prefill(runner, ids, full_mask, positions)
        tokens, unfinished = ids, torch.ones(batch, dtype=torch.bool)
        next_position = positions[:, -1:] + 1
        eos_ids = torch.tensor(eos, dtype=torch.int64)
        for step in range(new):
            chosen = chooser.choose(logits, tokens)
            if pad is not None:
                chosen = torch.where(unfinished, chosen, torch.tensor(pad))
            tokens = torch.cat([tokens, chosen[:, None]], dim=1)
            yield chosen
            if len(eos):
                unfinished &= ~torch.isin(chosen, eos_ids)
            if step == new - 1 or not unfinished.any():
                return
            full_mask[:, prompt + step] = 1
            logits = runner.run(chosen[:, None], full_mask, next_position, prompt + step)
            next_position = next_position + 1

    def _prompt(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.int64:
            raise InputError(
                "generate takes input_ids as an int64 tensor [batch, tokens]", fix="pass tokenizer(...).input_ids"
            )
        for name, tensor in (("input_ids", input_ids), ("attention_mask", attention_mask)):
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                raise InputError(
                    f"{name} is a meta tensor (a shape without data): there are no tokens to generate from",
                    fix="pass a tensor with data (on the CPU or a GPU), e.g. the tokenizer's output",
                )
        batch = input_ids.shape[0]
        if input_ids.shape[1] == 0:
            raise InputError("the prompt is empty (input_ids has no tokens)", fix="pass at least one token per row")
        vocab = self.vocabulary_size
        outside = (input_ids < 0) | (input_ids >= vocab) if vocab is not None else input_ids < 0
        if bool(outside.any()):
            raise InputError(
                f"input_ids holds token id(s) {sorted(set(input_ids[outside].tolist()))[:5]} outside the model's "
                f"vocabulary [0, {vocab})",
                fix="pass ids below the vocabulary size (the model's own tokenizer gives them)",
            )
        if batch > self.generation.max_batch:
            raise InputError(
                f"a batch of {batch} prompts, but the step was converted for max_batch={self.generation.max_batch}",
                fix=f"split the batch, or convert with generation={{'max_batch': {batch}, ...}}",
            )
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(torch.int64).cpu()
        if mask.shape != input_ids.shape:
            raise InputError(
                f"attention_mask {list(mask.shape)} does not match input_ids {list(input_ids.shape)}",
                fix="pass the tokenizer's attention_mask for the same prompts",
            )
        empty = [row for row in range(batch) if not bool(mask[row].any())]
        if attention_mask is not None and empty:
            raise InputError(
                f"attention_mask row(s) {empty[:5]} are all zeros: those prompts have no token to attend to",
                fix="drop the empty prompts from the batch, or pass the tokenizer's attention_mask (1 on every token)",
            )
        if attention_mask is not None and bool((mask[:, -1] == 0).any()):
            raise InputError(
                "attention_mask has padding at the end of a prompt; decoding needs left padding",
                fix="tokenize with padding_side='left'",
            )
        return input_ids.cpu(), mask

    def _new_tokens(self, prompt: int, max_new_tokens: int | None, max_length: int | None) -> int:
        for name, value in (("max_new_tokens", max_new_tokens), ("max_length", max_length)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InputError(
                    f"{name} must be a positive int, got {value!r}", fix=f"pass e.g. {name}=32, or leave it out"
                )
        new = max_new_tokens if max_new_tokens is not None else (max_length or DEFAULT_MAX_LENGTH) - prompt
        capacity = self.generation.max_length
        if new < 1:
            raise InputError(
                f"nothing to generate: a prompt of {prompt} tokens and max_length={max_length}",
                fix="pass max_new_tokens=N",
            )
        if prompt >= capacity:
            raise InputError(
                f"a prompt of {prompt} tokens leaves no room in the cache (max_length={capacity})",
                fix=f"shorten the prompt, or convert with generation={{'max_length': {prompt + new}, ...}}",
            )
        if prompt + new > capacity:
            raise InputError(
                f"a prompt of {prompt} tokens plus {new} new ones exceeds the cache capacity max_length={capacity}",
                fix=f"pass max_new_tokens <= {capacity - prompt}, or convert with generation={{'max_length': "
                f"{prompt + new}, ...}}",
            )
        return new

    def _prefill(
        self, runner: StepRunner, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """The prompt through the step, in chunks of the context profile's length; the last chunk's logits."""
        chunk = self.generation.max_prompt or self.generation.max_length
        logits = torch.empty(0)
        for start in range(0, ids.shape[1], chunk):
            end = min(start + chunk, ids.shape[1])
            logits = runner.run(ids[:, start:end], mask, positions[:, start:end], start)
        return logits


def _ints(value: int | list[int]) -> tuple[int, ...]:
    return (value,) if isinstance(value, int) else tuple(int(v) for v in value)


def module_class(settings: Settings) -> type[ConvertedModule]:
    """:class:`ConvertedModule`, or :class:`GenerativeModule` for a cached decoder step (``generation=``)."""
    return ConvertedModule if settings.generation is None else GenerativeModule
