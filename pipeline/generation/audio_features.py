"""The features graph of an audio-language decoder whose forward computes its audio features itself (Qwen2-Audio has
no ``get_audio_features``): the features method is found from the forward, not read from one architecture's code.

The model runs once on the conversion sample with a hook on each of its modules. The **tower** is the outermost module
called with the sample's audio (``input_features``: the very tensor, as the forward hands it on); the **projector** is
the outermost module called with the tower's output (the tensor, or its ``last_hidden_state``) whose output, one row
per audio token, is what the forward places at the prompt's audio tokens (the embeddings its text model is handed as
``inputs_embeds``, at the config's audio token). Either may be the other (a tower whose output is placed as it is). The
method found, :class:`ForwardFeatures`, is ``projector(tower(audio))`` on one audio, and it stands in for
``get_audio_features`` (:func:`features_in_forward`): the features graph, the sample's checks and the runtime are the
same as for a model with the method. It is kept only when it gives exactly what the forward placed on the sample.

The forward's other per-audio inputs (Qwen2-Audio's ``feature_attention_mask``, the frames of a padded audio) are
inputs the forward turns into the tower's masks and a crop of the features by code of its own, which is not a module
to find: the method takes them, gives an audio's features when the mask keeps every frame (the sample's audios are
whole), and none when it drops some, so that a prompt whose audio tokens count a padded audio's features is refused
(an ``InputError``: the features do not match the audio tokens) rather than given the whole audio's.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from typing import Any

import torch

from converters.errors import InputError

logger = logging.getLogger(__name__)

#: The sample's inputs that are the prompt's, never one audio's.
PROMPT_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds", "labels")

#: The features methods found from models' forwards (:func:`find_features`), by model, and why not where not.
_FOUND: weakref.WeakKeyDictionary[torch.nn.Module, ForwardFeatures] = weakref.WeakKeyDictionary()
_NOT_FOUND: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()


class ForwardFeatures:
    """The features method found in a model's forward: ``projector(tower(audio))`` (``projector`` None: the tower's
    output as it is), called as ``get_audio_features`` is (``method(input_features=..., <per-audio inputs>,
    return_dict=True)``), returning an object with the features as ``pooler_output`` [audio tokens, hidden].
    ``per_audio``: the forward's other inputs of one audio (masks over its frames), taken as keeping every frame
    (see the module docstring)."""

    def __init__(
        self,
        tower: torch.nn.Module,
        projector: torch.nn.Module | None,
        main: str,
        per_audio: tuple[str, ...],
        field: str | None,
    ) -> None:
        self.tower = tower
        self.projector = projector
        self.main = main
        self.per_audio = per_audio
        self.field = field  # the tower's output field the projector takes (None: the output itself)
        named = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in (main, *per_audio)]
        rest = inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)
        self.__signature__ = inspect.Signature([*named, rest])

    def __call__(self, *args: Any, **inputs: Any) -> Any:
        """The features of the audio (one leading row per audio) as ``get_audio_features`` gives them."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        inputs = {**dict(zip((self.main, *self.per_audio), args, strict=False)), **inputs}
        audio = inputs[self.main]
        out = self.tower(audio)
        hidden = getattr(out, self.field) if self.field else out
        features = self.projector(hidden) if self.projector is not None else hidden
        features = features.reshape(-1, features.shape[-1])
        masks = [inputs[name] for name in self.per_audio if isinstance(inputs.get(name), torch.Tensor)]
        if masks:  # every frame kept: the features; else none (see the module docstring)
            whole = torch.stack([mask.reshape(-1).to(torch.int32).min() for mask in masks]).min() > 0
            features = features[whole.reshape(1).expand(features.shape[0])]
        return BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=features)


def features_in_forward(model: Any) -> ForwardFeatures | None:
    """The features method found in ``model``'s forward (:func:`find_features`), or None."""
    try:
        return _FOUND.get(model)
    except TypeError:  # not weakly referenceable: never found
        return None


