"""An encoder-decoder (T5, BART, Marian, Whisper, ...) as two graphs: the encoder with the cross-attention keys and
values it feeds, and the cached decoder step.

:class:`CrossStates` runs the model once on the encoder's inputs and one decoder token with transformers' own
``EncoderDecoderCache``, and returns what that cache's cross-attention half holds: every layer's keys and values over
the encoder's tokens ([batch, heads, source, dim]). The decoder's self-attention and head do not reach those outputs,
so the exporter drops them: the graph is the encoder plus the cross projections, computed once per request.

:class:`Seq2SeqStep` is the decoder step: the self-attention cache static and written in place
(:class:`~pipeline.generation.step.StepCacheLayer`, as for a decoder-only model), the cross-attention cache given
(layers marked as updated, so the model reads them instead of projecting the encoder's output again). The model's
code decides everything else: learned positions from the cache's length (BART, Marian, Whisper), relative position
buckets (T5, as an additive bias of the step's attention), the cross-attention mask from ``encoder_attention_mask``
(given as the model's ``attention_mask`` when the encoder's inputs are tokens, and as the ``attention_mask`` of the
encoder output when the model's encoder returns one: speech encoders that shorten their input). The encoder output the
step hands the model is of the class the model's encoder returns, its states zeros (only their shape is read).
Nothing here reads one architecture's code: both modules call the model as transformers' ``generate`` does
(:func:`encode_and_decode`: ``get_encoder()`` on the encoder's inputs, or the model's own preparation of them where its
class overrides transformers' (Florence-2's merges its image features into the encoder's input) or where its own
``generate`` prepares them before transformers' loop (Pop2Piano's, :func:`own_generate_preparation`), then
``model(encoder_outputs=...)``). A model whose own attention masks no position of its self-attention cache is handed
the written positions only (``Seq2SeqStep(written_only=True)``).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import inspect
import sys
from collections.abc import Iterator
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import ModelOutput

from pipeline.exporting.errors import is_model_code
from pipeline.generation.own_preparation import (
    own_encoder_preparation,
    own_generate_preparation,
)
from pipeline.generation.step import StepCache, StepCacheLayer, step_outputs
from pipeline.generation.step_attention import (
    ATTENTION_NAME,
    attention_implementation,
    mark_cross,
    register_attention,
)
from pipeline.runtime.generation.encoder_decoder import ENCODER_MASK
from pipeline.runtime.generation.layout import cross_name, past_name


def _call_argument(model: torch.nn.Module, *names: str) -> str | None:
    """The first of ``names`` that ``model.forward`` takes."""
    parameters = inspect.signature(model.forward).parameters
    return next((name for name in names if name in parameters), None)


def cache_of(output: Any) -> Any:
    """The cache a transformers output holds (``cache`` in transformers 5, ``past_key_values`` before)."""
    return getattr(output, "cache", None) or getattr(output, "past_key_values", None)


class CrossStates(torch.nn.Module):
    """``forward(**encoder_inputs)``: the cross-attention keys and values of every decoder layer, ``{"cross.{i}.key":
    ..., "cross.{i}.value": ...}``, computed by the model itself with one decoder token (``start``); and where the
    model's encoder returns its own mask over its states (:func:`encoder_mask`), that mask (``ENCODER_MASK``): the
    runtime hands the step the encoder's mask rather than the request's."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...], layers: int, start: int) -> None:
        super().__init__()
        self.model = model
        self.names = names
        self.layers = layers
        self.start = start
        #: graph input names of the ``*inputs`` arguments (the exporter reads this mapping)
        self.onnx_input_names = {f"inputs_{i}": name for i, name in enumerate(names)}
        if len(names) == 1:  # one varargs input is named after the parameter alone
            self.onnx_input_names["inputs"] = names[0]

    def forward(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """The cross keys and values for the encoder inputs ``inputs`` (in the order of ``names``)."""
        given = dict(zip(self.names, inputs, strict=True))
        batch = inputs[0].shape[0]
        start = torch.full((batch, 1), self.start, dtype=torch.int64, device=inputs[0].device)
        out, encoded = encode_and_decode(self.model, given, start)
        cache = cache_of(out)
        assert isinstance(cache, EncoderDecoderCache)
        result = {}
        mask = encoder_mask(encoded)
        if mask is not None:
            result[ENCODER_MASK] = mask
        for i in range(self.layers):
            layer: Any = cache.cross_attention_cache.layers[i]
            result[cross_name(i, "key")] = layer.keys
            result[cross_name(i, "value")] = layer.values
        return result


class CrossCacheLayer(CacheLayerMixin):
    """One layer's cross-attention keys and values, given (graph inputs); never updated."""

    is_compileable = False
    is_sliding = False

    keys: torch.Tensor
    values: torch.Tensor

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values = keys, values
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """Not called: the layer is marked as updated."""
        raise RuntimeError("the cross-attention cache of the step is given, not written")

    def get_mask_sizes(self, query_length: int) -> tuple[Any, int]:
        """The encoder's tokens."""
        return self.keys.shape[-2], 0

    def get_seq_length(self) -> Any:
        """The encoder's tokens."""
        return self.keys.shape[-2]

    def get_max_length(self) -> Any:
        """The encoder's tokens."""
        return self.keys.shape[-2]


class _CrossCache(Cache):
    def __init__(self, layers: list[CrossCacheLayer]) -> None:
        super().__init__(layers=list(layers))


@dataclasses.dataclass
class EncoderOutput(BaseModelOutput):
    """The encoder output the step hands a model whose encoder's own output class is unknown (see
    :func:`encoder_output_type`): the states and the mask over them."""

    attention_mask: torch.Tensor | None = None


def encode_and_decode(
    model: torch.nn.Module,
    given: dict[str, torch.Tensor],
    decoder_ids: torch.Tensor,
    use_cache: bool = True,
    cache: Any = None,
) -> tuple[Any, Any]:
    """The model's output for the encoder inputs ``given`` and the decoder's tokens ``decoder_ids`` (with its cache
    when ``use_cache``), and its encoder's output: computed as transformers' ``generate`` computes them, the encoder
    (``get_encoder()``) on the inputs it takes, then the model on the encoder's output (a model's own forward may pass
    the decoder's options to its encoder too: Switch Transformers' refuses ``use_cache``). A model without an encoder
    module of its own runs whole (its encoder output is then None). A model that prepares its encoder's inputs itself
    (:func:`own_encoder_preparation`: Florence-2 merges its image features into the encoder's embeddings) is encoded
    by that preparation, as ``generate`` encodes it. ``cache``: the model's own cache of the tokens before
    ``decoder_ids`` (see :func:`decode_over_own_cache`)."""
    decoding: dict[str, Any] = {"decoder_input_ids": decoder_ids, "use_cache": use_cache}
    if cache is not None:
        decoding[_call_argument(model, "cache", "past_key_values") or "past_key_values"] = cache
    handed = own_generate_preparation(model)
    if handed is not None:
        given = handed(given)
    prepare = own_encoder_preparation(model)
    if prepare is not None:
        kwargs = prepare(given)
        encoded = kwargs.pop("encoder_outputs")
        return model(**kwargs, encoder_outputs=encoded, **decoding), encoded
    get = getattr(model, "get_encoder", None)
    encoder = get() if callable(get) else None
    if not isinstance(encoder, torch.nn.Module) or encoder is model:
        return model(**given, **decoding), None
    main = str(getattr(model, "main_input_name", "input_ids"))
    parameters = inspect.signature(encoder.forward).parameters
    wildcard = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    taken = {name: value for name, value in given.items() if name != main and (wildcard or name in parameters)}
    if main in given:  # else the inputs are embeddings (what a model's own generate hands transformers' loop)
        # the encoder's own main input name (a speech encoder-decoder's `inputs` are its encoder's `input_values`)
        taken[str(getattr(encoder, "main_input_name", main))] = given[main]
    encoded = encoder(**taken, return_dict=True)
    rest = {name: value for name, value in given.items() if name not in (main, "inputs_embeds")}
    return model(**rest, encoder_outputs=encoded, **decoding), encoded


def decode_over_own_cache(model: torch.nn.Module, given: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """The logits [batch, tokens, vocab] of the model fed ``tokens`` one at a time over the cache it makes itself, as
    transformers' ``generate`` decodes (a model's forward over several tokens may differ from that: FSMT's masks a
    decoder token equal to its padding token without a cache, and masks nothing causally with one)."""
    logits, cache = [], None
    for position in range(tokens.shape[1]):
        out, _ = encode_and_decode(model, given, tokens[:, position : position + 1], cache=cache)
        cache = cache_of(out)
        logits.append(out.logits[:, -1])
    return torch.stack(logits, dim=1)


def encoder_output_type(encoded: Any) -> type[ModelOutput]:
    """The class of the encoder output the step hands the model: the one its encoder returned (its decoder may read
    more than the states: the shortened input's ``attention_mask`` of Moonshine's and Canary's, the ``router_logits``
    of NLLB-MoE's), else :class:`EncoderOutput`."""
    if isinstance(encoded, ModelOutput) and "last_hidden_state" in _fields(type(encoded)):
        return type(encoded)
    return EncoderOutput


def encoder_mask(encoded: Any) -> torch.Tensor | None:
    """The mask over its states [batch, states] (int64) the encoder's output ``encoded`` holds, or None: an encoder
    whose states are not its input's positions computes it (UDOP's over its merged image patches and text tokens, a
    speech encoder's over the frames it keeps), and its decoder reads it as the cross-attention mask."""
    mask = encoded.get("attention_mask") if isinstance(encoded, ModelOutput) else None
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or "attention_mask" not in _fields(type(encoded)):
        return None
    return mask.to(torch.int64)


def source_states(encoded: Any, source: int) -> tuple[tuple[str, int], ...]:
    """The states over the source (3-D, ``source`` long: as long as the cross keys) the encoder output ``encoded``
    holds beside ``last_hidden_state``, by name and width: what :class:`Seq2SeqStep` hands the model as zeros."""
    if not isinstance(encoded, ModelOutput):
        return ()
    return tuple(
        (name, int(value.shape[-1]))
        for name, value in encoded.items()
        if name != "last_hidden_state"
        and isinstance(value, torch.Tensor)
        and value.dim() == 3
        and int(value.shape[1]) == source
        and name in _fields(type(encoded))
    )


def _fields(output: type[ModelOutput]) -> set[str]:
    """The field names of a ``ModelOutput`` dataclass."""
    return set(getattr(output, "__dataclass_fields__", {}))


class Seq2SeqStep(torch.nn.Module):
    """One decoder step of an encoder-decoder over a static self-attention cache and given cross-attention states.

    ``forward(input_ids [B, S], encoder_attention_mask [B, source], past_length [] int64, *states)`` with ``states``
    every layer's self-attention key and value caches [B, heads, capacity, dim] (``past_key_values.{i}.key/value``),
    then every layer's cross-attention keys and values [B, heads, source, dim] (``cross.{i}.key/value``), returns
    ``{"logits": [B, vocab] of the last position, "present.{i}.key": ..., ...}``. ``token_inputs``: the encoder's
    inputs are one per state (token ids), so that the mask over the states is the model's ``attention_mask`` too.
    ``written_only``: the model is handed the cache's written positions only (``StepCacheLayer.written_only``).
    ``source_states``: the other states over the source the model's encoder returns, by name and width (its decoder may
    cross-attend to one of them rather than to ``last_hidden_state``: PP-FormulaNet's to its ``pooler_output``), handed
    to the model as zeros of the step's source length, as ``last_hidden_state`` is (only their shape is read)."""

    def __init__(
        self,
        model: torch.nn.Module,
        layers: int,
        hidden: int,
        use_interface: bool,
        encoder_output: type[ModelOutput] = EncoderOutput,
        token_inputs: bool = True,
        written_only: bool = False,
        source_states: tuple[tuple[str, int], ...] = (),
    ) -> None:
        super().__init__()
        self.model = model
        self.source_states = source_states
        #: hand the model the written cache positions only (``StepCacheLayer.written_only``)
        self.written_only = written_only
        self.encoder_output = encoder_output
        self.layers = layers
        self.hidden = hidden
        self.use_interface = use_interface
        self._cache_argument = _call_argument(model, "cache", "past_key_values") or "past_key_values"
        self._decoder_mask = _call_argument(model, "decoder_attention_mask") is not None
        # the mask over the encoder's states is the model's `attention_mask` only when its inputs are one per state
        # (tokens): a speech model's is over its input frames, which its forward reduces again (Speech2Text's)
        self._encoder_mask = token_inputs and _call_argument(model, "attention_mask") is not None
        if use_interface:
            register_attention()
        names = [past_name(i, kind) for i in range(layers) for kind in ("key", "value")]
        names += [cross_name(i, kind) for i in range(layers) for kind in ("key", "value")]
        #: graph input names of the ``*states`` arguments (the exporter reads this mapping)
        self.onnx_input_names = {f"states_{i}": name for i, name in enumerate(names)}

    def forward(
        self, input_ids: torch.Tensor, encoder_attention_mask: torch.Tensor, past_length: torch.Tensor, *states: Any
    ) -> dict[str, torch.Tensor]:
        """The step: logits of the last position and the updated self-attention cache."""
        n = self.layers
        # the cache's length as a number (an unbacked size when exported): a model computing its positions as
        # arange(length, length + steps) then knows they are `steps` long (MVP's own attention checks its shapes)
        length = past_length.item()
        torch._check(length >= 0)
        torch._check(length < states[0].shape[-2])
        layers: list[StepCacheLayer] = [
            StepCacheLayer(states[2 * i], states[2 * i + 1], past_length, length, self.written_only) for i in range(n)
        ]
        cross = [CrossCacheLayer(states[2 * n + 2 * i], states[2 * n + 2 * i + 1]) for i in range(n)]
        for given in cross:
            mark_cross(given.keys)
        cache = EncoderDecoderCache(StepCache(layers), _CrossCache(cross))
        cache.is_updated = dict.fromkeys(range(n), True)
        batch, source = encoder_attention_mask.shape
        # the decoder reads the encoder's output only for its shape (the cross keys and values are cached)
        hidden = torch.zeros(batch, source, self.hidden, dtype=states[2 * n].dtype, device=input_ids.device)
        encoded: dict[str, Any] = {"last_hidden_state": hidden}
        for name, width in self.source_states:
            encoded[name] = torch.zeros(batch, source, width, dtype=hidden.dtype, device=hidden.device)
        if "attention_mask" in _fields(self.encoder_output):
            # an encoder that shortens its input returns the mask over its states, which the decoder reads as the
            # cross-attention mask (Moonshine, Canary): the step's mask over the encoder's states
            encoded["attention_mask"] = encoder_attention_mask
        call: dict[str, Any] = {
            "decoder_input_ids": input_ids,
            "encoder_outputs": self.encoder_output(**encoded),
            self._cache_argument: cache,
            "use_cache": True,
        }
        if self._encoder_mask:
            call["attention_mask"] = encoder_attention_mask
        if self._decoder_mask:
            capacity: Any = length + input_ids.shape[1] if self.written_only else states[0].shape[-2]
            call["decoder_attention_mask"] = torch.ones(batch, capacity, dtype=torch.int64, device=input_ids.device)
        if self.use_interface:
            call["_past_length"] = past_length
        with (
            attention_implementation(self.model, ATTENTION_NAME if self.use_interface else None),
            symbolic_int(self.model),
        ):
            out = self.model(**call)
        return step_outputs(out.logits, layers)


def _int_keeping_sizes(value: Any = 0, *base: Any) -> Any:
    """``int(value)``, but a symbolic size (a ``torch.SymInt``: the cache's length while exporting) stays symbolic."""
    if isinstance(value, torch.SymInt):
        return value
    return builtins.int(value, *base)


@contextlib.contextmanager
def symbolic_int(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, Python's ``int()`` in the model's own modules (not torch's) keeps a symbolic size symbolic.
    A model's code may turn the cache's length into a Python number (ProphetNet's positions at a step after the
    first: ``int(padding_idx + length)``), which torch.export can only specialise to the sample's length (a graph
    right for one cache length only); an ``int`` of a size is that size already. Eagerly nothing changes."""
    modules = {sys.modules.get(type(part).__module__) for part in model.modules()}
    shadowed = [
        module
        for module in modules
        if module is not None and is_model_code(str(getattr(module, "__file__", "<"))) and "int" not in vars(module)
    ]
    for module in shadowed:
        module.int = _int_keeping_sizes  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in shadowed:
            if vars(module).get("int") is _int_keeping_sizes:
                del module.int
