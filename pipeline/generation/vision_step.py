"""The cached text step of a vision-language decoder (:mod:`pipeline.generation.vision_language`):
:class:`VisionLanguageStep`, the decoder-only step (:class:`~pipeline.generation.step.CachedStep`) with one more
input, ``image_features`` [image tokens, hidden], placed at the model's image tokens (or where its own per-token marks
say), and the step's sample, dimensions and profiles.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from converters.generation_settings import GenerationSettings
from converters.settings import ProfileRange
from pipeline.generation.deepstack import DeepstackLevels, added_after_layers
from pipeline.generation.recurrent_state import RecurrentStep, StateLayer, cache_names
from pipeline.generation.step import CachedStep
from pipeline.runtime.generation.feed import padded_prompt
from pipeline.runtime.generation.image_positions import ImagePositions, feature_order, gathered_rows
from pipeline.runtime.generation.layout import CachedLayer
from pipeline.runtime.generation.vision_feed import IMAGE_FEATURES, MODALITY_TYPES, TOKEN_TYPES, deepstack_name
from pipeline.settings import DynamicDim

logger = logging.getLogger(__name__)


class VisionLanguageStep(CachedStep):
    """The cached text step with the prompt's image features (see the module docstring).

    ``forward(input_ids, attention_mask, position_ids, past_length, image_features, *past)``. With the model's
    ``image_token`` known, the features replace the embeddings of the image tokens, in order (what the model's
    ``masked_scatter`` does, written as a gather: no ``NonZero``, which TensorRT's parser refuses), and the model is
    called with the embeddings; without it, the features are handed to the model as its multimodal encoder's output
    (``listed``: as a list, LLaVA's ``pooler_output``), and the model places them itself. With ``deepstack`` (and the
    ``text_model`` whose decoder layers it names), the step takes one more input per level after ``image_features``
    (:func:`~pipeline.runtime.generation.vision_language.deepstack_name`, [image tokens, hidden]; a decode step's are
    zeros), added where the model adds them (after those layers, or before the first) at the image tokens by the
    same gather (:func:`~pipeline.generation.deepstack.added_after_layers`)."""

    placeholder_ids: torch.Tensor
    placeholder_rows: torch.Tensor

    def __init__(
        self,
        model: torch.nn.Module,
        layers: int,
        use_interface: bool,
        listed: bool,
        image_token: int | None,
        typed: bool = False,
        placement: str | None = None,
        deepstack: DeepstackLevels | None = None,
        text_model: torch.nn.Module | None = None,
        indexed: Mapping[int, Sequence[str]] | None = None,
    ) -> None:
        super().__init__(model, layers, use_interface, indexed)
        self.deepstack = deepstack if deepstack is not None and deepstack.after else None
        #: the decoder whose layers the deepstack levels are added after (not a submodule: it is ``model``'s)
        self._text_model = [text_model] if text_model is not None else []
        self.listed = listed
        self.image_token = image_token
        #: ``token_type_ids`` [B, S] is an input after ``image_features`` (the model's forward takes them): zeros in
        #: a decode step, the prompt's in the prefill
        self.typed = typed
        self.prefill_masks = typed
        #: the model's per-token input marking the image tokens (Kosmos-2's ``image_embeds_position_mask``), an input
        #: after ``image_features`` (before the token types): the prompt's in the prefill, zeros in a decode step
        self.placement = placement
        #: the model is handed ``input_ids`` and the features are placed in its input embedding's output at the image
        #: tokens (:func:`~pipeline.generation.text_model.ids_placed`: it refuses ``inputs_embeds`` alone)
        self.ids_placed = False
        #: with :attr:`ids_placed`, the module (one, not a submodule: it is ``model``'s) whose handed ``inputs_embeds``
        #: the features are placed in rather than the input embedding's output: the model embeds its ids otherwise
        #: (:func:`~pipeline.generation.placement_check.embeddings_receiver`: Gemma 3n's)
        self.placed_at: list[torch.nn.Module] = []
        #: the model reads its image tokens' modality types (``mm_token_type_ids``) in a prefill
        #: (:func:`~pipeline.generation.text_model.modality_blocks`): this value at the image tokens of a prefill (the
        #: step at position 0), zeros after (transformers' decode steps hand none)
        self.modality_kind: int | None = None
        #: placeholder ids the model embeds as another row than their own, and those rows
        #: (:func:`~pipeline.generation.placeholders.placeholder_rows`): a decode step that generates one embeds it so
        self.register_buffer("placeholder_ids", torch.zeros(0, dtype=torch.int64), persistent=False)
        self.register_buffer("placeholder_rows", torch.zeros(0, 1), persistent=False)
        self.name_inputs(self.cache_names())

    def name_inputs(self, cache: list[str]) -> None:
        """The graph names of the inputs after ``image_features``: the per-token inputs, then the ``cache``'s."""
        stacked = [deepstack_name(level) for level in self.deepstack.levels] if self.deepstack else []
        firsts = stacked + ([self.placement] if self.placement else []) + ([TOKEN_TYPES] if self.typed else [])
        self.onnx_input_names = {f"rest_{i}": name for i, name in enumerate(firsts + cache)}

    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_length: torch.Tensor,
        image_features: torch.Tensor,
        *rest: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """The step: logits of the last position and the updated cache (``rest``: the deepstack levels, the marks
        when :attr:`placement`, the token types when :attr:`typed`, then the cache). The deepstack levels are added
        after the decoder layers the model adds them at (:func:`~pipeline.generation.deepstack.added_after_layers`)."""
        added: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if self.deepstack is not None:
            count = len(self.deepstack.levels)
            levels, rest = list(rest[:count]), rest[count:]
            is_image = torch.eq(input_ids, self._image_token())
            added = added_after_layers(self._text_model[0], self.deepstack, is_image, levels)
        marked, rest = (rest[0], rest[1:]) if self.placement else (None, rest)
        types, past = (rest[0], rest[1:]) if self.typed else (None, rest)
        given = {} if types is None else {TOKEN_TYPES: types}
        if self.modality_kind is not None:
            blocks = torch.eq(input_ids, self._image_token()) & torch.eq(past_length, 0)
            given[MODALITY_TYPES] = blocks.to(torch.int64) * self.modality_kind
        with added:
            if marked is not None:
                tokens = {"input_ids": input_ids}
                if self.placement in inspect.signature(self.model.forward).parameters:
                    # the model reads the marks too (Kosmos-2.5's segment embedding of the image tokens); without
                    # the image's features it places none itself
                    tokens[str(self.placement)] = marked
                with placed_in_embeddings(self.model, marked != 0, image_features):
                    return self.run(tokens, attention_mask, position_ids, past_length, past)
            if self.ids_placed:
                at = self.placed_at[0] if self.placed_at else None
                with placed_in_embeddings(self.model, torch.eq(input_ids, self._image_token()), image_features, at):
                    return self.run({"input_ids": input_ids, **given}, attention_mask, position_ids, past_length, past)
            inputs = self._inputs(input_ids, image_features)
            return self.run({**inputs, **given}, attention_mask, position_ids, past_length, past)

    def _image_token(self) -> int:
        """The image token's id (-1, no token, where the config names none: nothing is placed by it)."""
        return self.image_token if self.image_token is not None else -1

    def _inputs(self, input_ids: torch.Tensor, image_features: torch.Tensor) -> dict[str, Any]:
        """The model's inputs for the tokens and the features (see the class docstring)."""
        if self.image_token is None:
            from transformers.modeling_outputs import BaseModelOutputWithPooling

            pooled: Any = [image_features] if self.listed else image_features
            return {
                "input_ids": input_ids,
                "mm_encoder_outputs": {"image": BaseModelOutputWithPooling(pooler_output=pooled)},
            }
        embeddings = self.model.get_input_embeddings()(input_ids)  # type: ignore[operator]
        if self.placeholder_ids.numel():  # placeholders the model embeds as another row (Muse Spark's: id 0's)
            match = torch.eq(input_ids.unsqueeze(-1), self.placeholder_ids)
            rows = torch.matmul(match.to(embeddings.dtype), self.placeholder_rows.to(embeddings.dtype))
            embeddings = torch.where(match.any(-1, keepdim=True), rows, embeddings)
        return {"inputs_embeds": placed_features(embeddings, input_ids == self.image_token, image_features)}


class RecurrentVisionLanguageStep(RecurrentStep, VisionLanguageStep):
    """:class:`VisionLanguageStep` of a text model whose cache holds recurrent states: the one-token step of
    :class:`~pipeline.generation.recurrent_state.RecurrentStep` (a prompt of n tokens is n steps), its token's embedding
    replaced by a row of ``image_features`` where the token is the image token. The features hold one row per batch
    row whose token is an image token, in row order (the prompt's image features taken in the order the model's
    ``masked_scatter`` places them; a decode step's: the image token's own embedding), and the same gather places
    them. ``*past`` is each layer's tensors in :func:`~pipeline.generation.recurrent_state.cache_names` order."""

    def __init__(
        self,
        model: torch.nn.Module,
        layout: Sequence[CachedLayer | StateLayer],
        use_interface: bool,
        listed: bool,
        image_token: int,
    ) -> None:
        VisionLanguageStep.__init__(self, model, len(layout), use_interface, listed, image_token)
        self.layout = tuple(layout)
        self.name_inputs(cache_names(self.layout))


def placed_features(embeddings: torch.Tensor, is_image: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """``embeddings`` [B, S, hidden] with the n-th marked token (row after row) taking the n-th row of ``features``
    (:func:`gathered_rows`)."""
    return torch.where(is_image.unsqueeze(-1), gathered_rows(features, is_image, embeddings), embeddings)


@contextlib.contextmanager
def placed_in_embeddings(
    model: torch.nn.Module, is_image: torch.Tensor, features: torch.Tensor, at: torch.nn.Module | None = None
) -> Iterator[None]:
    """Within the block, the model's input embedding gives the image features at the marked tokens: the model is
    called with its ``input_ids`` (from which it may compute its own positions) and finds the features where it
    would place them itself (Kosmos-2 places them before it scales the embeddings, as this does). With ``at``, the
    features are placed in the ``inputs_embeds`` the model's forward hands that module instead (what its forward
    makes of its ids, the features where it places them)."""

    def place(_module: torch.nn.Module, _args: Any, out: torch.Tensor) -> torch.Tensor:
        return placed_features(out, is_image, features)

    def handed(_module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return args, {**kwargs, "inputs_embeds": placed_features(kwargs["inputs_embeds"], is_image, features)}

    if at is not None:
        handle = at.register_forward_pre_hook(handed, with_kwargs=True)
    else:
        handle = model.get_input_embeddings().register_forward_hook(place)  # type: ignore[operator]
    try:
        yield
    finally:
        handle.remove()


def step_sample(
    text: dict[str, torch.Tensor],
    features: torch.Tensor,
    layout: Sequence[CachedLayer | StateLayer],
    generation: GenerationSettings,
    laid: ImagePositions | None = None,
    placement: str | None = None,
    levels: dict[str, torch.Tensor] | None = None,
) -> tuple[Any, tuple[DynamicDim, ...]]:
    """The step's sample (the sample's prompts prefilled with their image features) and its dynamic dimensions: the
    batch, the sequence and the image tokens. With ``laid``, positions have an axis dimension first; with
    ``placement``, the step takes that per-token input after the features; ``levels``: the deepstack levels the step
    takes after the features, by input name (every image's, [image tokens, hidden])."""
    stacked = dict(levels or {})
    ids, mask, types = text["input_ids"], text["attention_mask"], text.get(TOKEN_TYPES)
    marked = text[placement] if placement else None
    if ids.shape[0] == 1 and generation.max_batch >= 2:  # the export specialises a batch of 1: the row twice
        ids, mask, features = ids.expand(2, -1).clone(), mask.expand(2, -1).clone(), features.repeat(2, 1)
        stacked = {name: level.repeat(2, 1) for name, level in stacked.items()}
        types = types.expand(2, -1).clone() if types is not None else None
        marked = marked.expand(2, -1).clone() if marked is not None else None
    rows, steps = ids.shape
    capacity = generation.max_length
    full = torch.zeros(rows, capacity, dtype=torch.int64)
    full[:, :steps] = mask
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1) if laid is None else laid.prompt(ids, mask)
    past = [tensor for layer in layout for tensor in layer.storage(rows, capacity)]
    typed = [types] if types is not None else []
    per_token = ([marked] if marked is not None else []) + typed
    start = torch.tensor(0, dtype=torch.int64)
    sample: Any = ((ids, full, positions, start, features, *stacked.values(), *per_token, *past), {})
    token_inputs = ([placement] if placement else []) + ([TOKEN_TYPES] if typed else [])
    names = ["input_ids", "attention_mask", "position_ids", *token_inputs]
    names += cache_names(layout)
    longest = generation.max_prompt or capacity
    dims: list[DynamicDim] = []
    axis = {"position_ids": 0 if laid is None else 1}  # the positions' batch axis
    if generation.max_batch >= 2:
        dims += [DynamicDim(name, axis.get(name, 0), "batch", 1, rows, generation.max_batch) for name in names]
    sequences = ("input_ids", "position_ids", *token_inputs)
    dims += [DynamicDim(name, axis.get(name, 0) + 1, "sequence", 1, steps, longest) for name in sequences]
    most = max(longest * generation.max_batch, features.shape[0])
    for name in (IMAGE_FEATURES, *stacked):
        dims.append(DynamicDim(name, 0, "image_tokens", 1, int(features.shape[0]), most))
    return sample, tuple(dims)


def one_token_sample(
    text: dict[str, torch.Tensor],
    features: torch.Tensor,
    layout: Sequence[CachedLayer | StateLayer],
    generation: GenerationSettings,
    token: int,
    laid: ImagePositions | None = None,
) -> tuple[Any, tuple[DynamicDim, ...]]:
    """The sample of :class:`RecurrentVisionLanguageStep` and its dynamic dimensions (the batch and the rows of
    features): each prompt's first image token (its first token when it has none) as the first step over zero states,
    with its feature row, at its position in the prompt."""
    ids, mask = text["input_ids"], text["attention_mask"]
    is_image = ids == token
    order = feature_order(is_image).reshape(ids.shape)
    columns = torch.where(is_image.any(-1), is_image.to(torch.int64).argmax(-1), 0)
    rows = torch.arange(ids.shape[0])
    chosen = is_image[rows, columns]
    step_features = features[order[rows, columns][chosen]] if bool(chosen.any()) else features[:1]
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1) if laid is None else laid.prompt(ids, mask)
    step_positions = positions[..., rows, columns].unsqueeze(-1)
    step_ids = ids[rows, columns].unsqueeze(-1)
    if ids.shape[0] == 1 and generation.max_batch >= 2:  # the export specialises a batch of 1: the row twice
        step_ids, step_features = step_ids.expand(2, -1).clone(), step_features.repeat(2, 1)
        step_positions = torch.cat([step_positions, step_positions], dim=-2)
    run_mask = torch.ones_like(step_ids)
    return _states_sample(step_ids, run_mask, step_positions, step_features, layout, generation, laid, 1)


def _states_sample(
    ids: torch.Tensor,
    run_mask: torch.Tensor,
    positions: torch.Tensor,
    features: torch.Tensor,
    layout: Sequence[CachedLayer | StateLayer],
    generation: GenerationSettings,
    laid: ImagePositions | None,
    tokens: int,
) -> tuple[Any, tuple[DynamicDim, ...]]:
    """A sample of :class:`RecurrentVisionLanguageStep` over zero states (``ids`` [batch, ``tokens``] the first
    tokens, ``run_mask`` theirs) and its dynamic dimensions: the batch (up to ``max_batch``) and the rows of features
    (up to ``max_batch`` x ``tokens``)."""
    batch = int(ids.shape[0])
    capacity = generation.max_length
    full = torch.zeros(batch, capacity, dtype=torch.int64)
    full[:, :tokens] = run_mask
    past = [tensor for layer in layout for tensor in layer.storage(batch, capacity)]
    sample: Any = ((ids, full, positions, torch.tensor(0, dtype=torch.int64), features, *past), {})
    dims: list[DynamicDim] = []
    if generation.max_batch >= 2:
        axis = 0 if laid is None else 1  # the positions' batch axis
        names = ["input_ids", "attention_mask", "position_ids", *cache_names(layout)]
        dims += [
            DynamicDim(name, axis if name == "position_ids" else 0, "batch", 1, batch, generation.max_batch)
            for name in names
        ]
    most = generation.max_batch * tokens
    if most >= 2:
        rows_of_features = min(int(features.shape[0]), most)
        dims.append(DynamicDim(IMAGE_FEATURES, 0, "image_tokens", 1, rows_of_features, most))
    return sample, tuple(dims)


def runs_sample(
    text: dict[str, torch.Tensor],
    features: torch.Tensor,
    layout: Sequence[CachedLayer | StateLayer],
    generation: GenerationSettings,
    token: int,
    laid: ImagePositions | None = None,
) -> tuple[Any, tuple[DynamicDim, ...]]:
    """The sample of :class:`RecurrentVisionLanguageStep` as its prompt graph takes it
    (:mod:`pipeline.generation.prompt_graph`), and its dynamic dimensions (the batch and the rows of features): the
    first run of ``generation.prompt_tokens`` tokens of the sample's prompts left-padded to whole runs, over zero
    states, with the features of the image tokens in it (row after row)."""
    tokens = generation.prompt_tokens
    ids, mask = text["input_ids"], text["attention_mask"]
    ids, mask = padded_prompt(ids, mask, -ids.shape[1] % tokens, token)
    is_image = (ids == token) & (mask != 0)
    order = feature_order(is_image).reshape(ids.shape)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1) if laid is None else laid.prompt(ids, mask)
    run_ids, run_mask, run_positions = ids[:, :tokens], mask[:, :tokens], positions[..., :tokens]
    placed = is_image[:, :tokens]
    run_features = features[order[:, :tokens][placed]] if bool(placed.any()) else features[:2]
    if ids.shape[0] == 1 and generation.max_batch >= 2:  # the export specialises a batch of 1: the row twice
        run_ids, run_mask = run_ids.expand(2, -1).clone(), run_mask.expand(2, -1).clone()
        run_positions = torch.cat([run_positions, run_positions], dim=-2)
        run_features = run_features.repeat(2, 1) if bool(placed.any()) else run_features
    return _states_sample(run_ids, run_mask, run_positions, run_features, layout, generation, laid, tokens)