def why_not_found(model: Any) -> str | None:
    """Why :func:`find_features` found no features method in ``model``'s forward (None: not looked for, or found)."""
    try:
        return _NOT_FOUND.get(model)
    except TypeError:
        return None


def find_features(model: torch.nn.Module, sample: dict[str, Any], main: str, token: int | None) -> str | None:
    """Find the features method in ``model``'s forward on ``sample`` (its audio ``main``, its prompt's audio tokens
    ``token``), kept for :func:`features_in_forward`; None when found, else why not (see the module docstring), also
    kept (:func:`why_not_found`)."""
    if model in _FOUND:
        return None
    why = _find(model, sample, main, token)
    if why is not None:
        _NOT_FOUND[model] = why
        logger.info("audio-language: %s's audio features are not found in its forward: %s", type(model).__name__, why)
    return why


def _find(model: torch.nn.Module, sample: dict[str, Any], main: str, token: int | None) -> str | None:
    """:func:`find_features`' search: None when found (and kept), else why not."""
    ids, audio = sample.get("input_ids"), sample.get(main)
    if token is None or not isinstance(ids, torch.Tensor) or not isinstance(audio, torch.Tensor):
        return "its config names no audio token, or the sample holds no input_ids"
    placed_at = ids == token
    if not bool(placed_at.any()):
        return f"the sample's prompt holds none of its audio tokens ({token})"
    calls = _calls(model, sample)
    if isinstance(calls, str):
        return calls
    embeds = next((kwargs["inputs_embeds"] for _, _, kwargs, _ in calls if _embeds_of(kwargs, ids)), None)
    if embeds is None:
        return "its forward hands no module the prompt's embeddings (inputs_embeds)"
    placed = embeds[placed_at]
    # the outermost module called with the audio and not the prompt (the model and its inner model take both)
    towers = [call for call in calls if _takes(call, audio) and not _takes(call, ids)]
    if not towers:
        return f"no module of its forward is called with the sample's {main}"
    tower, _, _, tower_out = towers[0]
    found = _projector(calls, tower, tower_out, placed)
    if found is None:
        return "no module of its forward turns its audio tower's output into the features it places at the audio tokens"
    projector, field = found
    per_audio = tuple(
        name
        for name, value in sample.items()
        if name not in (*PROMPT_INPUTS, main)
        and isinstance(value, torch.Tensor)
        and value.dim() >= 1
        and value.shape[0] == audio.shape[0]
    )
    method = ForwardFeatures(tower, projector, main, per_audio, field)
    with torch.no_grad():
        features = torch.cat([method(sample[main][i : i + 1]).pooler_output for i in range(audio.shape[0])])
    if features.shape != placed.shape or not torch.allclose(features, placed, rtol=1e-4, atol=1e-5):
        return (
            f"its {type(tower).__name__} and {type(projector or tower).__name__} on each audio alone give other "
            "features than its forward places at the audio tokens"
        )
    logger.info(
        "audio-language: %s computes its audio features in its forward: the features graph is its %s%s, found there",
        type(model).__name__,
        type(tower).__name__,
        f" then {type(projector).__name__}" if projector is not None else "",
    )
    _FOUND[model] = method
    return None


