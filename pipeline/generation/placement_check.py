"""What the model's own forward places at its placeholder tokens, against what the features graph gives: the features
method called as the forward calls it, and a conversion-time check that the two are the same on the sample.

The features graph calls the model's features method (``get_audio_features``, ``get_image_features``) with the
sample's inputs of one item as they are. A forward may hand the method some of them changed: Gemma 3n's hands its audio
tower ``~input_features_mask`` (the frames to drop, where the processor's mask marks the frames to keep), so the method
called with the sample's mask gives other features than the forward places. The forward is run once on the sample with
the method (on the model and its inner model) wrapped to see what it is handed (:func:`check_placement`); an input the
forward hands it as one of :data:`HANDED_AS` of the sample's (bitwise not: Python's ``~``) is handed so by every later
call of the method (:class:`HandedFeatures`, through :func:`handed_as_in_forward`): the features graph, the sample's
features, the runtime's graph.

The same forward also gives the embeddings the model hands its language model (the first module called after the
features method with ``inputs_embeds`` of the prompt's shape): their rows at the placeholder tokens are what the model
places, and they must equal the features the graph gives, item after item (what the step places there); an InputError
otherwise, naming the modality and the positions, so that a conversion, validated or not, never decodes features the
model would not place (padding rows a forward writes over some of them, rows it adds after them). Nothing here reads
one architecture's code: the method's name is the modality's, and the forward says what it hands and places.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch

from converters.errors import InputError
from pipeline.generation.handed_features import HANDED, HANDED_AS, HANDED_TO, PLACED_AT

logger = logging.getLogger(__name__)


def check_placement(
    model: torch.nn.Module,
    text: dict[str, torch.Tensor],
    vision: dict[str, torch.Tensor],
    token: int | None,
    options: dict[str, Any],
) -> None:
    """Run the model's forward once on the sample (``text``, ``vision``, its fixed ``options``), keep how it hands its
    features method the sample's inputs (see the module docstring), then an InputError unless the features the graph
    gives (every item's, in order) are the rows the forward places at the placeholder ``token``. Nothing is checked
    (said at info) where the model has no features method or no placeholder token, its forward fails, or hands its
    language model no embeddings of the prompt's shape (it places the features otherwise: the step's own checks)."""
    from pipeline.generation.vision_graph import features_of
    from pipeline.generation.vision_inputs import features_method_names, modality_of

    modality = modality_of(vision)
    names = features_method_names(model, modality)
    ids = text["input_ids"]
    name = type(model).__name__
    if token is None or not names or not bool((ids == token).any()):
        return
    seen = _forward_seen(model, {**text, **vision, **options}, names[0], ids)
    if isinstance(seen, str):
        logger.info("vision-language: %s's placement is not checked: %s", name, seen)
        return
    handed, placed, receiver = seen
    if receiver is not None:
        HANDED_TO[model] = receiver
    changed = _changed(handed, vision)
    if changed:
        logger.info(
            "vision-language: %s's forward hands %s %s: the features graph hands them so",
            name,
            names[0],
            ", ".join(f"{n} as {how}" for n, how in changed),
        )
        HANDED[model] = changed
    if placed is None:
        logger.info("vision-language: %s's placement is not checked: its language model is handed no embeddings", name)
        return
    at = ids == token
    expected = placed[at]
    with torch.no_grad():
        found = features_of(model, vision, options)[0]
        if not _same(found, expected) and not _same(found, features_of(model, vision, options)[0]):
            return  # features drawn at random: check_repeatable refuses them, with its fix
    if _same(found, expected):
        return
    raise InputError(_differs(name, modality.name, token, at, found, expected), fix=_fix(modality.name, names[0]))


def _forward_seen(
    model: torch.nn.Module, sample: dict[str, Any], method_name: str, ids: torch.Tensor
) -> tuple[dict[str, Any] | None, torch.Tensor | None, torch.nn.Module | None] | str:
    """What ``model``'s forward on ``sample`` hands its features method (its first call's inputs by name; None when it
    calls none), the embeddings it hands its language model ([batch, tokens, hidden]; None when none) and that module,
    or why the forward failed."""
    calls: list[dict[str, Any]] = []
    embeds: list[torch.Tensor] = []
    receivers: list[torch.nn.Module] = []
    done: list[bool] = []  # the method's calls that returned: the embeddings are handed on after the first
    owners = [o for o in (model, getattr(model, "model", None)) if callable(getattr(o, method_name, None))]
    owners = [o for o in owners if isinstance(o, torch.nn.Module) and method_name not in vars(o)]

    def recorded(method: Any) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            bound = inspect.signature(method).bind_partial(*args, **kwargs)
            calls.append(dict(bound.arguments))
            out = method(*args, **kwargs)
            done.append(True)
            return out

        return call

    def before(_module: torch.nn.Module, _args: Any, kwargs: Any) -> None:
        given = kwargs.get("inputs_embeds")
        shaped = isinstance(given, torch.Tensor) and given.dim() == 3 and tuple(given.shape[:2]) == tuple(ids.shape)
        if shaped and not embeds and (done or not owners):
            embeds.append(given.detach().clone())
            receivers.append(_module)

    hooks = [m.register_forward_pre_hook(before, with_kwargs=True) for m in model.modules() if m is not model]
    for owner in owners:
        object.__setattr__(owner, method_name, recorded(getattr(owner, method_name)))
    try:
        with torch.no_grad():
            model(**sample)
    except Exception as error:  # noqa: BLE001 - the reason nothing is checked
        return f"its forward fails on the sample: {type(error).__name__}: {' '.join(str(error).split())[:200]}"
    finally:
        for owner in owners:
            vars(owner).pop(method_name, None)
        for hook in hooks:
            hook.remove()
    return (calls[0] if calls else None), (embeds[0] if embeds else None), (receivers[0] if receivers else None)


def _changed(handed: dict[str, Any] | None, vision: dict[str, torch.Tensor]) -> tuple[tuple[str, str], ...]:
    """The sample's ``vision`` inputs that the forward ``handed`` its features method changed (one of
    :data:`HANDED_AS`), with how."""
    found = []
    for name, value in (handed or {}).items():
        given = vision.get(name)
        if not isinstance(value, torch.Tensor) or not isinstance(given, torch.Tensor) or value.shape != given.shape:
            continue
        if value.dtype != given.dtype or torch.equal(value, given):
            continue
        how = next((how for how, change in HANDED_AS.items() if _equal(change, given, value)), None)
        if how is not None:
            found.append((name, how))
    return tuple(found)


def _equal(change: Callable[[torch.Tensor], torch.Tensor], given: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether ``change(given)`` is ``value`` (False where ``change`` does not take ``given``: floats' bitwise not)."""
    try:
        return torch.equal(change(given), value)
    except (RuntimeError, TypeError):
        return False


