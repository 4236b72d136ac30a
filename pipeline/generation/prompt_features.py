"""The features of one item alone for a features method that also takes the prompt (MusicFlamingo's
``get_audio_features(input_features, input_features_mask, input_ids)``): found from the method's signature, not read
from one architecture's code.

Such a method reads where the prompt's placeholder tokens are: MusicFlamingo times each audio window by its index within
its run of audio tokens (a long audio is several windows, one run of tokens), so a window's features depend on the
windows before it in its run. The features graph runs on one item (one leading row) before the prompt's step, so it
gives the item's features **in a prompt of its own**: the method called with a prompt that is one run of its
placeholder token (:class:`OwnPromptFeatures`: one token, the model's own check that the prompt holds as many
placeholder tokens as the item gives features set aside: transformers' ``torch_compilable_check``, since the count is
what the call finds out), so that one call, eager or traced, gives them. The check is set aside for the call only, in
the converting thread only, at conversion (the runtime runs the graph): transformers' own switch
(``TRANSFORMERS_DISABLE_TORCH_CHECK``) is process-wide and would turn off the checks of another thread running
transformers meanwhile, so the loaded transformers modules' ``torch_compilable_check`` is wrapped instead
(:class:`~pipeline.exporting.patching.SharedPatch`), skipping only where the converting thread set it aside.

That is what the model gives where each run of placeholder tokens holds one item's features, and is kept only where it
is so on the conversion sample (:func:`check_own_prompt`: the items' features, each in its own prompt, are exactly the
method's on the sample's prompt; an InputError otherwise). At run time, a prompt whose run of placeholder tokens holds
the features of several items (a MusicFlamingo audio of several windows) is refused
(:func:`~pipeline.runtime.generation.item_runs.check_item_runs`), since the graph gives no item's features after
another in its run.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from converters.errors import InputError
from pipeline.exporting.patching import SharedPatch
from pipeline.generation.audio_features import PROMPT_INPUTS

#: The prompt inputs an item's own prompt is made of: its placeholder tokens, and a mask keeping them all.
OWN_PROMPT = ("input_ids", "attention_mask")
#: Whether this thread has transformers' count checks set aside (:func:`_count_checks_off`).
_checks = threading.local()
_patches: dict[str, SharedPatch] = {}
_patches_lock = threading.Lock()


def prompt_inputs(method: Any) -> tuple[str, ...]:
    """The prompt inputs (``input_ids``, ...) a features ``method`` takes without a default, in its order."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in parameters if p.name in PROMPT_INPUTS and p.default is p.empty)


def placeholder_token(model: Any, modality: str) -> int | None:
    """The token ``model`` places its ``modality``'s features at: its config's ``{modality}_token_id`` or
    ``{modality}_token_index``."""
    config = getattr(model, "config", None)
    for name in (f"{modality}_token_id", f"{modality}_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def _skipped_here(check: Callable[..., Any]) -> Callable[..., Any]:
    """``check`` (transformers' ``torch_compilable_check``), a no-op in a thread that set the checks aside."""

    def checked(*args: Any, **kwargs: Any) -> Any:
        return None if getattr(_checks, "off", False) else check(*args, **kwargs)

    return checked


@contextlib.contextmanager
def _count_checks_off() -> Iterator[None]:
    """transformers' ``torch_compilable_check`` checks off for the call, in this thread (see the module docstring):
    every loaded transformers module holding the function has it wrapped while any such call is open."""
    from transformers.utils import import_utils

    original = import_utils.torch_compilable_check
    with _patches_lock:
        for name, module in list(sys.modules.items()):
            held = getattr(module, "__dict__", {}).get("torch_compilable_check")
            if name.startswith("transformers") and held is original and name not in _patches:
                _patches[name] = SharedPatch(module, "torch_compilable_check", _skipped_here)
        patches = list(_patches.values())
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch.held())
        before = getattr(_checks, "off", False)
        _checks.off = True
        try:
            yield
        finally:
            _checks.off = before


