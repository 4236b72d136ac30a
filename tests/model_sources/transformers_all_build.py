"""Building a model of the every-type source (:mod:`model_sources.transformers_all_models`): :func:`build` tries the
shrinks in turn, builds the model (random weights, refused past :data:`MAX_PARAMETERS`), opens its closed gates and
redraws its constant matrices as a checkpoint has them, and runs the candidate samples until one runs, repairing the
config as the errors ask (:mod:`model_sources.transformers_all_repairs`) and refusing keys not grouped as the config
says (:class:`UngroupedKeys`)."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from model_sources import config_repairs, seeded
from model_sources.transformers_all_config import configs, first_attribute, free_token
from model_sources.transformers_all_repairs import (
    MISSING_TOKEN_ERROR,
    NO_SECTIONS_ERROR,
    SECTIONS_ERROR,
    recounted_sample,
    width_repair,
)
from model_sources.transformers_all_samples import candidate_samples
from model_sources.transformers_all_shrink import VARIANTS, shrunk

#: A shrink with more parameters than this is not small (BLT's "heads of 128" variant allocated 3 GB and ran past
#: the coverage run's deadline): refused before it is built, counted on the meta device.
MAX_PARAMETERS = 100_000_000


def build(model_type: str, class_name: str) -> tuple[torch.nn.Module, Any]:
    """The model (random weights, eval mode) of the first :data:`VARIANTS` shrink it builds and runs with, on the first
    candidate sample it runs on; raises with every variant's first error when none runs. A model whose forward takes
    images but ran on text alone tries the other shrinks for a sample with an image first (a tower sized for its
    config's own image: Aria's)."""
    errors = []
    text_only = None
    for variant, (name, _sizes, _kept) in enumerate(VARIANTS):
        try:
            model, sample = _build(model_type, class_name, variant)
        except Exception as exc:  # noqa: BLE001 - the next shrink; all are reported when none runs
            errors.append(f"[{name}] {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
            continue
        _cached_generation(model, sample[1])
        takes_images = "pixel_values" in inspect.signature(model.forward).parameters
        if not takes_images or "pixel_values" in sample[1]:
            return model, sample
        text_only = text_only or (model, sample)
    if text_only is not None:
        return text_only
    raise RuntimeError(f"{class_name} does not run eagerly from a small config: " + " || ".join(errors))


def _cached_generation(model: torch.nn.Module, sample: dict[str, Any]) -> None:
    """``generate`` with the key-value cache, as checkpoints generate. :data:`SMALL`'s ``use_cache=False`` (the
    forward sample returns no cache) is in the generation config of a model whose own config has ``use_cache``
    (Janus's, DeepSeek-VL's): ``generate`` then ran the whole prompt and its image again at every step, and a generated
    token that is the image placeholder failed the model's count of image tokens. The forward keeps the config's.
    Caching stays off for a model whose cache ``generate`` cannot read (Qwen3.5's shrink, whose two layers are both
    linear attention: its cache has no length)."""
    generation = getattr(model, "generation_config", None)
    if generation is None or generation.use_cache is not False:
        return
    try:
        with torch.no_grad():
            output = model(**sample, use_cache=True)
        cache = getattr(output, "past_key_values", None) or getattr(output, "cache", None)
        cache.get_seq_length()
    except Exception:  # noqa: BLE001 - no cache generate can use: it keeps generating without one
        return
    generation.use_cache = True


def _build(
    model_type: str,
    class_name: str,
    variant: int,
    sections: list[int] | None = None,
    tokens: dict[tuple[str, str], int] | None = None,
    widths: dict[tuple[str, str], int] | None = None,
) -> tuple[torch.nn.Module, Any]:
    import transformers

    config = shrunk(model_type, variant)
    for owner in configs(config) if sections else ():  # the code's default sections, scaled to the small head
        if isinstance(getattr(owner, "rope_parameters", None), dict):
            owner.rope_parameters["mrope_section"] = sections
    # the token ids the code reads and the config lacks, the widths a layer is fed (:func:`width_repair`)
    for (owner_name, name), value in {**(tokens or {}), **(widths or {})}.items():
        for owner in configs(config):
            if type(owner).__name__ == owner_name:
                setattr(owner, name, value)
    cls = getattr(transformers, class_name)
    with torch.device("meta"):  # counted before a byte is allocated: a shrink that is not small is refused
        size = sum(p.numel() for p in cls(config).parameters())
    if size > MAX_PARAMETERS:
        raise RuntimeError(f"the shrunk model has {size / 1e6:.0f}M parameters (more than {MAX_PARAMETERS / 1e6:.0f}M)")
    torch.manual_seed(0)
    model = cls(config).eval()
    redraw_constant_matrices(model, float(first_attribute(config, "initializer_range", default=0.02) or 0.02))
    open_gates(model)
    errors = []
    candidates = candidate_samples(model, config)
    for index, sample in enumerate(candidates):
        try:
            with torch.no_grad(), UngroupedKeys() as keys:
                model(**sample)
        except Exception as exc:  # noqa: BLE001 - the next candidate; all of them are reported when none runs
            found, unset = SECTIONS_ERROR.search(str(exc)), NO_SECTIONS_ERROR.search(str(exc))
            if found and sections is None:
                return _build(model_type, class_name, variant, _scaled(found[2], int(found[1])), tokens, widths)
            if unset and sections is None:  # as many axes as the model asks for, sharing the small head
                total = _head_size(getattr(config, "text_config", None) or config) // 2
                sections = _scaled(", ".join("1" * int(unset[1])), total)
                return _build(model_type, class_name, variant, sections, tokens, widths)
            width = width_repair(config, str(exc)) or config_repairs.forward_repair(configs(config), str(exc))
            if width is not None and len(widths or {}) < 3:
                return _build(model_type, class_name, variant, sections, tokens, {**(widths or {}), **width})
            recounted = recounted_sample(config, sample, str(exc))
            if recounted is not None and len(candidates) < 64:  # next: one placeholder per feature the model made
                candidates.insert(index + 1, recounted)
            missing = MISSING_TOKEN_ERROR.search(str(exc))
            if missing and (missing[1], missing[2]) not in (tokens or {}) and len(tokens or {}) < 4:
                free = {**(tokens or {}), (missing[1], missing[2]): free_token(config, tokens)}
                return _build(model_type, class_name, variant, sections, free, widths)
            errors.append(f"{sorted(sample)}: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
            continue
        found = keys.found or _audio_keys(model, candidates)
        if found:  # not a config a checkpoint has: the next shrink (key-value heads = heads) is
            raise RuntimeError(found)
        return model, ((), sample)
    raise RuntimeError("no candidate sample runs: " + " | ".join(errors))


def open_gates(model: torch.nn.Module) -> list[str]:
    """Set every gate parameter initialised to zero (named ``gate`` or ``alpha``, one value per gate: Mllama's and
    IDEFICS's tanh gates on the text's cross-attention to the image) to 1, and return their names. transformers
    starts them closed, as training does; a trained checkpoint's are open, and a closed gate shuts the image out of
    the logits."""
    opened = []
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            last = name.rsplit(".", 1)[-1]
            named = "gate" in last or last.startswith("alpha")
            if named and parameter.dim() <= 1 and parameter.is_floating_point() and not parameter.any():
                parameter.fill_(1.0)
                opened.append(name)
    return opened


def _head_size(config: Any) -> int:
    """The config's attention head size: its ``head_dim``, else its width over its heads."""
    head = getattr(config, "head_dim", None)
    if isinstance(head, int):
        return head
    return int(getattr(config, "hidden_size", 32) or 32) // int(getattr(config, "num_attention_heads", 2) or 2)