def _same(found: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether the graph's features ``found`` are the placed rows ``expected`` (the items one at a time against the
    forward's batch: rounding apart, relative to the features' scale)."""
    if found.shape != expected.shape:
        return False
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    # a half-precision model rounds at its own epsilon; on a GPU, float32 convolutions run in TF32 by default
    tolerance = max(1e-4, 8 * torch.finfo(expected.dtype).eps) if expected.is_floating_point() else 0.0
    if expected.device.type != "cpu" and expected.dtype == torch.float32:
        tolerance = max(tolerance, 1e-3)
    atol = max(1e-5, tolerance / 10) * max(scale, 1.0)
    return torch.allclose(found.to(expected.dtype), expected, rtol=tolerance, atol=atol)


def _differs(
    name: str, modality: str, token: int, at: torch.Tensor, found: torch.Tensor, expected: torch.Tensor
) -> str:
    """What an InputError of :func:`check_placement` says: the positions (batch row, token) whose placed row the
    graph's features do not give."""
    positions = at.nonzero().tolist()
    if found.shape != expected.shape:
        return (
            f"{name}'s forward places {expected.shape[0]} rows of width {expected.shape[-1]} at the sample's "
            f"{modality} tokens ({token}), and the {modality} features graph gives {found.shape[0]} of width "
            f"{found.shape[-1]}"
        )
    rows = (found.to(expected.dtype) - expected).abs().amax(dim=-1)
    off = [positions[i] for i in range(len(positions)) if not _same(found[i : i + 1], expected[i : i + 1])]
    shown = ", ".join(f"({row}, {column})" for row, column in off[:8]) + (" ..." if len(off) > 8 else "")
    return (
        f"{name}'s forward places other rows at the sample's {modality} tokens ({token}) than the {modality} features "
        f"graph gives: at {len(off)} of {len(positions)} positions (batch row, token) {shown}, up to "
        f"{float(rows.max()):.3g} apart (the forward writes over, or adds to, the {modality} features it computes)"
    )