class OwnPromptFeatures:
    """``method`` (a features method taking the prompt's ``prompt``, e.g. ``input_ids``) on one item in a prompt of
    its own: one ``token`` (its placeholder), the method's check of the token count set aside (see the module
    docstring). Called as the method is, without the prompt inputs; its signature is the method's without them."""

    def __init__(self, method: Any, prompt: tuple[str, ...], token: int) -> None:
        self.method = method
        self.prompt = prompt
        self.token = token
        self.__name__ = getattr(method, "__name__", type(self).__name__)
        signature = inspect.signature(method)
        kept = [p for p in signature.parameters.values() if p.name not in prompt]
        self.__signature__ = signature.replace(parameters=kept)

    def __call__(self, *args: Any, **inputs: Any) -> Any:
        """The method's output on the item (``args``/``inputs``: its inputs but the prompt's) in its own prompt."""
        own = {"input_ids": torch.full((1, 1), self.token, dtype=torch.int64)}
        own["attention_mask"] = torch.ones_like(own["input_ids"])
        with _count_checks_off():
            return self.method(*args, **inputs, **{name: own[name] for name in self.prompt})


def own_prompt_features(model: Any, method: Any, modality: str) -> Any:
    """``method`` as it is, or, when it takes the prompt (:func:`prompt_inputs`) and every prompt input it takes is
    one an item's own prompt is made of (:data:`OWN_PROMPT`) and the config names the placeholder token, the method
    on each item in a prompt of its own (:class:`OwnPromptFeatures`)."""
    prompt = prompt_inputs(method)
    token = placeholder_token(model, modality)
    if not prompt or token is None or any(name not in OWN_PROMPT for name in prompt):
        return method
    return OwnPromptFeatures(method, prompt, token)


def check_own_prompt(model: Any, method: Any, modality: str, text: dict[str, Any], items: list[dict[str, Any]]) -> None:
    """An InputError unless the features of the sample's ``items``, each in its own prompt (``method``, an
    :class:`OwnPromptFeatures`), are exactly the method's on the sample's prompt ``text`` with every item (what the
    model's forward places); nothing for another method."""
    if not isinstance(method, OwnPromptFeatures):
        return
    name = f"{type(model).__name__}.{method.__name__}"
    whole = {key: torch.cat([item[key] for item in items]) for key in items[0]}
    try:
        with torch.no_grad():
            given = method.method(**whole, **{key: text[key] for key in method.prompt}, return_dict=True)
            alone = [method(**item, return_dict=True) for item in items]
    except Exception as error:  # noqa: BLE001 - the model refusing the sample: said with its cause
        raise InputError(
            f"{name} takes the prompt ({', '.join(method.prompt)}) and fails on the sample's: {type(error).__name__}: "
            f"{' '.join(str(error).split())[:200]}",
            fix=f"pass the processor's input_ids with one run of {modality} tokens per {modality}",
        ) from error
    expected = _rows(given)
    found = torch.cat([_rows(out) for out in alone]) if alone else expected[:0]
    # the items one at a time against all at once: a batched tower's rounding apart, relative to the features' scale
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    same = expected.shape == found.shape and torch.allclose(found, expected, rtol=1e-4, atol=1e-5 * max(scale, 1.0))
    if not same:
        apart = float((found - expected).abs().max()) if expected.shape == found.shape else None
        raise InputError(
            f"{name} takes the prompt ({', '.join(method.prompt)}): the features graph gives each {modality}'s "
            "features in a prompt of its own, and on the sample they are not the method's on the sample's prompt "
            + (f"({apart:.2g} apart; " if apart is not None else f"({found.shape[0]} rows, not {expected.shape[0]}; ")
            + f"the features depend on more of the prompt than the {modality}'s own run of placeholder tokens)",
            fix=f"convert a sample whose prompt holds each {modality}'s placeholder tokens as one run of its own, or "
            "without generation= (the plain forward)",
        )


def _rows(out: Any) -> torch.Tensor:
    """The features [tokens, hidden] in a features method's output (its ``pooler_output``, else itself)."""
    pooled = getattr(out, "pooler_output", out)
    if isinstance(pooled, list | tuple):
        pooled = torch.cat([piece.reshape(-1, piece.shape[-1]) for piece in pooled])
    return pooled.reshape(-1, pooled.shape[-1])
