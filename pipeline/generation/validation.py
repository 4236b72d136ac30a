"""The validation stage of a generation conversion: whole decodings against transformers' own cached ``generate``.

The step graph is first validated like any graph (against the same step in PyTorch, which shares the step's cache
code and so cannot catch a wrong cache write, mask or position). Then :func:`validate_decoding` decodes with the
converted step and with the model's own ``model.generate`` (its ``DynamicCache``, greedy, float32) in two runs:

- the sample prompt, as given (a sample that does not fit, more rows than ``max_batch`` or more tokens than
  ``max_length`` leaves room for the judged steps, is an InputError: :func:`check_sample_fits`, never cut);
- the drawn prompts in one left-padded batch (several when there are more than ``max_batch``): ``validation_inputs``
  of them, at least 3 (at most ``max_batch``) when ``max_batch`` >= 2 so that a padded batch is always decoded;
  drawn at random (seeded by ``seed``; distinct lengths, ids anywhere in the vocabulary);

and judges the logits of the prefill and of ``generation.validation_steps`` decode steps (the graph fed the tokens
PyTorch chose) by the accuracy policy: the tolerance of the type the graph computes in, anchored to PyTorch's own
error in that type (float32 graphs: PyTorch in float64; half graphs: PyTorch in that half type) on a prompt where the
fixed tolerance fails. On the sample the step decodes greedily on its own for up to 16 tokens and the tokens equal to
``model.generate``'s are counted (:attr:`DecodingAccuracy.greedy`): fp16 may diverge after a near tie, which the
count shows and the per-step verdict does not fail. That run is also the sample's teacher-forced one whenever its
tokens are PyTorch's through the judged steps (the same inputs, so the same logits): the prefill and the steps are
computed once; only a run that diverges earlier is decoded again, fed PyTorch's tokens.

When a step fails, PyTorch's own model is also fed each row's tokens as the converted module feeds them (the same
runs of the prompt, one token or several per call, through its own cache; the tokens after the prompt one at a time):
a model whose one-token and multi-token paths are not the same function (Nemotron-H's chunked scan clamps its time
step, its one-token update does not) parts from its own ``generate`` there. When it parts beyond the tolerance, and
by half as much as the converted step at least, the error says first that the model's two paths differ in PyTorch
itself, with the figures (:func:`_own_paths_part`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from converters.errors import AccuracyError
from pipeline.accuracy.anchor import ANCHOR_DTYPES, PrecisionMode, anchored_tolerance
from pipeline.accuracy.stats import judgement, tolerance_ratio
from pipeline.exporting.stage import eval_mode
from pipeline.generation.conversion import check_sample_fits
from pipeline.generation.model_cache import cache_argument
from pipeline.generation.seq2seq import cache_of
from pipeline.precision.stage import validation_settings
from pipeline.runtime.generation.feed import StepFeed, prompt_padding, prompt_runs
from pipeline.runtime.generation.layout import cache_layout
from pipeline.runtime.generation.options import NOT_TAKEN_DECODING, model_defaults
from pipeline.runtime.generation.runners import StepRunner, step_runner
from pipeline.runtime.io_spec import IOSpec, normalise_sample
from pipeline.runtime.reports.accuracy import DecodingAccuracy
from pipeline.settings import Settings
from pipeline.validation.decoding import StepJudge, raise_decoding_error

logger = logging.getLogger(__name__)

#: New tokens the converted step decodes greedily on its own on the sample (fewer when the cache is smaller).
GREEDY_TOKENS = 16

#: Rows of the left-padded batch of drawn prompts when ``max_batch`` allows it, however few are asked for.
PADDED_ROWS = 3


@dataclass(frozen=True)
class Prompt:
    """One decoding run: ``input_ids`` and ``attention_mask`` [rows, width] (drawn rows left-padded with the pad
    id), and how the report names it."""

    label: str
    ids: torch.Tensor
    mask: torch.Tensor

    @property
    def tokens(self) -> int:
        """Prompt tokens over every row, padding not counted."""
        return int(self.mask.sum())


def validate_decoding(
    model: torch.nn.Module,
    executor: Any,
    io: IOSpec,
    sample: Any,
    settings: Settings,
    runner: StepRunner | None = None,
    greedy_tokens: int = GREEDY_TOKENS,
    prompt: Any = None,
) -> DecodingAccuracy:
    """Decode with the converted step and with ``model.generate`` and judge every step's logits (see the module
    docstring); raise AccuracyError when a step is beyond the policy. ``sample`` is the conversion's sample (its
    ``input_ids``); ``runner`` replaces the executor's step runner (tests plant errors with it); ``greedy_tokens``
    is the length of the greedy comparison on the sample (capped by the cache); ``prompt``: a recurrent model's
    prompt graph's executor (:mod:`pipeline.generation.prompt_graph`), which runs the prompts as the module does."""
    generation = settings.generation
    assert generation is not None
    if prompt is None:  # the prompt runs through the step, token by token
        settings = dataclasses.replace(settings, generation=dataclasses.replace(generation, prompt_tokens=0))
    runner = runner or step_runner(executor, cache_layout(io, generation.layers), prompt=prompt)
    logits_dtype = next(o.dtype for o in io.outputs if o.name == "logits")
    judged = judgement("logits", logits_dtype, validation_settings(settings))
    steps = generation.validation_steps
    prompts = _prompts(_sample_ids(sample), settings, _vocabulary(io), steps)
    judge = StepJudge(judged.tolerance)
    anchor_notes: set[str] = set()
    greedy = _Greedy()
    greedy_tokens = max(1, min(greedy_tokens, generation.max_length - prompts[0].ids.shape[1]))
    judged_runs: list[_JudgedRun] = []
    with _greedy_only(model), eval_mode(model, warn=False):
        for index, prompt in enumerate(prompts):
            ids, mask = prompt.ids, prompt.mask
            new = max(steps + 1, greedy_tokens) if index == 0 else steps + 1
            chosen, expected = _torch_generate(model, ids, mask, new, generation.pad_token_id)
            if index == 0:
                actual = greedy.decode(runner, settings, prompt, chosen, steps, greedy_tokens)
                room = greedy.room
            else:
                actual, _ = _decode(runner, settings, ids, mask, steps + 1, chosen)
                room = steps
            judged_runs.append(_JudgedRun(prompt, chosen, expected, actual, room))
            anchor: list[np.ndarray] | None = None
            for step, got in enumerate(actual):
                want = expected[:, step].numpy()
                tolerance = None
                if judged.anchor and tolerance_ratio(got, want, judged.tolerance) > 1:
                    if anchor is None:
                        anchor = _anchor_logits(model, ids, mask, chosen[:, :steps], judged.anchor, anchor_notes)
                    if anchor:
                        tolerance = anchored_tolerance(judged.tolerance, want, anchor[step], judged.anchor, got)[0]
                judge.add(step, got, want, tolerance)
    rows = sum(p.ids.shape[0] for p in prompts)
    report = DecodingAccuracy(
        prompts=tuple(p.label for p in prompts),
        steps=steps,
        computed_in=judged.computed_in,
        tolerance={k: float(v) for k, v in vars(judged.tolerance).items() if isinstance(v, float)},
        per_step=judge.results(),
        greedy=greedy.same,
        greedy_tokens=greedy_tokens * prompts[0].ids.shape[0],
        first_divergence=greedy.first,
        precision=settings.precision,
        note="; ".join(sorted(anchor_notes)),
        rows=rows,
        prompt_tokens=sum(p.tokens for p in prompts),
        logits_judged=rows * (steps + 1),
        greedy_reused=greedy.reused,
    )
    if not report.passed:
        with _greedy_only(model), eval_mode(model, warn=False):
            parted = _own_paths_part(model, judged_runs, settings, judged.tolerance)
        try:
            raise_decoding_error(report)
        except AccuracyError as error:
            if parted is None:
                raise
            raise AccuracyError(
                f"{parted}: {error.message}",
                per_output=error.per_output,
                fix="the model's one-token and multi-token paths compute different functions in PyTorch "
                "(transformers' code), and generate runs a prompt through the multi-token one: a max_length with room "
                "to pad prompts to whole runs of the prompt graph runs them so too; validate=False gives the module "
                "anyway; if PyTorch fed so is far from the converted step too, please report it with the model",
            ) from None
    return report


