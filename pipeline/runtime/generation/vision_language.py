"""A converted vision-language decoder (LLaVA, Gemma 3, ...): the vision graph run once per image of a request, then
the cached text step, with ``generate()`` as transformers' ``model.generate``.

The vision graph gives each image's features in the text embedding space; the prompts' prefill hands them all to the
step, which places them at the image tokens (as ``model.generate``'s first step does with ``pixel_values``). The prompts
are prefilled once each, then their cache rows are repeated for each prompt's beams or drawn sequences (transformers
prefills the repeated rows: the same numbers). Decode steps place no image: their features are the image token's own
text embedding (one row per batch row), so that a generated image token stays what the model's embedding makes it.
Deepstack levels (Qwen3-VL's), when the step takes them, come from the vision graph with the features and go to the
prefill; a decode step's are zeros. A step of one token (a text model with recurrent states: ``max_prompt`` 1) is fed
the prompts column by column, a column's features the rows of its image tokens (row after row, as ``masked_scatter``
orders them). The decoding loop, the options, the processors and beam search are the decoder-only module's
(:mod:`pipeline.runtime.generation.module`); only the feed differs. On ONNX Runtime the cache stays in bound buffers
written in place (:func:`~pipeline.runtime.generation.runners.bound_runner`, as the encoder-decoder's); on a TensorRT
engine the feed copies it in and out of each step.

An audio-language decoder (Voxtral, GLM-ASR: audio features placed at its audio token) is the same module over its
audio: :attr:`~VisionLanguageModule.modality` ``"audio"``, which its errors name ("audio tokens"); "image" below is one
item of the module's modality.

Saved as a directory (``module.save("out/llava")``): ``vision.ptrt`` and ``step.ptrt``, each a whole artifact, and
``vision_language.json`` (the image token, its embedding, the modality and its placeholder's name); ``pipeline.load(
"out/llava")`` reads them (a directory saved without the modality: images).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import torch

from converters.errors import ArtifactError, InputError
from pipeline.runtime.generation.image_positions import ImagePositions, image_rows
from pipeline.runtime.generation.item_runs import check_item_runs
from pipeline.runtime.generation.kept_images import FEATURES, kept_features
from pipeline.runtime.generation.layout import STEP_INPUTS, cache_layout
from pipeline.runtime.generation.options import GenerateOptions, generate_options
from pipeline.runtime.generation.request import Decoding, resolve
from pipeline.runtime.generation.saved_directory import save_directory
from pipeline.runtime.generation.source_and_step import decode, generate_over
from pipeline.runtime.generation.two_graphs import TwoGraphModule
from pipeline.runtime.generation.vision_feed import DEEPSTACK, IMAGE_FEATURES, TOKEN_TYPES, VisionFeed
from pipeline.runtime.module import ConvertedModule

#: Which tokens of the prompt are images (M-RoPE models' processors give it; the module reads the image tokens).
MODALITIES = "mm_token_type_ids"
#: The files of a saved vision-language directory.
VISION_FILE, STEP_FILE, META_FILE = "vision.ptrt", "step.ptrt", "vision_language.json"
#: The main input of each modality's features (the features graph's first input).
MAIN_INPUTS = {"image": ("pixel_values", "flattened_patches"), "audio": ("input_features", "input_values")}
#: transformers' ``mm_token_type_ids`` of a modality's tokens (text 0, image 1, video 2, audio 3).
_TYPE_IDS = {"image": 1, "video": 2, "audio": 3}


class VisionLanguageModule(TwoGraphModule):
    """A vision-language decoder converted for generation (``pipeline.convert(llava, {"input_ids": ...,
    "attention_mask": ..., "pixel_values": ...}, generation={...})``).

    ``generate(input_ids, attention_mask=..., pixel_values=..., **options)`` returns the prompts followed by the new
    tokens, as ``model.generate`` does; :meth:`stream` yields the new tokens. ``.vision`` and ``.step`` are the two
    converted graphs.

    >>> module.generate(input_ids, attention_mask=mask, pixel_values=pixels, max_new_tokens=32)  # doctest: +SKIP
    """

    def __init__(
        self,
        vision: ConvertedModule,
        step: ConvertedModule,
        image_token_id: int | None,
        token_embedding: torch.Tensor | None = None,
        fixed_inputs: dict[str, torch.Tensor] | None = None,
        positions: ImagePositions | None = None,
        modality: str = "image",
        placeholder: str | None = None,
        own_runs: bool = False,
    ) -> None:
        super().__init__()
        self.vision = vision
        self.step = step
        self.image_token_id = image_token_id
        #: image inputs the vision graph holds at one image's values (LLaVA-NeXT's ``image_sizes``): each image's
        #: must be the same
        self.fixed_inputs = dict(fixed_inputs or {})
        #: how the prompt's positions are laid out on several axes (M-RoPE: Qwen2-VL's), None for one axis
        self.positions = positions
        #: what the features graph takes, as the errors name it: ``"image"``, or ``"audio"`` (an audio-language
        #: decoder's, :data:`pipeline.generation.vision_inputs.AUDIO`)
        self.modality = modality
        #: the name of the token the features are placed at (``"{placeholder}_token_id"`` in the model's config):
        #: the modality's, or ``"video"`` for a model whose images are a video's frames (InstructBLIP-Video's)
        self.placeholder = placeholder or modality
        #: the features graph gives each item's features in a prompt of its own (MusicFlamingo's: the model's depend
        #: on the item's place within its run of placeholder tokens): a run must hold one item's features
        #: (:mod:`pipeline.runtime.generation.item_runs`)
        self.own_runs = own_runs
        generation = step.settings.generation
        step_inputs = tuple(spec.name for spec in step.io.inputs)
        if generation is None or IMAGE_FEATURES not in step_inputs or not set(STEP_INPUTS) <= set(step_inputs):
            raise ArtifactError(
                "the step of a vision-language module must be a text step converted with generation= of a "
                "vision-language model (with an image_features input)",
                fix="load a directory written by VisionLanguageModule.save",
            )
        self._vision_inputs = tuple(spec.name for spec in vision.io.inputs)
        #: the vision graph's outputs: the features, and, for a graph for TensorRT that takes the model's own masks as
        #: keeping every element, the masks it computed (:mod:`pipeline.runtime.generation.kept_images`)
        self._vision_outputs = tuple(spec.name for spec in vision.io.outputs)
        self._step_inputs = step_inputs
        #: the step's cache tensors: each layer's keys and values, and its recurrent states where it keeps them
        layout = cache_layout(step.io, generation.layers)
        self._layer_names = layout.names
        #: a step of one token (a text model with recurrent states): the prompt is fed token by token, each image
        #: token's step given its own feature row
        self.one_token = generation.max_prompt == 1 and any(not same for same in layout.in_place)
        #: the deepstack levels the step takes (and the vision graph gives), by name: the prompt's in the prefill,
        #: zeros in a decode step
        self._levels = tuple(name for name in step_inputs if name.startswith(f"{DEEPSTACK}."))
        missing = [name for name in self._levels if name not in self._vision_outputs]
        if missing:
            raise ArtifactError(
                f"the step takes the deepstack levels {', '.join(missing)}, which the vision graph does not give",
                fix="load a directory written by VisionLanguageModule.save",
            )
        known = (*STEP_INPUTS, IMAGE_FEATURES, TOKEN_TYPES, *self._levels, *self._layer_names)
        #: the model's per-token input marking the image tokens (Kosmos-2's ``image_embeds_position_mask``), which
        #: the step takes when the model's config names no image token: ``generate`` takes it by that name
        self.placement = next((name for name in step_inputs if name not in known), None)
        self._presents = layout.present_names
        specs = {spec.name: spec for spec in step.io.inputs}
        self._cache_shapes = list(layout.shapes)
        self._cache_dtypes = list(layout.dtypes)
        features = specs[IMAGE_FEATURES]
        self._features_dtype = features.torch_dtype
        width = features.shape[-1] if features.shape else None
        if token_embedding is None:
            token_embedding = torch.zeros(int(width) if isinstance(width, int) else 1)
        #: the text embedding of the image token [hidden]: the features of a decode step, which leave a generated
        #: image token as the model embeds it (no image is placed after the prompt)
        self.token_embedding = token_embedding.reshape(-1).to(self._features_dtype)
        self._hidden = int(self.token_embedding.shape[0])
        logits = next(spec for spec in step.io.outputs if spec.name == "logits")
        self._vocabulary = int(logits.shape[-1]) if logits.shape and isinstance(logits.shape[-1], int) else None

    def step_graph(self) -> ConvertedModule:
        """The text step (the vision graph's settings, report and engine: ``module.vision``'s)."""
        return self.step

    def generate(self, input_ids: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | Any:
        """The prompts followed by the new tokens [rows, prompt + new] (rows: prompts x ``num_return_sequences``), as
        transformers' ``model.generate``: ``input_ids``, ``attention_mask`` (left padding), the image inputs by name
        (``pixel_values``, and what else the model's vision tower takes), and the options of the decoder-only
        module's ``generate`` (beam search included); the model's own options the module was converted with
        (``generation.fixed_inputs``: ``sample=False``) are taken with those values only."""
        ids, mask, images, options = self._split(input_ids, kwargs)
        request = generate_options("generate", options, self.generation.model_options)
        with self._request_slots().hold():  # this request's own cache, until its last token
            feed, decoding = self._request(ids, mask, images, request)
            return generate_over(feed, decoding, request, encoder_decoder=False)

    def stream(self, input_ids: torch.Tensor | None = None, **kwargs: Any) -> Generator[torch.Tensor, None, None]:
        """Yield the next token of every row [rows] at each step (see :meth:`generate` for the inputs; the options
        of the decoder-only module's ``stream``)."""
        ids, mask, images, options = self._split(input_ids, kwargs)
        request = generate_options("stream", options, self.generation.model_options)
        with self._request_slots().hold():
            feed, decoding = self._request(ids, mask, images, request)
            yield from decode(feed, decoding)

    def save(self, path: str | Path) -> Path:
        """Write ``path/vision.ptrt``, ``path/step.ptrt`` and ``path/vision_language.json``, atomically
        (:func:`save_directory`)."""

        def write(staging: Path) -> None:
            self.vision.save(staging / VISION_FILE)
            self.step.save(staging / STEP_FILE)
            fixed = {
                name: [str(value.dtype).removeprefix("torch."), value.tolist()]
                for name, value in self.fixed_inputs.items()
            }
            meta = {
                "image_token_id": self.image_token_id,
                "token_embedding": self.token_embedding.float().tolist(),
                "fixed_inputs": fixed,
                "positions": self.positions.to_json() if self.positions is not None else None,
                "modality": self.modality,
                "placeholder": self.placeholder,
                "own_runs": self.own_runs,
            }
            (staging / META_FILE).write_text(json.dumps(meta))

        return save_directory(path, (VISION_FILE, STEP_FILE, META_FILE), write, "a vision-language model")

    # the request

    def _split(
        self, input_ids: torch.Tensor | None, kwargs: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], dict[str, Any]]:
        options = dict(kwargs)
        given = options.pop("input_ids", None)
        if input_ids is not None and given is not None:
            raise InputError("input_ids given twice (positionally and by name)", fix="pass input_ids once")
        ids = input_ids if input_ids is not None else given
        mask = options.pop("attention_mask", None)
        types = options.pop(TOKEN_TYPES, None)
        modalities = options.pop(MODALITIES, None)
        marked = options.pop(self.placement, None) if self.placement else None
        self._check_options(options)
        if types is not None and TOKEN_TYPES not in self._step_inputs:
            raise InputError(
                "token_type_ids given, but the module was converted from a sample without them (its step takes none)",
                fix="convert with the processor's token_type_ids in the sample, or leave them out here",
            )
        wanted = (*self._vision_inputs, *self.fixed_inputs)
        images = {name: options.pop(name) for name in wanted if name in options}
        self._check_modality(options)
        if ids is None:
            raise InputError("generate needs input_ids (the prompts)", fix="pass module.generate(input_ids, ...)")
        missing = [name for name in wanted if name not in images]
        if missing:
            raise InputError(
                f"generate needs the {self.modality} inputs {', '.join(missing)} (the features graph's), as the "
                "processor gives them",
                fix=f"pass module.generate(input_ids, attention_mask=..., {missing[0]}=...) as to model.generate",
            )
        prompt, prompt_mask = self._prompt(ids, mask)
        if modalities is not None:
            self._check_modalities(prompt, modalities)
        if types is not None:
            types = torch.as_tensor(types).cpu().to(torch.int64)
            if types.shape != prompt.shape:
                raise InputError(
                    f"token_type_ids are {list(types.shape)}, the input_ids {list(prompt.shape)}",
                    fix="pass the processor's token_type_ids with its input_ids (one per token)",
                )
            images = {**images, TOKEN_TYPES: types}
        if self.placement is not None:
            if marked is None or torch.as_tensor(marked).shape != prompt.shape:
                raise InputError(
                    f"generate needs {self.placement} (one per token of input_ids: where the image features go), as "
                    "the processor gives it",
                    fix=f"pass module.generate(input_ids, attention_mask=..., {self.placement}=..., pixel_values=...)",
                )
            images = {**images, self.placement: torch.as_tensor(marked).cpu().to(torch.int64)}
        return prompt, prompt_mask, images, options

    def _check_modality(self, options: dict[str, Any]) -> None:
        """An InputError when ``options`` hold another modality's main input (``input_features`` given to an image
        module): the module places its own modality's features only, and would leave them unplaced."""
        others = [name for kind, names in MAIN_INPUTS.items() if kind != self.modality for name in names]
        given = [name for name in others if name in options]
        if given:
            raise InputError(
                f"generate was given {', '.join(given)}, another modality's input, but this module places "
                f"{self._items} only (it was converted from a sample of {self._items}; one conversion places one "
                "modality)",
                fix=f"leave {', '.join(given)} out here, and convert the model once more from a sample of that "
                "modality alone (its own inputs and placeholder tokens) for a module that places it",
            )

    def _check_options(self, options: dict[str, Any]) -> None:
        """Drop from ``options`` the model's options the module was converted with (``generation.fixed_inputs``:
        VibeVoice-ASR's ``sample=False``), given with the same values; an InputError for another value (the graphs
        hold the converted one)."""
        for name, held in self.generation.fixed_inputs:
            if name not in options:
                continue
            given = options.pop(name)
            if type(given) is not type(held) or given != held:
                raise InputError(
                    f"{name}={given!r} given, but the module was converted with {name}={held!r} (the model's option, "
                    "which its graphs hold)",
                    fix=f"leave {name} out (or pass {name}={held!r}), or convert again with {name}={given!r} in the "
                    "generation sample given to pipeline.convert",
                )

    def _check_modalities(self, ids: torch.Tensor, modalities: Any) -> None:
        """The processor's ``mm_token_type_ids`` (which tokens are images, M-RoPE's) must mark the placeholder tokens
        as the module's modality: the module reads them from ``input_ids``, and places no other modality (video)."""
        given = torch.as_tensor(modalities).cpu()
        if given.shape != ids.shape:
            raise InputError(
                f"{MODALITIES} are {list(given.shape)}, the input_ids {list(ids.shape)}",
                fix=f"pass the processor's {MODALITIES} with its input_ids (one per token)",
            )
        placed = (
            ids == self.image_token_id if self.image_token_id is not None else torch.zeros_like(ids, dtype=torch.bool)
        )
        kind = _TYPE_IDS.get(self.modality, 1)  # a video's frames are the module's images: 1, as before
        if not torch.equal(given.to(torch.int64), placed.to(torch.int64) * kind):
            others = ", ".join(name for name in _TYPE_IDS if name != self.modality)
            raise InputError(
                f"{MODALITIES} mark tokens other than the {self.placeholder} tokens ({self.image_token_id}) or as "
                f"another modality than {self._items} ({kind}): the module places {self._items} only (no {others})",
                fix=f"pass prompts whose only media are {self._items}",
            )

    def _prompt(self, input_ids: Any, attention_mask: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt rows on the CPU as int64 and their mask (the decoder-only module's checks)."""
        from pipeline.runtime.generation.module import checked_prompt

        return checked_prompt(input_ids, attention_mask, self._vocabulary, "processor")

    def _request(
        self, ids: torch.Tensor, mask: torch.Tensor, images: dict[str, torch.Tensor], request: GenerateOptions
    ) -> tuple[VisionFeed, Decoding]:
        generation = self.generation
        rows = ids.shape[0]
        if rows * request.expand > generation.max_batch:
            raise InputError(
                f"a batch of {rows} x {request.expand} rows, but the step was converted for max_batch="
                f"{generation.max_batch}",
                fix=f"split the batch, or convert with generation={{'max_batch': {rows * request.expand}, ...}}",
            )
        prompt = ids.shape[1]
        longest = generation.max_length - 1 if self.one_token else generation.max_prompt or generation.max_length
        if prompt > longest:
            raise InputError(
                f"a prompt of {prompt} tokens (its {self.placeholder} tokens included), but the step prefills at most "
                f"max_prompt={longest} in one run",
                fix=f"convert with generation={{'max_prompt': {prompt}, ...}} or more"
                if prompt < generation.max_length
                else f"convert with generation={{'max_length': {prompt + 1}, ...}} or more (a prompt leaves one "
                "position of the cache for the tokens after it)",
            )
        types = images.get(TOKEN_TYPES)
        marked = images.get(self.placement) if self.placement else None
        features, levels, counts = self._features(images)
        self._check_image_tokens(ids if marked is None else marked, features)
        if self.own_runs and self.image_token_id is not None and marked is None:
            check_item_runs(ids, self.image_token_id, counts, self.modality)
        expanded = ids.repeat_interleave(request.expand, dim=0)
        expanded_mask = mask.repeat_interleave(request.expand, dim=0)
        decoding = resolve(request, generation, expanded, expanded_mask, self._vocabulary)
        feed = VisionFeed(self, ids, mask, features, request.expand, levels, room=decoding.new)
        if TOKEN_TYPES in self._step_inputs:  # the prefill's types (none given: text everywhere, as the model's)
            feed.types = types if types is not None else torch.zeros_like(ids)
        feed.marked = marked
        return feed, decoding

    def _features(self, images: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[int]]:
        """Every image's features [image tokens, hidden], the vision graph run once per image, every image's
        deepstack levels the step takes, by name (each cut as the features are), and each image's count of features."""
        specs = {spec.name: spec for spec in self.vision.io.inputs}
        values = {}
        for name in (*self._vision_inputs, *self.fixed_inputs):
            value = images[name]
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                raise InputError(
                    f"{name} must be a tensor with one leading row per {self.modality}", fix="pass the processor's"
                )
            values[name] = value.cpu().to(specs[name].torch_dtype if name in specs else value.dtype)
        pieces = []
        stacks: dict[str, list[torch.Tensor]] = {name: [] for name in self._levels}
        for index, cut in enumerate(image_rows(values, item=self.modality)):
            image = [cut[name] for name in self._vision_inputs]
            self._check_fixed(cut, index)
            for spec, value in zip(self.vision.io.inputs, image, strict=True):
                expected = tuple(spec.shape)
                if all(isinstance(d, int) for d in expected) and tuple(value.shape) != expected:
                    raise InputError(
                        f"{spec.name} of {self.modality} {index} is {list(value.shape)}, but the features graph "
                        f"takes {list(expected)} per {self.modality}",
                        fix=f"pass {self._items} processed as the sample's were (the same size)",
                    )
            outputs = dict(zip(self._vision_outputs, self.vision.run_flat(image), strict=True))
            pieces.append(kept_features(outputs, index))  # a padding image the model drops: no rows
            for name in self._levels:
                stacks[name].append(kept_features({**outputs, FEATURES: outputs[name]}, index))
        counts = [int(piece.shape[0]) for piece in pieces]
        if not pieces:
            empty = torch.zeros(0, self._hidden, dtype=self._features_dtype)
            return empty, {name: empty for name in self._levels}, counts
        levels = {name: torch.cat(stack, dim=0).to(self._features_dtype) for name, stack in stacks.items()}
        return torch.cat(pieces, dim=0).to(self._features_dtype), levels, counts

    def _check_fixed(self, image: dict[str, torch.Tensor], index: int) -> None:
        for name, fixed in self.fixed_inputs.items():
            given = image[name]
            if given.shape != fixed.shape or not torch.equal(given.to(fixed.dtype), fixed):
                shown = shown_values(given)
                again = f"{name}={shown}" if given.numel() <= SHOWN else f"this {name}"
                raise InputError(
                    f"{name} of {self.modality} {index} is {shown}, but the features graph was converted for "
                    f"{shown_values(fixed)} (the model's tower decides shapes from it)",
                    fix=f"process {self._items} to the sample's size, or convert with a sample of {again}",
                )

    def _check_image_tokens(self, ids: torch.Tensor, features: torch.Tensor) -> None:
        """As many image tokens as features: tokens of the image token's id, or marked by :attr:`placement` (then
        ``ids`` is that input)."""
        if self.image_token_id is None and self.placement is None:
            return
        marked = ids == self.image_token_id if self.placement is None else ids != 0
        tokens = int(torch.as_tensor(marked).sum())
        if tokens != features.shape[0]:
            where = (
                f"{self.placement} marks {tokens} {self.placeholder} tokens"
                if self.placement
                else f"the prompts hold {tokens} {self.placeholder} tokens ({self.image_token_id})"
            )
            main = self._vision_inputs[0] if self._vision_inputs else "pixel_values"
            raise InputError(
                f"{where}, but the {self._items} {'give' if self.modality == 'image' else 'gives'} "
                f"{features.shape[0]} features",
                fix=f"pass the processor's input_ids and {main} together (one {self.placeholder} token per feature)",
            )

    @property
    def _items(self) -> str:
        """The module's items in the plural, as its errors name them: images, audio."""
        return "images" if self.modality == "image" else self.modality


def load_directory(path: Path, load: Callable[[Path], ConvertedModule]) -> VisionLanguageModule:
    """The module saved in ``path`` by :meth:`VisionLanguageModule.save`, each artifact read by ``load``
    (:func:`pipeline.runtime.loading.load` with its options)."""
    # the step is a directory when it holds a prompt graph (GenerativeModule.save)
    missing = [name for name in (VISION_FILE, STEP_FILE, META_FILE) if not (path / name).exists()]
    if missing:
        raise ArtifactError(
            f"{path} lacks {', '.join(missing)}: an incomplete vision-language directory",
            fix="save the module again (VisionLanguageModule.save writes all three, atomically)",
        )
    try:
        meta = json.loads((path / META_FILE).read_text())
        token = meta.get("image_token_id")
        embedding = torch.tensor(meta["token_embedding"], dtype=torch.float32)
        fixed = {
            str(name): torch.tensor(value, dtype=getattr(torch, str(dtype)))
            for name, (dtype, value) in meta.get("fixed_inputs", {}).items()
        }
        laid = meta.get("positions")
        positions = ImagePositions.from_json(laid) if laid is not None else None
        modality = str(meta.get("modality") or "image")  # a directory saved before the modality was: images
        placeholder = str(meta.get("placeholder") or modality)
        own_runs = bool(meta.get("own_runs", False))
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
        raise ArtifactError(
            f"{path / META_FILE} is not the JSON VisionLanguageModule.save writes: {type(error).__name__}: {error}",
            fix="save the module again",
        ) from None
    vision, step = (load(path / name) for name in (VISION_FILE, STEP_FILE))
    token = token if isinstance(token, int) else None
    return VisionLanguageModule(vision, step, token, embedding, fixed, positions, modality, placeholder, own_runs)


#: The most values an error or log line lists of a held input; a longer one (a frame mask) is shown by its shape.
SHOWN = 16


def shown_values(value: torch.Tensor) -> Any:
    """A held input's values as a message shows them: a list, or its shape and nonzero count when long (a mask)."""
    if value.numel() <= SHOWN:
        return value.tolist()
    return f"<{list(value.shape)}: {int((value != 0).sum())} of {value.numel()} nonzero>"