def fit_mask(step: VisionLanguageStep, sample: Any) -> None:
    """Whether the model builds its own mask over the keys it has seen rather than over the static cache (Kosmos-2's
    additive mask over past and new keys): the step run once eagerly on its sample fails with the cache-wide mask
    and runs with the step's own (:attr:`~pipeline.generation.step.CachedStep.own_mask`). Such a model decides in
    Python from the cache's length (``if cache_length > 0``), and may grow tables lazily from it (Kosmos-2's
    sinusoidal positions): the step is run once more over a longer cache, at its end, so that the export finds the
    table long enough, and the export traces the model's branches on the length on their general side
    (:meth:`~pipeline.generation.step.CachedStep.run`)."""
    args, _ = sample
    with torch.no_grad():
        try:
            step(*args)
            return
        except (RuntimeError, TypeError) as error:
            failure = error
        step.own_mask = True
        try:
            step(*args)
        except Exception:  # noqa: BLE001 - neither mask: the export says why, on the model's own mask
            step.own_mask = False
            return
        # a lazily grown table covers every length the trace may compare with it (the prompt's and the cache's
        # longest together): the step run once over a cache twice as long, at its end
        rows, steps, longer = int(args[0].shape[0]), int(args[0].shape[1]), 2 * int(args[1].shape[-1])
        cache = args[len(args) - 2 * step.layers :]
        cache = tuple(torch.zeros((*t.shape[:-2], longer, t.shape[-1]), dtype=t.dtype) for t in cache)
        mask = torch.ones(rows, longer, dtype=torch.int64)
        length = torch.tensor(longer - steps, dtype=torch.int64)
        step(args[0], mask, args[2], length, *args[4 : len(args) - 2 * step.layers], *cache)
    logger.info(
        "vision-language: %s builds its own mask over the keys it has seen (%s: %.120s): the step's attention takes "
        "the step's causal mask over the cache",
        type(step.model).__name__,
        type(failure).__name__,
        str(failure),
    )


def step_profiles(dims: tuple[DynamicDim, ...], generation: GenerationSettings) -> tuple[tuple[ProfileRange, ...], ...]:
    """Context (the prompt with its images) and generation (one token, one row of zeros for features)."""
    longest = generation.max_prompt or generation.max_length
    images = next(d for d in dims if d.name == "image_tokens")
    context = (
        ProfileRange("sequence", 1, min(longest, 64), longest),
        ProfileRange("image_tokens", 1, images.opt, images.max),
    )
    rows = ProfileRange("image_tokens", 1, 1, generation.max_batch)  # a decode step: one embedding row per batch row
    return (context, (ProfileRange("sequence", 1, 1, 1), rows))
