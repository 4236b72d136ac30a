"""The converted decoder step with ``generate()``: the decoding loop, plain Python around one step.

The same loop serves every backend: the executor's runner (:mod:`pipeline.runtime.generation.runners`) holds the cache,
the loop holds the tokens, the attention mask and the positions. A prompt longer than the context profile
(``max_prompt``) is prefilled in chunks. The positions follow transformers (``cumsum(attention_mask) - 1``), so a
left-padded batch decodes as ``model.generate`` does.

Greedy and sampled decoding yield token by token (:meth:`GenerativeModule.stream`); beam search
(:mod:`pipeline.runtime.generation.beam_search`) reorders the cache rows between steps and answers at the end. The
options are transformers' (:mod:`pipeline.runtime.generation.options`), resolved against the step in
:mod:`pipeline.runtime.generation.request`; the processors are :mod:`pipeline.runtime.generation.processors`.

Requests are independent: ``generate`` from many threads at once, and ``stream()`` generators advanced in any order,
each decode over a cache of their own (:mod:`pipeline.runtime.generation.slots`; at most ``request_slots`` at once).

The modules of the decoding loop are imported by the first request (or the first look at the request slots), not
when the module is made: loading a generation artifact needs only the class.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from converters.errors import InputError
from converters.settings import GenerationSettings
from pipeline.runtime.module import ConvertedModule
from pipeline.settings import Settings

if TYPE_CHECKING:  # the decoding loop's modules are imported by the first request, not by a load (0.05-0.13 s)
    from pipeline.runtime.generation.feed import Feed, StepFeed
    from pipeline.runtime.generation.options import GenerateOptions
    from pipeline.runtime.generation.request import Decoding
    from pipeline.runtime.generation.runners import StepRunner
    from pipeline.runtime.generation.slots import RequestSlots

#: The files of the directory a step with a prompt graph saves (:meth:`GenerativeModule.save`).
STEP_FILE, PROMPT_FILE = "step.ptrt", "prompt.ptrt"

_MAKING_SLOTS = threading.Lock()  # a module's request slots are made once, whichever thread asks first


class HeldRequests:
    """The request slots of a generative module (:mod:`pipeline.runtime.generation.slots`): at most
    ``request_slots`` requests decode at once, each over a cache of its own; more wait. A module whose requests make
    their own runner (the two-graph modules) holds a slot without one (:meth:`_slot_runner` gives None)."""

    _slots: RequestSlots | None = None

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

    def _slot_runner(self) -> StepRunner | None:
        """The runner a slot keeps between requests (None: each request makes its own)."""
        return None

    def _request_slots(self) -> RequestSlots:
        from pipeline.runtime.generation.slots import DEFAULT_SLOTS, RequestSlots

        if self._slots is None:
            with _MAKING_SLOTS:
                if self._slots is None:
                    self._slots = RequestSlots(self._slot_runner, DEFAULT_SLOTS)
        return self._slots


class GenerativeModule(HeldRequests, ConvertedModule):
    """A converted cached decoder step (``pipeline.convert(model, input_ids, generation={...})``).

    Calling it runs one step (``input_ids, attention_mask, position_ids, past_length, *past`` -> ``logits`` and
    ``present.{i}.key/value``); :meth:`generate` decodes like transformers' ``model.generate`` and :meth:`stream`
    yields the new tokens as they come.

    >>> out = module.generate(input_ids, max_new_tokens=32)                          # doctest: +SKIP
    >>> for tokens in module.stream(input_ids, do_sample=True, top_p=0.9, seed=0):  # doctest: +SKIP
    ...     print(tokens)
    """

    _prompt_module: ConvertedModule | None = None

    @property
    def prompt_graph(self) -> ConvertedModule | None:
        """A recurrent model's prompt graph (the step's inputs and outputs, ``generation.prompt_tokens`` tokens per
        run: :mod:`pipeline.generation.prompt_graph`), or None: the prompt runs through the step
        (:meth:`hold_prompt_graph` sets it)."""
        return self._prompt_module

    @property
    def run_tokens(self) -> int:
        """The tokens per run of the prompt graph held (``generation.prompt_tokens``); 0 when none is held (a rebind
        drops it; a step loaded without its directory has none): its prompts then run through the step."""
        return self.generation.prompt_tokens if self._prompt_module is not None else 0

    def hold_prompt_graph(self, graph: ConvertedModule | None) -> None:
        """Run prompts on ``graph`` (None: through the step); held as a plain attribute, not a submodule (the
        module's state is its own graph's). The request slots' runners are made anew with it."""
        object.__setattr__(self, "_prompt_module", graph)
        self._renew_slots()

    def _renew_slots(self) -> None:
        """The request slots' runners made anew by the next request (those running finish on theirs), with the
        slots' count and timeout kept."""
        with _MAKING_SLOTS:
            old, self._slots = self._slots, None
        if old is not None:
            self._request_slots().slots, self._request_slots().timeout = old.slots, old.timeout

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

    def runner(self) -> StepRunner:
        """A new step runner of the executor, with a cache of its own (``generate`` takes one from the module's
        request slots instead)."""
        from pipeline.runtime.generation.layout import cache_layout
        from pipeline.runtime.generation.runners import step_runner

        prompt = self.prompt_graph._executor if self.prompt_graph is not None else None
        return step_runner(self._executor, cache_layout(self.io, self.generation.layers), prompt=prompt)

    def _slot_runner(self) -> StepRunner:
        """A slot keeps its runner (and its buffers) for the next request."""
        return self.runner()

    def save(self, path: str | Path, *, metadata: Mapping[str, Any] | None = None) -> Path:
        """:meth:`ConvertedModule.save`; a step with a prompt graph saves a directory of both artifacts
        (:data:`STEP_FILE`, :data:`PROMPT_FILE`), written atomically, which :func:`pipeline.load` reads back."""
        prompt = self.prompt_graph
        if prompt is None:
            return super().save(path, metadata=metadata)
        from pipeline.runtime.generation.saved_directory import save_directory

        def write(directory: Path) -> None:
            ConvertedModule.save(self, directory / STEP_FILE, metadata=metadata)
            prompt.save(directory / PROMPT_FILE)

        return save_directory(path, (STEP_FILE, PROMPT_FILE), write, "a recurrent model's step and prompt graph")

    def save_onnx(self, path: str | Path) -> list[Path]:
        """:meth:`ConvertedModule.save_onnx`; with a prompt graph, its graph too, beside: ``<name>.prompt.onnx``."""
        written = super().save_onnx(path)
        if self.prompt_graph is not None:
            target = Path(path)
            written += self.prompt_graph.save_onnx(target.with_name(f"{target.stem}.prompt{target.suffix}"))
        return written

    def rebind(self, *args: Any, **kwargs: Any) -> None:
        """:meth:`ConvertedModule.rebind`; the request slots' runners are made anew on the new executor (requests
        running meanwhile finish on the old one)."""
        super().rebind(*args, **kwargs)
        if self.prompt_graph is not None:  # its weights are the old ones: said, and prompts run through the step
            import warnings

            warnings.warn(
                "the refitted step's prompt graph keeps the old weights and is dropped: prompts now run through the "
                "one-token step, token by token (convert the model again for a prompt graph of the new weights)",
                stacklevel=2,
            )
            object.__setattr__(self, "_prompt_module", None)
        self._renew_slots()

    def generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **options: Any
    ) -> torch.Tensor | Any:
        """The prompt followed by the new tokens, [rows, prompt + new] (transformers' return convention); rows
        that stopped early are filled with ``pad_token_id``. Takes :meth:`stream`'s options and those that need the
        whole decoding: ``streamer`` (transformers' ``put``/``end`` protocol, e.g. ``TextStreamer``: the prompt,
        then each new token); beam search (``num_beams``, ``length_penalty``, ``early_stopping``,
        ``num_return_sequences`` up to ``num_beams``: each prompt's best sequences, best first);
        ``return_dict_in_generate`` with ``output_scores``/``output_logits`` (transformers'
        ``GenerateDecoderOnlyOutput``, or ``GenerateBeamDecoderOnlyOutput`` with beams: needs transformers).

        >>> module.generate(ids, num_beams=4, num_return_sequences=2, max_new_tokens=16)  # doctest: +SKIP
        """
        from pipeline.runtime.generation.options import generate_options
        from pipeline.runtime.generation.outputs import decoder_only_output
        from pipeline.runtime.generation.request import resolve

        request = generate_options("generate", options, self.generation.model_options)
        ids, mask = self._prompt(input_ids, attention_mask, request.expand, request.num_beams)
        if request.num_beams > 1:
            return self._beam_search(ids, mask, request)
        decoding = resolve(request, self.generation, ids, mask, self.vocabulary_size)
        streamer = request.streamer
        if streamer is not None:
            streamer.put(ids)
        new = []
        for tokens in self._stream(ids, mask, decoding):
            new.append(tokens)
            if streamer is not None:
                streamer.put(tokens)
        if streamer is not None:
            streamer.end()
        sequences = torch.cat([ids, *(t[:, None] for t in new)], dim=1)
        if not request.return_dict_in_generate:
            return sequences
        return decoder_only_output(sequences, decoding.chooser.scores, decoding.chooser.logits, request)

    def stream(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **options: Any
    ) -> Generator[torch.Tensor, None, None]:
        """Yield the next token of every row [rows] at each step, until ``max_new_tokens`` (or ``max_length``
        in total; default 20 in total, as transformers) or every row has produced an ``eos_token_id`` (default: the
        model's) or met a ``stopping_criteria``. Greedy unless ``do_sample``; ``temperature``, ``top_k``, ``top_p``
        and ``seed`` shape the draw (``num_return_sequences`` draws per prompt); ``repetition_penalty``,
        ``no_repeat_ngram_size``, ``bad_words_ids``, ``min_length``, ``min_new_tokens`` and a ``logits_processor``
        as transformers applies them. ``generation_config``: a transformers ``GenerationConfig`` whose fields give
        the options not passed. ``attention_mask`` marks left padding (0). ``input_ids``: int64 or int32."""
        from pipeline.runtime.generation.options import generate_options
        from pipeline.runtime.generation.request import resolve

        request = generate_options("stream", options, self.generation.model_options)
        ids, mask = self._prompt(input_ids, attention_mask, request.expand, request.num_beams)
        decoding = resolve(request, self.generation, ids, mask, self.vocabulary_size)
        yield from self._stream(ids, mask, decoding)

    def _stream(self, ids: torch.Tensor, mask: torch.Tensor, decoding: Decoding) -> Iterator[torch.Tensor]:
        with self._request_slots().hold() as runner:  # this request's own cache, until its last token
            assert runner is not None
            yield from self._decode(self._feed(runner, ids, mask, decoding.new), decoding)

    def _feed(self, runner: StepRunner, ids: torch.Tensor, mask: torch.Tensor, room: int) -> StepFeed:
        """The request's feed; ``room``: the new tokens it decodes (a prompt graph's padding leaves room for them)."""
        from pipeline.runtime.generation.feed import StepFeed

        return StepFeed.of(runner, ids, mask, self.generation, self.run_tokens, room)

    def _decode(self, feed: StepFeed, decoding: Decoding) -> Iterator[torch.Tensor]:
        return decode(feed, decoding)

    def _beam_search(self, ids: torch.Tensor, mask: torch.Tensor, request: GenerateOptions) -> torch.Tensor | Any:
        from pipeline.runtime.generation.beam_search import BeamSettings, beam_search
        from pipeline.runtime.generation.outputs import beam_output
        from pipeline.runtime.generation.request import fill_token, resolve

        decoding = resolve(request, self.generation, ids, mask, self.vocabulary_size)
        settings = BeamSettings(
            request.num_beams, request.length_penalty, request.early_stopping, request.num_return_sequences
        )
        fill = fill_token(decoding.eos, decoding.pad)
        record = request.return_dict_in_generate and (request.output_scores or request.output_logits)
        processors = decoding.processors if decoding.processors else None
        with self._request_slots().hold() as runner:
            assert runner is not None
            feed = self._feed(runner, ids, mask, decoding.new)
            result = beam_search(
                feed, settings, decoding.new, processors, decoding.criteria, decoding.eos, fill, record
            )
        return beam_output(result, request) if request.return_dict_in_generate else result.sequences

    def _prompt(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, expand: int = 1, beams: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt rows on the CPU as int64, each prompt repeated ``expand`` times (beams, or sequences drawn per
        prompt), and their attention mask."""
        ids, mask = checked_prompt(input_ids, attention_mask, self.vocabulary_size)
        self._check_rows(ids.shape[0], expand, beams)
        return ids.repeat_interleave(expand, dim=0), mask.repeat_interleave(expand, dim=0)

    def _check_rows(self, batch: int, expand: int, beams: int) -> None:
        """``batch`` prompts of ``expand`` rows each must fit the converted ``max_batch``."""
        most = self.generation.max_batch
        if batch * expand <= most:
            return
        if expand == 1:
            raise InputError(
                f"a batch of {batch} prompts, but the step was converted for max_batch={most}",
                fix=f"split the batch, or convert with generation={{'max_batch': {batch}, ...}}",
            )
        what = "beams" if beams > 1 else "sequences per prompt (num_return_sequences)"
        raise InputError(
            f"a batch of {batch} prompts x {expand} {what} = {batch * expand} rows, but the step was converted for "
            f"max_batch={most}",
            fix=f"pass at most {most // expand} prompt(s) per call, or fewer {what.split(' ')[0]}, or convert with "
            f"generation={{'max_batch': {batch * expand}, ...}}",
        )


def checked_prompt(
    input_ids: Any, attention_mask: Any, vocab: int | None, source: str = "tokenizer"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt rows on the CPU as int64 and their mask, or an InputError naming what is wrong and the fix (the
    ``source`` of the ids: the tokenizer, a processor)."""
    if (
        not isinstance(input_ids, torch.Tensor)
        or input_ids.dim() != 2
        or input_ids.dtype not in (torch.int64, torch.int32)
    ):
        raise InputError(
            "generate takes input_ids as an int64 (or int32) tensor [batch, tokens]",
            fix=f"pass {source}(...).input_ids",
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
    outside = (input_ids < 0) | (input_ids >= vocab) if vocab is not None else input_ids < 0
    if bool(outside.any()):
        raise InputError(
            f"input_ids holds token id(s) {sorted(set(input_ids[outside].tolist()))[:5]} outside the model's "
            f"vocabulary [0, {vocab})",
            fix=f"pass ids below the vocabulary size (the model's own {source} gives them)",
        )
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise InputError(
            f"attention_mask is a {type(attention_mask).__name__}, not a tensor of input_ids' shape",
            fix=f"pass the {source}'s attention_mask (return_tensors='pt')",
        )
    given = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    mask = given.to(torch.int64).cpu()
    if mask.shape != input_ids.shape:
        raise InputError(
            f"attention_mask {list(mask.shape)} does not match input_ids {list(input_ids.shape)}",
            fix=f"pass the {source}'s attention_mask for the same prompts",
        )
    empty = [row for row in range(batch) if not bool(mask[row].any())]
    if attention_mask is not None and empty:
        raise InputError(
            f"attention_mask row(s) {empty[:5]} are all zeros: those prompts have no token to attend to",
            fix=f"drop the empty prompts from the batch, or pass the {source}'s attention_mask (1 on every token)",
        )
    if attention_mask is not None and bool((mask[:, -1] == 0).any()):
        raise InputError(
            "attention_mask has padding at the end of a prompt; decoding needs left padding",
            fix=f"{'tokenize' if source == 'tokenizer' else 'process'} with padding_side='left'",
        )
    return input_ids.cpu().to(torch.int64), mask


def decode(feed: Feed, decoding: Decoding) -> Iterator[torch.Tensor]:
    """Greedy or sampled decoding over ``feed`` (a :class:`StepFeed`, or an encoder-decoder's): the chosen token of
    every row at each step, finished rows filled with the pad token, until every row stops or ``decoding.new``.

    Each step's host work is kept to what the request needs: it runs between session runs that leave the caches
    cold, where each library call costs tens of microseconds (issue 35: the old loop's torch calls were 0.3-0.4 ms of
    an int4 step's 4.5). The sequences so far are kept only for processors and criteria, in one buffer of the final
    length; the eos test looks at the chosen tokens alone; rows are filled with the pad token once one has finished."""
    logits = feed.prefill()
    chooser, criteria, pad = decoding.chooser, decoding.criteria, decoding.pad
    sequences = _Sequences(feed.ids, decoding.new) if chooser.processors is not None or criteria is not None else None
    eos = _eos_test(decoding.eos) if criteria is None else None  # with criteria, decoding.stops tests both
    unfinished: np.ndarray | None = None  # None while every row runs
    last = decoding.new - 1
    for step in range(decoding.new):
        chosen = chooser.choose(logits, None if sequences is None else sequences.tokens())
        if pad is not None and unfinished is not None:
            chosen = torch.from_numpy(np.where(unfinished, chosen.numpy(), pad))
        yield chosen
        if sequences is not None:
            sequences.append(chosen)
        if criteria is not None and sequences is not None:
            done: np.ndarray | None = decoding.stops(sequences.tokens()).numpy()
        else:
            done = eos(chosen) if eos is not None else None
        if done is not None and done.any():
            unfinished = ~done if unfinished is None else unfinished & ~done
            if not unfinished.any():
                return
        if step == last:
            return
        logits = feed.step(chosen)


class _Sequences:
    """The rows' tokens so far (prompt and chosen) in one buffer of the final length: :meth:`tokens` is a tensor of
    them as the processors and criteria take it (a new tensor each call, whose values never change after: a
    processor may keep it)."""

    def __init__(self, ids: torch.Tensor, new: int) -> None:
        rows, self.length = ids.shape
        self.buffer = np.empty((rows, self.length + new), dtype=np.int64)
        self.buffer[:, : self.length] = ids.numpy()

    def append(self, chosen: torch.Tensor) -> None:
        self.buffer[:, self.length] = chosen.numpy()
        self.length += 1

    def tokens(self) -> torch.Tensor:
        seen = self.buffer[:, : self.length]
        # one row's prefix is contiguous memory; several rows' is strided, copied for code that needs it contiguous
        return torch.from_numpy(seen if seen.shape[0] == 1 else np.ascontiguousarray(seen))


def _eos_test(eos: tuple[int, ...]) -> Callable[[torch.Tensor], np.ndarray | None] | None:
    """Which of the chosen tokens [rows] are an eos token (``None``: none is), ``None`` when there are no eos tokens
    (no row ever stops)."""
    if not eos:
        return None
    tokens = frozenset(eos)

    def test(chosen: torch.Tensor) -> np.ndarray | None:
        ids = chosen.tolist()  # a set's test on a few ints: the least code to run after a step's cold caches
        if tokens.isdisjoint(ids):
            return None
        return np.array([token in tokens for token in ids])

    return test


def module_class(settings: Settings) -> type[ConvertedModule]:
    """:class:`ConvertedModule`, or :class:`GenerativeModule` for a cached decoder step (``generation=``). An
    encoder-decoder's step is a plain module: its ``generate`` is the encoder-decoder module's, which holds both."""
    generation = settings.generation
    return GenerativeModule if generation is not None and generation.kind == "decoder" else ConvertedModule
