"""One request's text steps of a converted vision-language decoder
(:class:`~pipeline.runtime.generation.vision_language.VisionLanguageModule`): the prompts prefilled with their image
features (and deepstack levels), then one token per row and step, the cache moved for beam search; and the names of
the step's inputs that carry them.

The prompts are prefilled once each, then their cache rows are repeated for each prompt's beams or drawn sequences.
Decode steps place no image: their features are the image token's own text embedding (one row per batch row), and
their deepstack levels zeros. A step of one token (a text model with recurrent states) is fed the prompts column by
column, a column's features the rows of its image tokens (:func:`feature_order`). On ONNX Runtime the cache stays in
bound buffers written in place (:func:`~pipeline.runtime.generation.runners.bound_runner`); on a TensorRT engine the
feed copies it in and out of each step.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from converters.generation_settings import GenerationSettings
from pipeline.runtime.generation.feed import evict, padded_prompt, prompt_padding, prompt_runs
from pipeline.runtime.generation.image_positions import ImagePositions, feature_order
from pipeline.runtime.generation.layout import cache_layout
from pipeline.runtime.generation.request import check_room
from pipeline.runtime.generation.runners import CopiedNames, RowsOfTwoCaches, bound_runner
from pipeline.runtime.module import ConvertedModule

#: The step's input holding the prompt's image features [image tokens, hidden].
IMAGE_FEATURES = "image_features"
#: Gemma 3's and PaliGemma's token types (1 at image tokens): the prefill's image tokens attend to each other both
#: ways; a step converted from a sample with them takes them after the image features.
TOKEN_TYPES = "token_type_ids"
#: The modality types a model's prefill reads (Gemma 4's ``mm_token_type_ids``: its image tokens attend to each other
#: both ways); the step derives them from the image tokens (``pipeline.generation.text_model.modality_blocks``).
MODALITY_TYPES = "mm_token_type_ids"
#: The step's inputs (and the vision graph's outputs) of deepstack levels, each [image tokens, hidden]
#: (:func:`deepstack_name`): features the model adds inside its decoder layers at the image tokens (Qwen3-VL's).
DEEPSTACK = "deepstack_features"


def deepstack_name(level: int) -> str:
    """The name of deepstack level ``level``'s input of the step and output of the vision graph."""
    return f"{DEEPSTACK}.{level}"


class FedModule(Protocol):
    """What a :class:`VisionFeed` reads of its module
    (:class:`~pipeline.runtime.generation.vision_language.VisionLanguageModule`, which documents each)."""

    step: ConvertedModule
    image_token_id: int | None
    positions: ImagePositions | None
    modality: str
    one_token: bool
    placement: str | None
    token_embedding: torch.Tensor
    _step_inputs: tuple[str, ...]
    _layer_names: tuple[str, ...]
    _presents: tuple[str, ...]
    _levels: tuple[str, ...]
    _cache_shapes: list[tuple[int, ...]]
    _cache_dtypes: list[torch.dtype]

    @property
    def generation(self) -> GenerationSettings:
        """The step's generation settings."""


