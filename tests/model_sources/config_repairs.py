"""Repairs a shrunk config's own validation asks for, read from its message: nothing here names a model type.

transformers' configs check themselves when built (``@strict``'s ``validate_architecture``, the heterogeneity
checks), and a shrink that sets one size of a pair, or fewer layers than a per-layer list holds, fails there with a
message that names what must change. :func:`repaired` reads the message and returns the constructor's keyword
arguments changed as it asks, the change made where the message says (``vision_config.text_hidden_size`` in the
vision sub-config, which the arguments may give as a dict, a built config, or not at all):

- two named fields that must match (or be equal): the first set to the second's value (the second to the first's
  when the second is None): "`vision_config.text_hidden_size` (2304) must match `text_config.hidden_size` (32)";
- lists that must have one entry per layer: each cut to the layer count (its last entry repeated when shorter):
  "`patch_sizes`, `hidden_sizes` and `depths` must have one entry per layer, got 4, 4 and 4 for
  `num_hidden_layers`=2";
- a token range that ends beyond the vocabulary: the vocabulary grown to hold it: "The audio token range ends at
  266440, beyond the vocabulary (`text_config.vocab_size` = 128)";
- a per-layer table keyed by layers past the shrunk depth: the table given without them: "`per_layer_config` keys must
  be integer layer indices in the range [0, 2); got [25, ...]".
"""

from __future__ import annotations

import ast
import copy
import inspect
import re
from typing import Any

#: Two fields a config ties: "`a.b` (768) must match `c.d` (32)", "`a.b` (None) and `c` (2) must be equal".
_MUST_MATCH = re.compile(r"`([\w.]+)` \(([^()]*)\) must (?:match|equal|be equal to) `([\w.]+)` \(([^()]*)\)")
_BOTH_EQUAL = re.compile(r"`([\w.]+)` \(([^()]*)\) and `([\w.]+)` \(([^()]*)\) must (?:be equal|match)")

#: Lists of one entry per layer: "`a`, `b` and `c` must have one entry per layer, got 4, 4 and 4 for `n`=2".
_PER_LAYER = re.compile(r"((?:`\w+`(?:, | and )?)+) must have one entry per \w+\b.*?`(\w+)`\s*=\s*(\d+)")

#: A token range past the vocabulary: "ends at 266440, beyond the vocabulary (`text_config.vocab_size` = 128)".
_PAST_VOCABULARY = re.compile(r"ends at (\d+),? beyond the vocabulary \(`([\w.]*vocab_size)` = (\d+)\)")

#: A per-layer table keyed past the depth: "`per_layer_config` keys must be ... in the range [0, 2); got [25, 26]".
_LAYER_KEYS = re.compile(r"`(\w+)` keys must be integer layer indices in the range \[0, (\d+)\)")