def _scaled(sections: str, total: int) -> list[int]:
    """Sections (``"8, 12, 12"``) scaled to sum to ``total``, each at least 1."""
    values = [int(x) for x in sections.split(",")]
    scaled = [max(1, round(x * total / sum(values))) for x in values]
    scaled[0] += total - sum(scaled)
    return scaled


def _audio_keys(model: torch.nn.Module, candidates: list[dict[str, Any]]) -> str | None:
    """:class:`UngroupedKeys`' finding on the model's ``get_audio_features`` (its audio tower, which a sample of text
    alone does not run: Nemotron 3.5 Transcribe's) on the first candidate audio it runs on, a mask of every frame for
    each other input it takes (over the last axis, else the second); None without the method or a finding."""
    method = getattr(model, "get_audio_features", None)
    if not callable(method):
        return None
    masks = [n for n in inspect.signature(method).parameters if n.endswith("mask")]
    for candidate in candidates:
        audio = candidate.get("input_features")
        if not isinstance(audio, torch.Tensor) or audio.dim() != 3:
            continue
        for frames in dict.fromkeys((audio.shape[-1], audio.shape[1])):
            try:
                with torch.no_grad(), UngroupedKeys() as keys:
                    method(audio, **{n: torch.ones(1, frames, dtype=torch.long) for n in masks})
            except Exception:  # noqa: BLE001 - the next layout
                continue
            return keys.found
    return None


class UngroupedKeys(torch.overrides.TorchFunctionMode):
    """Watches grouped-query attention calls (``enable_gqa=True``) for keys and values not grouped as the config's
    ``num_key_value_heads`` says: keys with as many heads as the queries (multi-head latent attention expands them per
    query head) or keys and values with different head counts. PyTorch's eager attention takes these (one group of
    one), but transformers' traced path repeats them by the config's groups and torch.export fails on a shape no
    checkpoint has (real configs of these types pair key-value heads with heads one to one)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: str | None = None

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention and kwargs.get("enable_gqa") and len(args) >= 3:
            query, key, value = args[:3]
            heads = (query.shape[-3], key.shape[-3], value.shape[-3])
            if self.found is None and heads[0] != 1 and (heads[1] == heads[0] or heads[1] != heads[2]):
                self.found = (
                    f"grouped-query attention on keys not grouped as num_key_value_heads says (query, key, value "
                    f"heads {heads}): the shrink's key-value heads do not fit the model"
                )
        return func(*args, **kwargs)


def redraw_constant_matrices(model: torch.nn.Module, std: float) -> list[str]:
    """Draw again (normal, ``std``, seeded) every weight of two or more dimensions whose elements are all equal,
    and return their names. transformers initialises some to zeros (AFMoE's router gate, adaLN-zero projections):
    a trained checkpoint never has them so, and a zero router scores every expert alike, so its top-k picks among
    ties, whose order PyTorch and ONNX do not share (PyTorch took experts 2 and 3 of 4, ONNX's TopK 0 and 1). One-
    dimensional parameters (biases, norms, AFMoE's expert bias) keep their values."""
    generator = seeded()
    redrawn = []
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() < 2 or parameter.numel() < 2 or not parameter.is_floating_point():
                continue
            flat = parameter.reshape(-1)
            if bool((flat == flat[0]).all()):
                drawn = torch.randn(parameter.shape, generator=generator, dtype=torch.float32) * std
                parameter.copy_(drawn.to(parameter.dtype))
                redrawn.append(name)
    return redrawn