def _fix(modality: str, method: str) -> str:
    """The fix of :func:`check_placement`'s InputError."""
    return (
        f"convert a sample whose {modality} items the forward places as {method} gives them (whole {modality} items, "
        f"as many placeholder tokens as their features), or convert without generation= (the plain forward)"
    )


def embeddings_receiver(
    model: torch.nn.Module,
    text: dict[str, torch.Tensor],
    media: dict[str, Any],
    token: int | None,
    features: torch.Tensor,
) -> torch.nn.Module | None:
    """The module the step places the ``features`` in the embeddings handed to (the model called with its ids), None
    where it hands the model its input embedding's output: the model's forward hands that module
    (:func:`check_placement`) other embeddings than its input embedding gives for some ids of its vocabulary but its
    config's named tokens (:func:`embedded_otherwise`: Gemma 3n embeds its audio and vision ranges by tables of
    their own, which a decode step that generates such an id must do as well), and on the sample (``text``, its
    ``media``: the vision inputs and fixed options) its logits from its ids, the features placed so, are its
    forward's."""
    from pipeline.generation.vision_step import placed_in_embeddings

    receiver = HANDED_TO.get(model)
    if receiver is None or token is None:
        return None
    ids, mask = text["input_ids"], text["attention_mask"]
    try:
        with torch.no_grad():
            otherwise = embedded_otherwise(model, receiver)
            if not otherwise:
                return None
            expected = model(**text, **media).logits
            with placed_in_embeddings(model, torch.eq(ids, token), features, at=receiver):
                if not _same(model(input_ids=ids, attention_mask=mask).logits, expected):
                    return None
    except Exception as error:  # noqa: BLE001 - the embeddings as the step hands them: its own checks say more
        logger.info("vision-language: %s's ids are not placed at its %s: %s", type(model).__name__, receiver, error)
        return None
    logger.info(
        "vision-language: %s's forward embeds %d ids (%d..%d) otherwise than its input embedding: the step hands it "
        "input_ids and places the features in the embeddings its forward hands its %s",
        type(model).__name__,
        len(otherwise),
        otherwise[0],
        otherwise[-1],
        type(receiver).__name__,
    )
    PLACED_AT[model] = receiver
    return receiver


class _Seen(Exception):
    """Raised once the embeddings handed to the receiving module are seen: the rest of the forward is not needed."""


#: Ids embedded at a time by :func:`embedded_otherwise` (one token each: a batch of ids).
CHUNK = 4096


def embedded_otherwise(model: torch.nn.Module, receiver: torch.nn.Module) -> list[int]:
    """The ids of the model's vocabulary (but its config's ``*_token_id``/``*_token_index`` tokens) whose embeddings
    its forward hands ``receiver`` are not its input embedding's output: each id run alone (a batch of one-token
    prompts, :data:`CHUNK` at a time), the forward stopped at the receiver."""
    embedding: Any = model.get_input_embeddings()  # type: ignore[operator]
    vocabulary = int(embedding.weight.shape[0])
    config = getattr(model, "config", None)
    named = {v for k, v in vars(config).items() if k.endswith(("_token_id", "_token_index")) and isinstance(v, int)}
    word = next(i for i in range(vocabulary) if i not in named)
    seen: list[torch.Tensor] = []

    def stop(_module: torch.nn.Module, _args: Any, kwargs: dict[str, Any]) -> None:
        seen.append(kwargs["inputs_embeds"])
        raise _Seen

    found: list[int] = []
    handle = receiver.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        for start in range(0, vocabulary, CHUNK):
            ids = torch.arange(start, min(start + CHUNK, vocabulary), device=embedding.weight.device).reshape(-1, 1)
            seen.clear()
            # a placeholder without its media may be refused: run as a word (its row is not compared)
            marks = torch.tensor(sorted(named or {-1}), device=ids.device)
            run = torch.where(torch.isin(ids, marks), word, ids)
            with contextlib.suppress(_Seen):
                model(input_ids=run, attention_mask=torch.ones_like(ids))
            handed = seen[0].reshape(ids.shape[0], -1).float() if seen else None
            own = embedding(ids).reshape(ids.shape[0], -1).float()
            if handed is None or handed.shape != own.shape:
                return []
            apart = ~torch.isclose(handed, own, rtol=1e-4, atol=1e-5).all(-1)
            found += [int(i) for i in ids.reshape(-1)[apart] if int(i) not in named]
    finally:
        handle.remove()
    return found
