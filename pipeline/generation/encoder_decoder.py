"""``convert(seq2seq_model, inputs, generation={...})``: an encoder-decoder as two converted graphs.

The encoder graph (:class:`~pipeline.generation.seq2seq.CrossStates`: the encoder's inputs to every decoder layer's
cross-attention keys and values) and the cached decoder step (:class:`~pipeline.generation.seq2seq.Seq2SeqStep`) go
through the stages one after the other, each validated against PyTorch on its own sample; then, when validating,
whole greedy decodings of the sample are compared token for token with the model's own ``generate`` (or, where the
model's class wraps transformers' generic loop with its own post-processing, with that loop). Before any export, the
step in PyTorch is compared with the model's own forward over a few tokens (or its decoding of them over its own
cache, where that differs): a model whose own attention code masks no position of the static cache (FSMT's, LED's
over one decoder token) gets the step that hands it the written positions only; one that decodes over neither form
of the step is refused there, with the reason. A decoder that decides in Python on its cache's length (ProphetNet's
first step takes another branch) gets the first step's graph beside the step's (:func:`_first_step_apart`). The
result is an :class:`~pipeline.runtime.generation.encoder_decoder.EncoderDecoderModule`.

The sample is the encoder's inputs as the model's ``generate`` takes them: a tensor of its main input (``input_ids``,
Whisper's and Pop2Piano's ``input_features``), or a dict such as ``{"input_ids": ..., "attention_mask": ...}``. 2-D
inputs (token ids and their mask) get a dynamic source axis up to ``max_prompt`` (the sample's length, fixed, when the
encoder's code decides on it in Python: LongT5's and PEGASUS-X's block padding); every input a dynamic batch up to
``max_batch``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch
from transformers.utils import ModelOutput

from converters.errors import ExportError, InputError
from converters.generation_settings import GenerationSettings, check_token_ids
from converters.registry import ConverterRegistry
from pipeline.generation import PLAIN_FORWARD
from pipeline.generation.conversion import attention_form, model_options, special_tokens, step_precision_io
from pipeline.generation.ops import GENERATION_OPSET, generation_converters
from pipeline.generation.own_preparation import generate_input_name, own_encoder_preparation
from pipeline.generation.seq2seq import (
    CrossStates,
    Seq2SeqStep,
    cache_of,
    encode_and_decode,
    encoder_output_type,
    source_states,
)
from pipeline.generation.seq2seq_greedy import validate_greedy
from pipeline.generation.static_cache_check import step_over_static_cache
from pipeline.generation.step_attention import uses_attention_interface
from pipeline.runtime.generation.encoder_decoder import (
    ENCODER_MASK,
    EncoderDecoderModule,
    cross_names,
)
from pipeline.runtime.generation.layout import CachedLayer, past_name
from pipeline.runtime.io_spec import normalise_sample
from pipeline.runtime.module import ConvertedModule
from pipeline.settings import DynamicDim, Settings

logger = logging.getLogger(__name__)

#: Convert one part (module, sample, settings, converters) through the stages.
Stages = Callable[[torch.nn.Module, Any, Settings, ConverterRegistry], ConvertedModule]


def convert_encoder_decoder(
    model: torch.nn.Module, sample: Any, settings: Settings, registry: ConverterRegistry, stages: Stages
) -> EncoderDecoderModule:
    """The encoder graph and the decoder step of ``model``, converted (see the module docstring)."""
    generation = settings.generation
    assert generation is not None
    inputs = _encoder_inputs(model, sample)
    rows = next(iter(inputs.values())).shape[0]
    if rows > generation.max_batch:
        raise InputError(
            f"the generation sample has {rows} rows, but generation max_batch={generation.max_batch}",
            fix=f"pass generation={{'max_batch': {rows}, ...}} or more, or a sample of fewer rows",
        )
    if rows == 1 and generation.max_batch >= 2:  # the export specialises a batch of 1: the row twice
        inputs = {name: value.expand(2, *value.shape[1:]).clone() for name, value in inputs.items()}
        rows = 2
    start = _decoder_start(model)
    layout = _layout(model, inputs, start)
    eos, pad = special_tokens(model, generation.eos_token_id, generation.pad_token_id)
    from_model = tuple(n for n in ("eos_token_id", "pad_token_id") if getattr(generation, n) in ((), None))
    generation = dataclasses.replace(
        generation,
        kind="encoder-decoder",
        layers=layout.layers,
        eos_token_id=eos,
        pad_token_id=pad,
        decoder_start_token_id=start,
        model_options=model_options(model, generation.max_length),
        attention=attention_form(model, settings, layout.self_layers),
    )
    generation = check_token_ids(generation, layout.vocabulary, from_model)
    opset = max(settings.opset or GENERATION_OPSET, GENERATION_OPSET)
    precision_io = step_precision_io(settings)
    names = tuple(inputs)
    source = _source_length(inputs, layout.source)
    tokens = source is not None  # one encoder state per input token: the mask over the tokens masks the states
    with torch.no_grad():
        encoder = CrossStates(model, names, layout.layers, start).train(model.training)
        cross = encoder(*inputs.values())
    own = "its own attention code is exported as it is over the static cache"
    use_interface = all(uses_attention_interface(part, own) for part in attention_owners(model))

    def make_step(written_only: bool) -> Seq2SeqStep:
        made = Seq2SeqStep(
            model,
            layout.layers,
            layout.hidden,
            use_interface,
            layout.encoder_output,
            tokens,
            written_only,
            layout.source_states,
        )
        return made.train(model.training)

    mask = cross.get(ENCODER_MASK, inputs.get("attention_mask") if tokens else None)  # the encoder's own, else
    encoder_mask = mask.to(torch.int64) if mask is not None else torch.ones(rows, layout.source, dtype=torch.int64)
    past = [tensor for layer in layout.self_layers for tensor in layer.storage(rows, generation.max_length)]
    states = [*past, *(cross[name] for name in cross_names(layout.layers))]
    start_ids = torch.full((rows, 1), start, dtype=torch.int64)
    step_sample: Any = ((start_ids, encoder_mask, torch.tensor(0, dtype=torch.int64), *states), {})
    step = step_over_static_cache(model, make_step, inputs, step_sample[0], layout.layers)
    tied = own_encoder_preparation(model) is not None
    encoder_settings = dataclasses.replace(
        settings,
        generation=None,
        # the caller's opset (the step's 24 would export the encoder's SDPA as ONNX Attention: no fp32 TensorRT kernel)
        dynamic=_encoder_dims(inputs, generation, source),
        precision_io=precision_io,
        # a model that prepares its encoder's inputs itself ties them together (image tokens to its images): drawn
        # ids would not match the images, the sample is what the encoder validates and calibrates on
        validation_inputs=0 if tied else settings.validation_inputs,
        calibration_inputs=0 if tied else settings.calibration_inputs,
    )
    logger.info("encoder-decoder: converting the encoder graph (%s -> cross-attention keys and values)", names)
    encoder_module, source = _convert_encoder(encoder, inputs, encoder_settings, registry, stages, source)
    step_settings = dataclasses.replace(
        settings,
        generation=generation,
        dynamic=_step_dims(layout.layers, rows, generation, source),
        opset=opset,
        profiles=(),
        precision_io=precision_io,
    )
    logger.info("encoder-decoder: converting the decoder step (cache of %d tokens)", generation.max_length)
    step_module = stages(step, step_sample, step_settings, generation_converters(registry))
    step_module, first = _first_step_apart(
        step, step_sample, step_settings, generation_converters(registry), stages, step_module
    )
    module = EncoderDecoderModule(encoder_module, step_module, first)
    if settings.validate or step.written_only:
        # a step over the written positions only runs the model's own attention code, which may decide in Python on
        # the cache's length (ProphetNet's first step takes another path): only a decoding shows the export held the
        # path of every step, so it is checked even with validate=False
        if not settings.validate:
            logger.warning(
                "encoder-decoder: %s's own attention code runs over the written cache positions only: its greedy "
                "decoding is checked against the model's generate although validate=False",
                type(model).__name__,
            )
        validate_greedy(model, module, inputs, step_settings)
    return module


def _first_step_apart(
    step: Seq2SeqStep,
    sample: Any,
    settings: Settings,
    registry: ConverterRegistry,
    stages: Stages,
    first: ConvertedModule,
) -> tuple[ConvertedModule, ConvertedModule | None]:
    """The step graph and, where the model decides in Python on its cache's length, the first step's graph apart.

    The step is exported on the start token over an empty cache. Where that export took decisions on data-dependent
    sizes from the sample's values (``report.traced_branches``: ProphetNet's decoder builds its masks and relative
    positions at the first step only, ``if cache_length != 0``), the step is exported again over a cache holding one
    position. When the two exports decided differently, the graph of an empty cache holds the first step's branch
    only: it is kept as the first step's graph and the other is the step of every later one (the decoding validated
    after checks both). Else the one graph holds every step, as for any model."""
    if not first.report.traced_branches:
        return first, None
    args, kwargs = sample
    later = stages(step, ((*args[:2], torch.tensor(1, dtype=torch.int64), *args[3:]), kwargs), settings, registry)
    if later.report.traced_branches == first.report.traced_branches:
        return first, None
    logger.warning(
        "%s's decoder decides in Python on its cache's length (%s over an empty cache, %s after one token): the "
        "first decoder step runs on a graph of its own",
        *(type(step.model).__name__, first.report.traced_branches, later.report.traced_branches),
    )
    return later, first


@dataclasses.dataclass(frozen=True)
class _Layout:
    layers: int
    self_layers: tuple[CachedLayer, ...]
    source: int  # the encoder's output length for the sample
    hidden: int  # the encoder output's width
    vocabulary: int
    encoder_output: type[ModelOutput]  # the class of what the model's encoder returns
    source_states: tuple[tuple[str, int], ...]  # its other states over the source (seq2seq.source_states)


def _encoder_inputs(model: torch.nn.Module, sample: Any) -> dict[str, torch.Tensor]:
    """The sample as the encoder's named inputs, in the order the model's forward takes them."""
    main = generate_input_name(model)
    args, kwargs = normalise_sample(sample)
    first = args[0] if len(args) == 1 else None
    if isinstance(first, dict) and not kwargs:
        args, kwargs = (), dict(first)
    given: dict[str, Any] = dict(kwargs)
    if args:
        if len(args) > 1 or main in given:
            raise InputError(
                f"an encoder-decoder's generation sample is its encoder's inputs: one tensor ({main}) or a dict of "
                f"named tensors, got {len(args)} positional values",
                fix=f'pass pipeline.convert(model, {{"{main}": ..., "attention_mask": ...}}, generation={{...}})',
            )
        given[main] = args[0]
    refused = sorted(name for name in given if name.startswith("decoder_") or name in ("labels", "encoder_outputs"))
    if refused:
        raise InputError(
            f"the generation sample holds {', '.join(refused)}: the decoder's side is what generation makes",
            fix=f"pass the encoder's inputs only ({main}, attention_mask)",
        )
    if main not in given or not isinstance(given[main], torch.Tensor):
        raise InputError(
            f"the generation sample of {type(model).__name__} needs its encoder input {main!r} (a tensor)",
            fix=f'pass pipeline.convert(model, {main}, generation={{...}}) or {{"{main}": ..., "attention_mask": ...}}',
        )
    not_tensors = sorted(name for name, value in given.items() if not isinstance(value, torch.Tensor))
    if not_tensors:
        raise InputError(
            f"the generation sample's {', '.join(not_tensors)} are not tensors",
            fix="pass tensors only (the processor's return_tensors='pt' output)",
        )
    rows = {value.shape[0] for value in given.values()}
    if len(rows) != 1:
        raise InputError(
            f"the generation sample's inputs have different batch sizes {sorted(rows)}",
            fix="pass inputs of one batch (the tokenizer's input_ids and attention_mask together)",
        )
    import inspect

    order = list(inspect.signature(model.forward).parameters)
    tokens = given[main]
    if (
        "attention_mask" not in given
        and "attention_mask" in order
        and tokens.dim() == 2
        and not tokens.is_floating_point()
    ):
        given["attention_mask"] = torch.ones_like(tokens)  # a batch of sources is padded: the graph takes the mask
    return {name: given[name] for name in sorted(given, key=lambda n: order.index(n) if n in order else len(order))}


def _decoder_start(model: torch.nn.Module) -> int:
    """The token the decoder starts from: ``decoder_start_token_id``, else ``bos_token_id``, as transformers'
    ``generate`` takes them (LongT5's config has no start token of its own)."""
    owners = (getattr(model, "generation_config", None), getattr(model, "config", None))
    for name in ("decoder_start_token_id", "bos_token_id"):
        for owner in owners:
            start = getattr(owner, name, None)
            if isinstance(start, list | tuple):
                start = start[0] if start else None
            if start is not None:
                return int(start)
    raise InputError(
        f"{type(model).__name__} has no decoder_start_token_id (nor bos_token_id) in its generation config or config",
        fix="set model.generation_config.decoder_start_token_id (the token its decoder starts from)",
    )


def _layout(model: torch.nn.Module, inputs: dict[str, torch.Tensor], start: int) -> _Layout:
    """The caches the model builds on the sample's first row and one decoder token."""
    first = {name: value[:1] for name, value in inputs.items()}
    with torch.no_grad():
        try:
            out, encoded = encode_and_decode(model, first, torch.full((1, 1), start, dtype=torch.int64))
        except Exception as error:  # noqa: BLE001 - the model refusing one decoder token per row: said with its cause
            raise InputError(
                f"{type(model).__name__} fails on the sample's first row and one decoder token ([1, 1], the start "
                f"token {start}): {type(error).__name__}: {' '.join(str(error).split())[:300]}",
                fix="generation= converts decoders that take one token id per row and step (a text or speech "
                "recognition decoder); convert without it for the plain forward",
            ) from error
    cache = cache_of(out)
    self_cache = getattr(cache, "self_attention_cache", None)
    cross_cache = getattr(cache, "cross_attention_cache", None)
    if self_cache is None or cross_cache is None:
        raise InputError(
            f"{type(model).__name__} returned no EncoderDecoderCache with use_cache=True (got {type(cache).__name__});"
            " generation= needs an encoder-decoder on transformers' Cache API",
            fix=f"{PLAIN_FORWARD}, or use a model on transformers' Cache API",
        )
    self_layers = []
    source = 0
    pairs = list(zip(self_cache.layers, cross_cache.layers, strict=True))
    # a cache sized from the config may hold more layers than the decoder has (ProphetNet's counts its encoder's):
    # the layers after the last one the step wrote are not the decoder's
    while pairs and not any(_written(layer) for layer in pairs[-1]):
        pairs.pop()
    for i, (mine, theirs) in enumerate(pairs):
        tensors = [getattr(mine, "keys", None), getattr(mine, "values", None), theirs.keys, theirs.values]
        if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in tensors):
            raise InputError(
                f"decoder layer {i} of {type(model).__name__} has no 4-D attention caches",
                fix="generation= supports attention caches [batch, heads, tokens, dim]; convert without it",
            )
        if tensors[0].shape[1] != tensors[1].shape[1]:
            raise InputError(
                f"decoder layer {i} of {type(model).__name__} caches keys of {tensors[0].shape[1]} heads but values "
                f"of {tensors[1].shape[1]}",
                fix="generation= supports caches whose keys and values have the same heads",
            )
        self_layers.append(CachedLayer.of(tensors[0], tensors[1]))
        source = int(theirs.keys.shape[-2])
    hidden = getattr(out, "encoder_last_hidden_state", None)
    if not isinstance(hidden, torch.Tensor):
        raise InputError(
            f"{type(model).__name__} returned no encoder_last_hidden_state",
            fix="generation= converts transformers *ForConditionalGeneration models; convert without it",
        )
    width, vocabulary = int(hidden.shape[-1]), int(out.logits.shape[-1])
    return _Layout(
        len(self_layers),
        tuple(self_layers),
        source,
        width,
        vocabulary,
        encoder_output_type(encoded),
        source_states(encoded, source),
    )