class _Greedy:
    """The sample's run: the step decoding greedily on its own, its tokens counted against PyTorch's, and its
    logits those of the teacher-forced run whenever its tokens are PyTorch's through the judged steps."""

    def __init__(self) -> None:
        self.same, self.first, self.reused, self.room = 0, -1, False, 0

    def decode(
        self, runner: StepRunner, settings: Settings, prompt: Prompt, chosen: torch.Tensor, steps: int, tokens: int
    ) -> list[np.ndarray]:
        """The logits of the prefill and ``steps`` decode steps, fed ``chosen`` [rows, >= steps]; counts the first
        ``tokens`` greedy tokens."""
        logits, own = _decode(runner, settings, prompt.ids, prompt.mask, max(tokens, steps + 1), None)
        self.room = max(tokens, steps + 1) - 1
        same = own[:, :tokens] == chosen[:, :tokens]
        self.same = int(same.sum())
        self.first = int((~same).any(0).float().argmax()) if not bool(same.all()) else -1
        self.reused = bool((own[:, :steps] == chosen[:, :steps]).all())
        if self.reused:  # each judged step was fed exactly PyTorch's tokens: these are the teacher-forced logits
            return logits[: steps + 1]
        self.room = steps
        return _decode(runner, settings, prompt.ids, prompt.mask, steps + 1, chosen)[0]