class VisionFeed(RowsOfTwoCaches):
    """One request's text steps: ``prefill()`` the prompts with their image features (each prompt once, its cache row
    then repeated ``expand`` times), then ``step(tokens)``; ``reorder(rows)`` moves the cache rows (beam search)."""

    def __init__(
        self,
        module: FedModule,
        ids: torch.Tensor,
        mask: torch.Tensor,
        features: torch.Tensor,
        expand: int,
        levels: dict[str, torch.Tensor] | None = None,
        room: int = 1,
    ) -> None:
        self.module = module
        self.ids = ids.repeat_interleave(expand, dim=0)
        self.capacity = module.generation.max_length
        #: a recurrent text model's prompt graph's tokens per run (0: none): the prompts are left-padded to whole runs
        #: when that leaves ``room`` for the new tokens (:func:`~pipeline.runtime.generation.feed.prompt_padding`)
        prompt_graph = getattr(module.step, "prompt_graph", None)
        self.run_tokens = getattr(module.step, "run_tokens", 0)
        continues = module.generation.prompt_continues
        pad = prompt_padding(ids.shape[1], self.capacity, self.run_tokens, room, continues) if module.one_token else 0
        ids, mask = padded_prompt(ids, mask, pad, module.image_token_id)
        self.prompts, self.prompt_mask, self.features, self.expand = ids, mask, features, expand
        #: the prompts' deepstack levels by name (the step's inputs)
        self.levels = dict(levels or {})
        rows = self.ids.shape[0]
        #: the cache positions the prompts take (their tokens and any padding before them)
        self.prompt = ids.shape[1]
        self.mask = torch.zeros(rows, self.capacity, dtype=torch.int64)
        self.mask[:, : self.prompt] = mask.repeat_interleave(expand, dim=0)
        # each prompt's next position, repeated for its rows (a rule that counts the request's images counts the
        # prompts', as the model's generate does before it repeats them)
        self.next_position = prompt_positions(module, ids, mask)[1].repeat_interleave(expand, dim=0)
        self.cache: list[torch.Tensor] = []
        self.length = 0
        # a decode step's features: as many rows as rows may generate the image token, each its own embedding
        self.no_features = module.token_embedding.expand(rows, -1).contiguous()
        #: a decode step's deepstack levels: zeros (the model adds none after the prompt)
        self.no_levels = {name: torch.zeros_like(self.no_features) for name in module._levels}
        #: on ONNX Runtime the cache stays in bound buffers written in place (a decode step's features bound once)
        layout = cache_layout(module.step.io, module.generation.layers)
        self.runner = bound_runner(module.step.executor, layout, prompt_graph.executor if prompt_graph else None)
        if self.runner is not None:
            self.runner.start(rows)
            self.held = {
                IMAGE_FEATURES: self.no_features.numpy(),
                **{name: zeros.numpy() for name, zeros in self.no_levels.items()},
            }
        #: the prompts' token types (a step that takes them); a decode step's are zeros, as transformers passes none
        self.types: torch.Tensor | None = None
        #: the prompts' image marks (a step that takes them: :attr:`VisionLanguageModule.placement`); a decode step's
        #: are zeros (no image is placed after the prompt)
        self.marked: torch.Tensor | None = None

    def prefill(self) -> torch.Tensor:
        """The prompts with their image features through the step; the logits after their last token."""
        rows = self.prompts.shape[0]
        mask = torch.zeros(rows, self.capacity, dtype=torch.int64)
        mask[:, : self.prompt] = self.prompt_mask
        positions = prompt_positions(self.module, self.prompts, self.prompt_mask)[0]
        features = self.features if self.features.shape[0] else self.no_features[:1]
        levels = {name: level if level.shape[0] else self.no_levels[name][:1] for name, level in self.levels.items()}
        if self.module.one_token:
            logits = self._prefill_by_token(mask, positions)
        elif self.runner is not None:
            extra = {IMAGE_FEATURES: features.numpy(), **self._per_token(self.types, self.marked)}
            extra.update({name: level.numpy() for name, level in levels.items()})
            logits = self.runner.prefill_leading(self.prompts, mask, positions, extra).float()
            self.length += self.prompts.shape[1]
        else:
            self.cache = [
                torch.zeros((rows, *shape), dtype=dtype)
                for shape, dtype in zip(self.module._cache_shapes, self.module._cache_dtypes, strict=True)
            ]
            logits = self._run(self.prompts, mask, positions, features, self.types, self.marked, levels)
        if self.expand > 1:
            self.reorder(torch.arange(rows).repeat_interleave(self.expand))
            logits = logits.repeat_interleave(self.expand, dim=0)
        return logits

    def _prefill_by_token(self, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The prompts through a one-token step, column by column, or, with a prompt graph, run by run
        (:func:`~pipeline.runtime.generation.feed.prompt_runs`): a run's features are the rows of the image features
        of its image tokens, row after row (the n-th image token of the prompts, row after row, takes the n-th row, as
        the model's ``masked_scatter`` places them)."""
        rows, tokens = self.prompts.shape
        token = self.module.image_token_id
        assert token is not None  # a one-token step has one (the conversion refuses a model without)
        is_image = (self.prompts == token) & (self.prompt_mask != 0)
        order = feature_order(is_image).reshape(rows, tokens)
        if self.runner is None:
            self.cache = [
                torch.zeros((rows, *shape), dtype=dtype)
                for shape, dtype in zip(self.module._cache_shapes, self.module._cache_dtypes, strict=True)
            ]
        logits = torch.empty(0)
        for start, end in prompt_runs(tokens, 1, self.run_tokens, self.module.generation.prompt_continues):
            placed = is_image[:, start:end]
            features = self.features[order[:, start:end][placed]] if bool(placed.any()) else self.no_features[:1]
            ids, laid = self.prompts[:, start:end], positions[..., start:end]
            if self.runner is not None and rows > 1 and end - start > 1 and start > 0:
                logits = self.runner.prefill_rows(
                    [self._row_run(row, ids, mask, laid, start, order[:, start:end], placed) for row in range(rows)]
                ).float()
                self.length += end - start
            elif self.runner is not None:
                extra = {IMAGE_FEATURES: features.numpy()}
                logits = self.runner.prefill_leading(ids, mask, laid, extra, past_length=start).float()
                self.length += end - start
            else:
                logits = self._run(ids, mask, laid, features)
        return logits

    def _row_run(
        self,
        row: int,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        start: int,
        order: torch.Tensor,
        placed: torch.Tensor,
    ) -> dict[str, Any]:
        """Row ``row``'s inputs of a run after the first (its ids, mask, positions and its own image features)."""
        mine = placed[row]
        features = self.features[order[row][mine]] if bool(mine.any()) else self.no_features[:1]
        laid = positions[row : row + 1] if positions.dim() == 2 else positions[:, row : row + 1]
        return {
            "input_ids": ids[row : row + 1].numpy(),
            "attention_mask": mask[row : row + 1].numpy(),
            "position_ids": laid.numpy(),
            "past_length": np.array(start, dtype=np.int64),
            IMAGE_FEATURES: features.numpy(),
        }

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One new token per row [rows]."""
        check_room(self.length, self.capacity)
        self.mask[:, self.length] = 1
        evict(self.mask, self.prompt, self.length, self.module.generation.kept_window)
        zeros = torch.zeros_like(tokens[:, None]) if self.types is not None else None
        unmarked = torch.zeros_like(tokens[:, None]) if self.marked is not None else None
        positions = self.next_position
        if self.module.positions is not None:  # a new token is text: the same position on every axis
            positions = positions.unsqueeze(0).expand(self.module.positions.axes, -1, -1)
        if self.runner is not None:
            extra = {**self.held, **self._per_token(zeros, unmarked)}
            logits = self.runner.run(tokens[:, None], self.mask, positions, self.length, extra).float()
            self.length += 1
        else:
            logits = self._run(tokens[:, None], self.mask, positions, self.no_features, zeros, unmarked, self.no_levels)
        self.next_position = self.next_position + 1
        return logits

    def _per_token(self, types: torch.Tensor | None, marked: torch.Tensor | None) -> dict[str, Any]:
        named = {} if types is None else {TOKEN_TYPES: types.numpy()}
        if marked is not None and self.module.placement is not None:
            named[self.module.placement] = marked.numpy()
        return named

    def _run(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        features: torch.Tensor,
        types: torch.Tensor | None = None,
        marked: torch.Tensor | None = None,
        levels: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        module = self.module
        named = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, IMAGE_FEATURES: features}
        named.update(levels or {})
        if types is not None:
            named[TOKEN_TYPES] = types
        if marked is not None and module.placement is not None:
            named[module.placement] = marked
        names = CopiedNames(module._step_inputs, module._layer_names, module._presents)
        # a run of several tokens of a one-token step: its prompt graph's
        graph = getattr(module.step, "prompt_graph", None) if ids.shape[1] > 1 and module.one_token else module.step
        assert graph is not None
        return self.copied_step(graph, names, named)


def prompt_positions(module: FedModule, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts' positions ([rows, tokens], or [axes, rows, tokens] laid out by the module's image positions) and
    each row's next position [rows, 1]."""
    if module.positions is None:
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        return positions, positions[:, -1:] + 1
    laid = module.positions.prompt(ids, mask, item=module.modality)
    return laid, ImagePositions.next_positions(laid, mask)