def _calls(model: torch.nn.Module, sample: dict[str, Any]) -> list[tuple[Any, ...]] | str:
    """Every module call of ``model``'s forward on ``sample`` as (module, args, kwargs, output), in the order the calls
    start (the outermost of nested calls first); a string saying why when the forward fails."""
    started: list[torch.nn.Module] = []
    ended: dict[int, tuple[Any, ...]] = {}

    def before(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        started.append(module)
        ended.setdefault(id(module), (module, args, kwargs, None))

    def after(module: torch.nn.Module, args: Any, kwargs: Any, out: Any) -> None:
        if ended.get(id(module), (None, None, None, None))[3] is None:
            ended[id(module)] = (module, args, kwargs, out)

    hooks = []
    for module in model.modules():
        hooks.append(module.register_forward_pre_hook(before, with_kwargs=True))
        hooks.append(module.register_forward_hook(after, with_kwargs=True))
    try:
        with torch.no_grad():
            model(**sample)
    except Exception as error:  # noqa: BLE001 - the reason it is not found
        return f"its forward fails on the sample: {type(error).__name__}: {' '.join(str(error).split())[:200]}"
    finally:
        for hook in hooks:
            hook.remove()
    order = list(dict.fromkeys(id(module) for module in started))
    return [ended[key] for key in order if ended[key][3] is not None]


def _embeds_of(kwargs: dict[str, Any], ids: torch.Tensor) -> bool:
    """Whether a call's ``kwargs`` hand it the prompt's embeddings [batch, tokens, hidden]."""
    embeds = kwargs.get("inputs_embeds")
    return isinstance(embeds, torch.Tensor) and embeds.dim() == 3 and tuple(embeds.shape[:2]) == tuple(ids.shape)


def _takes(call: tuple[Any, ...], value: torch.Tensor) -> bool:
    """Whether a call takes ``value`` itself as an argument (the first, or a keyword's)."""
    _, args, kwargs, _ = call
    return (bool(args) and args[0] is value) or any(given is value for given in kwargs.values())


def _projector(
    calls: list[tuple[Any, ...]], tower: torch.nn.Module, out: Any, placed: torch.Tensor
) -> tuple[torch.nn.Module | None, str | None] | None:
    """The module turning the tower's output ``out`` into the ``placed`` features (None: the tower's output is placed
    as it is) and the field of ``out`` it takes, or None when none does."""
    # the output itself, or its last hidden state (a transformers output's)
    field = None if isinstance(out, torch.Tensor) else "last_hidden_state"
    hidden = out if field is None else getattr(out, field, None)
    if not isinstance(hidden, torch.Tensor):
        return None
    if _places(hidden, placed):
        return None, field
    for call in calls:
        if call[0] is not tower and _takes(call, hidden) and _places(call[3], placed):
            return call[0], field
    return None


def _places(value: Any, placed: torch.Tensor) -> bool:
    """Whether ``value``'s rows are the ``placed`` features (the sample's audios are whole: every row is placed)."""
    if not isinstance(value, torch.Tensor) or value.shape[-1] != placed.shape[-1] or value.numel() != placed.numel():
        return False
    return torch.allclose(value.reshape(placed.shape).to(placed.dtype), placed, rtol=1e-4, atol=1e-5)


def check_repeatable(
    model: torch.nn.Module,
    modality: Any,
    first: torch.Tensor,
    second: torch.Tensor,
    parameters: dict[str, inspect.Parameter] | None = None,
) -> None:
    """An InputError when the model's features method gave ``first`` and then ``second`` on the same sample: it draws
    random numbers (VibeVoice-ASR's ``get_audio_features`` adds noise to its latents unless ``sample=False``), while
    the features graph is one function of its inputs and ``model.generate`` decodes otherwise at every call. The fix
    names the method's bool options among its ``parameters`` (where it hands ``**kwargs`` on, its inner model's too:
    :func:`~pipeline.generation.vision_inputs.features_parameters`): passed in the generation sample, they are the
    conversion's fixed inputs (:func:`~pipeline.generation.vision_inputs.fixed_inputs`)."""
    if first.shape == second.shape and torch.allclose(first, second, rtol=1e-5, atol=1e-6):
        return
    given = parameters or {}
    flags = [name for name, p in given.items() if isinstance(p.default, bool)]
    switched = ", ".join(f"{name}={not given[name].default}" for name in flags)
    raise InputError(
        f"{type(model).__name__}.{modality.method} gives other {modality.name} features on a second call on the same "
        f"{modality.name}: it draws random numbers, so its generate decodes otherwise at every call and no graph "
        "gives what it gives" + (f" (its options {', '.join(flags)} may turn the drawing off)" if flags else ""),
        fix=(
            f"pass {switched} in the generation sample given to pipeline.convert (and to generate, as to the "
            f"model's): the option that turns the drawing off is then a fixed input of every call"
            if flags
            else "convert a model whose features do not draw random numbers (its own option set so, as a config "
            "holds it)"
        ),
    )