def attention_owners(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model, and its decoder where that is another model's code (a ``VisionEncoderDecoderModel``'s TrOCR or
    mBART decoder): the step's attention dispatches through transformers' interface only if both do (a composite's
    own module has no attention class, which transformers reads as dispatching)."""
    get = getattr(model, "get_decoder", None)
    try:
        decoder = get() if callable(get) else None
    except Exception:  # noqa: BLE001 - a model without a decoder transformers can find: the model's code decides
        decoder = None
    if isinstance(decoder, torch.nn.Module) and type(decoder).__module__ != type(model).__module__:
        return [model, decoder]
    return [model]


def _written(layer: Any) -> bool:
    """Whether a cache layer holds keys (an unused layer holds none, or an empty tensor)."""
    keys = getattr(layer, "keys", None)
    return isinstance(keys, torch.Tensor) and keys.numel() > 0


def _convert_encoder(
    encoder: CrossStates,
    inputs: dict[str, torch.Tensor],
    settings: Settings,
    registry: ConverterRegistry,
    stages: Stages,
    source: int | None,
) -> tuple[ConvertedModule, int | None]:
    """The encoder graph, and the source length that stays dynamic (None: the sample's, fixed). An encoder whose code
    fixes a dynamic source length (it pads the source to a multiple of its block or window in Python) is converted
    again for the sample's length, and the step after it."""
    try:
        return stages(encoder, tuple(inputs.values()), settings, registry), source
    except ExportError as error:
        if source is None or not _source_specialised(error):
            raise
    logger.warning(
        "%s's encoder decides in Python on its source length (it pads the source to a multiple of its block or "
        "window): torch.export cannot keep that length dynamic, so the encoder graph and the decoder step take "
        "sources of the sample's %d tokens (pad the inputs to that length, as a tokenizer's padding='max_length' does)",
        type(encoder.model).__name__,
        source,
    )
    static = dataclasses.replace(settings, dynamic=tuple(d for d in settings.dynamic if d.name != "source"))
    return stages(encoder, tuple(inputs.values()), static, registry), None


def _source_specialised(error: BaseException) -> bool:
    """Whether torch.export failed because the model's code fixes the dynamic source length (a guard on it that does
    not hold, or cannot be shown to hold, over its whole range: LED's, LongT5's and PEGASUS-X's block padding)."""
    current: BaseException | None = error
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if "(source)" in text and ("Constraints violated" in text or "Specializations unexpectedly" in text):
            return True
        current = current.__cause__ or current.__context__
    return False


def _source_length(inputs: dict[str, torch.Tensor], source: int) -> int | None:
    """The sample's source length when the encoder's output keeps it (token inputs: one state per token), else None
    (Whisper's features are reduced: the encoder's inputs and outputs keep fixed sizes)."""
    lengths = {value.shape[1] for value in inputs.values() if value.dim() == 2}
    return source if lengths == {source} else None


def _encoder_dims(inputs: dict[str, torch.Tensor], generation: GenerationSettings, source: int | None) -> tuple:
    rows = next(iter(inputs.values())).shape[0]
    dims: list[DynamicDim] = []
    for name, value in inputs.items():
        if generation.max_batch >= 2:
            dims.append(DynamicDim(name, 0, "batch", 1, max(rows, 1), generation.max_batch))
        if source is not None and value.dim() == 2:
            longest = max(generation.max_prompt or generation.max_length, source)
            dims.append(DynamicDim(name, 1, "source", 1, source, longest))
    return tuple(dims)


def _step_dims(layers: int, rows: int, generation: GenerationSettings, source: int | None) -> tuple:
    names = ["input_ids", ENCODER_MASK, *(past_name(i, k) for i in range(layers) for k in ("key", "value"))]
    cross = list(cross_names(layers))
    dims: list[DynamicDim] = []
    if generation.max_batch >= 2:
        dims += [DynamicDim(name, 0, "batch", 1, rows, generation.max_batch) for name in [*names, *cross]]
    if source is not None:
        longest = max(generation.max_prompt or generation.max_length, source)
        dims.append(DynamicDim(ENCODER_MASK, 1, "source", 1, source, longest))
        dims += [DynamicDim(name, 2, "source", 1, source, longest) for name in cross]
    return tuple(dims)