def repaired(message: str, cls: type, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """``kwargs`` (for ``cls``'s constructor) changed as ``message`` (the error building ``cls`` raised) asks, or None
    when the message asks for none of the repairs this module knows, or for one ``kwargs`` already has.

    >>> class Tied:  # a config class stand-in: its constructor's parameters are what a repair may set
    ...     def __init__(self, width: int = 8, tower_width: int = 8) -> None: ...
    >>> repaired("`tower_width` (2304) must match `width` (32).", Tied, {"width": 32})
    {'width': 32, 'tower_width': 32}
    """
    for repair in (_matched_pair, _cut_lists, _grown_vocabulary, _dropped_layer_keys):
        changes = repair(message, cls, kwargs)
        if changes is None:
            continue
        fixed = kwargs
        for path, value in changes.items():
            fixed = _with(cls, fixed, path.split("."), value)
        return fixed if fixed != kwargs else None
    return None


def fit(config: Any) -> None:
    """Sizes the shrink left at odds with the config's own (each kept in the relation its class's defaults have),
    in the config and its sub-configs: a vocabulary stated beside ``vocab_size`` (:func:`_fit_vocabularies`), the
    RoPE parameters of the layer types a checkpoint gives (:func:`_fit_rope_layers`)."""
    from transformers import PretrainedConfig

    owners = [config] + [value for value in vars(config).values() if isinstance(value, PretrainedConfig)]
    for owner in owners:
        _fit_vocabularies(owner)
        _fit_rope_layers(owner)
        _fit_depth_to_layer_types(owner)


def _fit_vocabularies(config: Any) -> None:
    """A vocabulary size stated beside ``vocab_size`` (Inkling 2's ``unpadded_vocab_size``, its head's logits: 200058
    of 200064) that the class's defaults keep within ``vocab_size`` and the shrink left past it: the shrunk
    ``vocab_size`` (else a generated id is past the embedding)."""
    vocabulary, default = getattr(config, "vocab_size", None), getattr(type(config), "vocab_size", None)
    if not isinstance(vocabulary, int) or not isinstance(default, int):
        return
    for name, value in list(vars(config).items()):
        if name == "vocab_size" or not name.endswith("vocab_size") or not isinstance(value, int) or value <= vocabulary:
            continue
        stated = getattr(type(config), name, None)
        if isinstance(stated, int) and not isinstance(stated, bool) and stated <= default:
            setattr(config, name, vocabulary)


def _fit_depth_to_layer_types(config: Any) -> None:
    """``num_hidden_layers`` made the length of the config's ``layer_types`` where the class builds its layers from
    the list and let the two differ (Nemotron-H's default pattern of 4 blocks, whatever the shrunk depth says): what
    reads the depth (a cache of one entry per layer) then counts the layers the model has."""
    layer_types, layers = getattr(config, "layer_types", None), getattr(config, "num_hidden_layers", None)
    if not isinstance(layer_types, list) or not isinstance(layers, int) or layers in (0, len(layer_types)):
        return
    try:  # only a class whose own defaults differ so: the others derive their list from the depth
        default = type(config)()
        if len(default.layer_types) == default.num_hidden_layers:
            return
        config.num_hidden_layers = len(layer_types)
    except Exception:  # noqa: BLE001 - a class without defaults to compare, or a depth it derives: left as it is
        return


def _fit_rope_layers(config: Any) -> None:
    """RoPE parameters per layer type that the class leaves to its checkpoint (Cohere Compass's text model: ``{}`` by
    default, which its layers read by their type, ``rope_parameters["full_attention"]``): the default rotation for
    each of the config's ``layer_types``, at its ``rope_theta`` where it states one."""
    layer_types, rope = getattr(config, "layer_types", None), getattr(config, "rope_parameters", None)
    if rope != {} or not isinstance(layer_types, list) or not layer_types:
        return
    theta = getattr(config, "rope_theta", None) or getattr(type(config), "default_theta", None) or 10_000.0
    config.rope_parameters = {kind: {"rope_type": "default", "rope_theta": float(theta)} for kind in set(layer_types)}


#: transformers' error for a sliding-window mask of a config whose window a checkpoint sets (None by default).
_NO_WINDOW = re.compile(r"Could not find a `(\w+)` argument in the config, or it is not set")


def forward_repair(configs: list[Any], message: str) -> dict[tuple[str, str], Any] | None:
    """``{(config class name, attribute): value}`` for the configs (a config and its sub-configs) that a forward's
    error says lack a value their checkpoint sets: a sliding window a model's code builds its mask with even where
    no layer slides (Step 3.7's text model), as wide as the config's positions (the window never binds, as a
    checkpoint's does not on a short prompt). None for another error, or when every config has the value."""
    found = _NO_WINDOW.search(message)
    if found is None:
        return None
    changes = {
        (type(owner).__name__, found[1]): owner.max_position_embeddings
        for owner in configs
        if found[1] in vars(owner)
        and getattr(owner, found[1]) is None
        and isinstance(getattr(owner, "max_position_embeddings", None), int)
    }
    return changes or None


def learned(message: str, cls: type, kwargs: dict[str, Any], asked: list[str], most: int = 6) -> bool:
    """Whether ``message`` asks for a repair of ``kwargs`` (:func:`repaired`) not yet in ``asked`` (at most
    ``most`` of them); if so it is appended to ``asked``, for :func:`repaired_as_asked` to make on the next try."""
    if message in asked or len(asked) >= most or repaired(message, cls, kwargs) is None:
        return False
    asked.append(message)
    return True


def repaired_as_asked(asked: list[str], cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the repairs of every message of ``asked``, in turn (one already made is left as it is)."""
    for message in asked:
        kwargs = repaired(message, cls, kwargs) or kwargs
    return kwargs


def _literal(text: str) -> Any:
    """A value as a message prints it (``None``, ``2``, ``(16, 16)``); the text itself when it is no literal."""
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return text.strip()


def _matched_pair(message: str, cls: type, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    found = _MUST_MATCH.search(message) or _BOTH_EQUAL.search(message)
    if found is None:
        return None
    first, first_value, second, second_value = found[1], _literal(found[2]), found[3], _literal(found[4])
    if first == second or (first_value is None and second_value is None):
        return None
    return {second: first_value} if second_value is None else {first: second_value}


def _cut_lists(message: str, cls: type, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    found = _PER_LAYER.search(message)
    if found is None:
        return None
    names, count = re.findall(r"`(\w+)`", found[1]), int(found[3])
    owner = _owner_of(cls, kwargs, names)
    if owner is None or count < 1:
        return None
    prefix, owner_cls, given = owner
    changes = {}
    for name in names:
        value = given.get(name, _default(owner_cls, name))
        if not isinstance(value, (list, tuple)) or not value:
            return None
        cut = list(value[:count]) + [value[-1]] * max(0, count - len(value))
        changes[prefix + name] = type(value)(cut)
    return changes


def _grown_vocabulary(message: str, cls: type, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    found = _PAST_VOCABULARY.search(message)
    return {found[2]: int(found[1])} if found else None


def _dropped_layer_keys(message: str, cls: type, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The table keyed by layers past the depth given empty: a config that derives it from its checkpoint's depth
    (a tower's experts per layer from layer 25 on) then derives nothing for the shrunk layers, which it builds plain."""
    found = _LAYER_KEYS.search(message)
    if found is None:
        return None
    owners = [("", cls, kwargs)] + [(f"{name}.", sub, given) for name, sub, given in _sub_classes(cls, kwargs)]
    failing = [owner for owner in owners[1:] if _raises(owner[1], owner[2], found[0])]
    prefix, _owner_cls, given = (failing or owners)[0]
    table = given.get(found[1])
    if isinstance(table, dict):
        return {prefix + found[1]: {k: v for k, v in table.items() if 0 <= int(k) < int(found[2])}}
    return {prefix + found[1]: {}}


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(cls.__init__).parameters)  # type: ignore[misc]
    except (TypeError, ValueError):
        return {}


def _default(cls: type, name: str) -> Any:
    parameter = _parameters(cls).get(name)
    return None if parameter is None or parameter.default is parameter.empty else parameter.default


def _sub_classes(cls: type, kwargs: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    """``(name, class, the arguments it is given)`` of ``cls``'s sub-configs (a built one's arguments: its fields)."""
    found = []
    for name, spec in (getattr(cls, "sub_configs_defaults", None) or {}).items():
        given = kwargs.get(name)
        sub = type(given) if _is_config(given) else _spec_class(spec, given)
        if sub is not None:
            fields = vars(given) if _is_config(given) else dict(given or getattr(spec, "init_kwargs", None) or {})
            found.append((name, sub, fields))
    return found


def _owner_of(
    cls: type, kwargs: dict[str, Any], names: list[str], depth: int | None = None
) -> tuple[str, type, dict[str, Any]] | None:
    """Where ``names`` are set: ``(path prefix, class, its arguments)`` of ``cls`` or the first of its sub-configs
    whose constructor takes them all (and, given ``depth``, whose ``num_hidden_layers`` it is)."""
    owners = [("", cls, kwargs)] + [(f"{name}.", sub, given) for name, sub, given in _sub_classes(cls, kwargs)]
    for prefix, owner, given in owners:
        parameters = _parameters(owner)
        if not all(name in parameters for name in names):
            continue
        if depth is not None and given.get("num_hidden_layers", _default(owner, "num_hidden_layers")) != depth:
            continue
        return prefix, owner, given
    return None


def _raises(cls: type, kwargs: dict[str, Any], message: str) -> bool:
    """Whether building ``cls`` from ``kwargs`` alone raises with ``message`` in its error (which sub-config a
    composite's error came from)."""
    try:
        cls(**kwargs)
    except Exception as exc:  # noqa: BLE001 - any error: its message says whether it is the one
        return message in str(exc)
    return False


def _is_config(value: Any) -> bool:
    from transformers import PretrainedConfig

    return isinstance(value, PretrainedConfig)


def _spec_class(spec: Any, given: Any) -> type | None:
    """The class a sub-config spec builds (``AutoConfig``'s: the class of the given, else the default model type)."""
    from transformers import CONFIG_MAPPING, PretrainedConfig

    config_class = getattr(spec, "config_class", spec)
    if isinstance(config_class, type) and issubclass(config_class, PretrainedConfig):
        return config_class
    kind = (given or {}).get("model_type") if isinstance(given, dict) else None
    kind = kind or getattr(spec, "model_type", None)
    return CONFIG_MAPPING.get(kind) if kind else None


def _with(cls: type, kwargs: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    """``kwargs`` with ``path`` (``["vision_config", "text_hidden_size"]``) set to ``value``: a sub-config given as a
    dict is given with it, a built one is copied and set, one not given is given as its spec's arguments and it."""
    head, rest = path[0], path[1:]
    if not rest:
        return {**kwargs, head: value}
    spec = (getattr(cls, "sub_configs_defaults", None) or {}).get(head)
    given = kwargs.get(head)
    if _is_config(given):
        return {**kwargs, head: _rebuilt(given, rest, value)}
    arguments = dict(given) if isinstance(given, dict) else dict(getattr(spec, "init_kwargs", None) or {})
    sub = _spec_class(spec, arguments) if spec is not None else None
    if sub is None:
        return kwargs
    return {**kwargs, head: _with(sub, arguments, rest, value)}


def _rebuilt(config: Any, path: list[str], value: Any) -> Any:
    """A built sub-config built again with ``path`` set to ``value``, so that what it derives from the value (a video
    patch's width from its frames) is derived again; a copy with the attribute set when it cannot be built again."""
    if len(path) == 1:
        try:
            return type(config).from_dict({**config.to_dict(), path[0]: value})
        except Exception:  # noqa: BLE001 - a config its own dict does not build: the attribute alone is set
            pass
    built = copy.deepcopy(config)
    owner = built
    for name in path[:-1]:
        owner = getattr(owner, name)
    setattr(owner, path[-1], value)
    return built