def _sample_ids(sample: Any) -> torch.Tensor:
    args, kwargs = normalise_sample(sample)
    ids = kwargs.get("input_ids", args[0] if args else None)
    assert isinstance(ids, torch.Tensor)
    return ids.cpu()


def _vocabulary(io: IOSpec) -> int:
    shape = next(o.shape for o in io.outputs if o.name == "logits")
    return int(shape[-1])


def _prompts(sample: torch.Tensor, settings: Settings, vocabulary: int, steps: int) -> list[Prompt]:
    """The sample, then the drawn prompts (distinct lengths) in left-padded batches of up to ``max_batch`` rows."""
    generation = settings.generation
    assert generation is not None
    longest = max(1, generation.max_length - max(steps, 1))
    check_sample_fits(sample, generation, validate=True)  # the conversion checked it already: never cut it to fit
    prompts = [Prompt(f"sample {sample.shape[0]}x{sample.shape[1]}", sample, torch.ones_like(sample))]
    generator = torch.Generator().manual_seed(settings.seed)
    count = settings.validation_inputs
    if generation.max_batch >= 2:  # a padded batch always: only left padding shows a mask that ignores it
        count = max(count, min(PADDED_ROWS, generation.max_batch))
    lengths = (torch.randperm(longest, generator=generator)[: min(count, longest)] + 1).tolist()
    pad = generation.pad_token_id if generation.pad_token_id is not None else 0
    for start in range(0, len(lengths), generation.max_batch):
        prompts.append(_padded_batch(lengths[start : start + generation.max_batch], vocabulary, pad, generator))
    return prompts


def _padded_batch(lengths: list[int], vocabulary: int, pad: int, generator: torch.Generator) -> Prompt:
    """Prompts of ``lengths`` tokens drawn from the vocabulary, left-padded with ``pad`` into one batch."""
    width = max(lengths)
    ids = torch.randint(0, vocabulary, (len(lengths), width), generator=generator)
    mask = (torch.arange(width) >= width - torch.tensor(lengths).unsqueeze(1)).to(torch.int64)
    if len(lengths) == 1:
        return Prompt(f"drawn 1x{width}", ids, mask)
    label = f"left-padded {len(lengths)}x{width} (drawn, {'/'.join(map(str, lengths))} tokens)"
    return Prompt(label, ids.masked_fill(mask == 0, pad), mask)


@contextlib.contextmanager
def _greedy_only(model: torch.nn.Module) -> Iterator[None]:
    """``model.generate`` choosing each token by the raw logits' argmax, as the step's own greedy run does, and
    decoding the full length: the model's generation config without its eos (``generate`` falls back to it when given
    ``eos_token_id=None``) and without the options it sets (forced or suppressed tokens, n-gram rules, ...: the
    module applies them at ``generate``), restored afterwards."""
    config = getattr(model, "generation_config", None)
    if config is None or not hasattr(config, "to_dict"):
        yield
        return
    neutral = copy.deepcopy(config)
    neutral.eos_token_id = None
    taken, others = model_defaults(config, capacity=1 << 30)
    # what it sets that we take, and what changes the tokens that we do not (sequence_bias, ...)
    for name in [*taken, *(n for n in others if n in NOT_TAKEN_DECODING)]:
        setattr(neutral, name, None)
    model.generation_config = neutral
    try:
        yield
    finally:
        model.generation_config = config


def _torch_generate(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, new: int, pad: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's greedy ``generate`` with its own cache (on the model's device): the new tokens [B, new] and the raw
    logits of each step [B, new, vocab] (float32), on the CPU."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    with torch.no_grad():
        out = model.generate(
            ids.to(device), attention_mask=mask.to(device), max_new_tokens=new, min_new_tokens=0, do_sample=False,
            num_beams=1, repetition_penalty=1.0, output_logits=True, return_dict_in_generate=True,
            pad_token_id=pad if pad is not None else 0,
        )  # fmt: skip
    return out.sequences[:, ids.shape[1] :].cpu(), torch.stack(out.logits, 1).float().cpu()


def _decode(
    runner: StepRunner, settings: Settings, ids: torch.Tensor, mask: torch.Tensor, count: int, forced: Any
) -> tuple[list[np.ndarray], torch.Tensor]:
    """The converted step's logits of the prefill and of ``count - 1`` decode steps, and the ``count`` tokens fed:
    ``forced`` [B, >= count] (teacher forcing) or, when None, its own greedy choices. The module's own feed: the same
    prompt runs, positions and mask as :meth:`GenerativeModule.stream`."""
    generation = settings.generation
    assert generation is not None
    # prompt_tokens is 0 when no prompt graph runs the prompts (validate_decoding zeroes it)
    feed = StepFeed.of(runner, ids, mask, generation, generation.prompt_tokens, room=count - 1)
    logits = feed.prefill()
    outputs, tokens = [logits.float().numpy()], []
    for k in range(count):
        token = forced[:, k] if forced is not None else logits.float().argmax(-1)
        tokens.append(token)
        if k == count - 1 or feed.prompt + k >= generation.max_length:
            break
        logits = feed.step(token)
        outputs.append(logits.float().numpy())
    return outputs[:count], torch.stack(tokens, 1)


def _anchor_logits(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, new: torch.Tensor, computed_in: str,
    notes: set[str],
) -> list[np.ndarray]:  # fmt: skip
    """PyTorch's own logits in the anchor type of ``computed_in`` at the prefill and each decode step: one forward
    of the prompt followed by the tokens fed, every float32 op computed in that type; [] (with a note) when the
    model cannot run so."""
    dtype = ANCHOR_DTYPES[computed_in]
    sequence = torch.cat([ids, new], 1)
    full = torch.cat([mask, torch.ones_like(new)], 1)
    call: dict[str, Any] = {"input_ids": sequence, "attention_mask": full, "use_cache": False}
    if "position_ids" in inspect.signature(model.forward).parameters:
        call["position_ids"] = (full.cumsum(-1) - 1).masked_fill(full == 0, 1)
    named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    state = {k: v.detach().to(dtype) if v.dtype == torch.float32 else v for k, v in named.items()}
    device = next(iter(state.values())).device if state else torch.device("cpu")
    call = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in call.items()}
    mode = PrecisionMode(dtype)
    try:
        with torch.no_grad(), mode:
            out = torch.func.functional_call(model, state, (), call)
    except Exception as error:  # the fixed tolerance stands, and the report says why
        notes.add(f"PyTorch cannot run the model in {dtype} for the anchored rule: {type(error).__name__}")
        return []
    if mode.float32_ops:
        ops = ", ".join(sorted(mode.float32_ops))
        notes.add(f"ops computed in float32 in PyTorch's {computed_in} anchor run: {ops}")
    logits = next(leaf for leaf in pytree.tree_leaves(out.logits) if isinstance(leaf, torch.Tensor))
    prompt = ids.shape[1]
    return [logits[:, prompt - 1 + k].double().cpu().numpy() for k in range(new.shape[1] + 1)]


@dataclass(frozen=True)
class _JudgedRun:
    """One prompt's judged decoding: PyTorch's tokens ``chosen`` [rows, new] and logits ``expected`` [rows, new,
    vocab] (its ``generate``), the converted step's logits ``actual`` (one array per judged step) and the ``room`` its
    feed left for new tokens."""

    prompt: Prompt
    chosen: torch.Tensor
    expected: torch.Tensor
    actual: list[np.ndarray]
    room: int


def _own_paths_part(model: torch.nn.Module, runs: list[_JudgedRun], settings: Settings, tolerance: Any) -> str | None:
    """What the error adds when PyTorch's own model, fed each row as the converted module feeds it
    (:func:`_fed_as_module`), parts from its ``generate`` beyond ``tolerance`` at some judged step, and by half as much
    as the converted step at least (the largest difference over the judged steps); None otherwise, or when the model
    cannot be fed so. Only the model's own code is run: how far the converted step is from PyTorch fed so is given,
    not judged (a first token fed to an empty cache may take the model's multi-token path where the step's states
    are zeros)."""
    parted, own, ours, apart = False, 0.0, 0.0, 0.0
    try:
        for run in runs:
            fed = _fed_as_module(model, run, settings)
            for step, got in enumerate(run.actual):
                want, alike = run.expected[:, step].numpy(), fed[:, step].numpy()
                parted = parted or tolerance_ratio(alike, want, tolerance) > 1
                own = max(own, float(np.abs(alike.astype(np.float64) - want).max()))
                ours = max(ours, float(np.abs(got.astype(np.float64) - alike).max()))
                apart = max(apart, float(np.abs(got.astype(np.float64) - want).max()))
    except Exception as error:  # noqa: BLE001 - a model that cannot be fed so: the decoding error stands as it is
        logger.info(
            "PyTorch's model could not be fed as the converted module feeds it: %s: %s", type(error).__name__, error
        )
        return None
    logger.info(
        "fed as the module feeds it, PyTorch is %.3g from its generate, the step %.3g (%.3g from PyTorch fed so)",
        own,
        apart,
        ours,
    )
    if not parted or 2 * own < apart:
        return None
    return (
        "the model's one-token and multi-token paths differ in PyTorch itself (fed each prompt as the converted "
        "module feeds it, the same runs through its own cache, single tokens through its one-token path, PyTorch's "
        f"model is up to {own:.3g} from its generate; the converted step {apart:.3g}, and {ours:.3g} from PyTorch fed "
        "so)"
    )


def _fed_as_module(model: Any, run: _JudgedRun, settings: Settings) -> torch.Tensor:
    """PyTorch's logits [rows, steps + 1, vocab] (float32, CPU) of the prefill and the judged steps, each row (its
    tokens without its left padding, a batch of one) fed through the model's own cache in the runs the converted
    module's feed makes of the padded prompt (:func:`~pipeline.runtime.generation.feed.prompt_runs`), then
    ``chosen``'s tokens one at a time."""
    generation = settings.generation
    assert generation is not None
    ids, mask = run.prompt.ids, run.prompt.mask
    tokens, continues = generation.prompt_tokens, generation.prompt_continues
    total = ids.shape[1] + prompt_padding(ids.shape[1], generation.max_length, tokens, run.room, continues)
    runs = prompt_runs(total, generation.max_prompt or generation.max_length, tokens, continues)
    name = cache_argument(model)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    rows = []
    for row in range(ids.shape[0]):
        real = ids[row][mask[row].bool()]
        first = total - real.numel()  # left padding: the row's tokens are the last columns
        pieces = [real[max(start, first) - first : end - first] for start, end in runs if end > first]
        pieces += [token.reshape(1) for token in run.chosen[row, : len(run.actual) - 1]]
        cache, seen, logits = None, 0, []
        with torch.no_grad():
            for index, piece in enumerate(pieces):
                seen += piece.numel()
                out = model(
                    input_ids=piece.unsqueeze(0).to(device),
                    attention_mask=torch.ones(1, seen, dtype=torch.int64, device=device),
                    use_cache=True,
                    **({name: cache} if cache is not None else {}),
                )
                cache = cache_of(out)
                if index >= len(pieces) - len(run.actual):
                    logits.append(out.logits[0, -1].float().cpu())
        rows.append(torch.stack(logits))
    return torch.stack(rows)
