"""A transformers cache object in a plain conversion's result, exported as None: the graph computes the forward
without it.

A model that returns its key/value cache (``DynamicCache``, ``EncoderDecoderCache``, ``StaticCache``, ...: any
subclass of transformers' ``Cache``, anywhere in the result) cannot be exported as it is: torch.export knows no
such output type ("Found EncoderDecoderCache in output"), and a plain graph has no use for it, since only the
cached decoder step (``generation=``) takes a cache back in. The cache is a by-product of the call, not an answer
to it, so the export drops it:

- a forward that takes ``use_cache`` is called with ``use_cache=False`` (the cache is not built at all) when that
  gives exactly the outputs of the call as made, checked by one more eager call: ``use_cache`` is often set in a
  sub-config (T5Gemma's decoder, LLaVA's language model), where the model's own ``config.use_cache`` does not show
  it, and some models compute otherwise without a cache (FSMT applies its causal and padding masks only then), so
  the call is changed only where that changes nothing else;
- whatever cache the forward still returns (the call kept as made, a forward that builds one whatever it is asked,
  or that reads ``use_cache`` from a sub-config only) is replaced by None in the traced result.

The converted module returns None where the cache was (its output leaf is a None constant,
:func:`pipeline.runtime.io_spec.output_names_and_leaves`), and the conversion report names every dropped output
(``report.dropped_outputs``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

from pipeline.runtime import containers
from pipeline.runtime.io_spec import is_model_cache

logger = logging.getLogger(__name__)

#: why a cache output is dropped, as the report and the log say it
DROPPED_CACHE = (
    "the model's key/value cache: not a graph output, the module returns None there; convert with "
    "generation={'max_length': ..., 'max_batch': ...} for decoding with a cache (module.generate)"
)


def cache_outputs(result: Any) -> dict[str, str]:
    """The outputs of ``result`` that are transformers cache objects: where they are in the result (``result.cache``,
    ``result[1]``) -> type name.

    >>> cache_outputs((torch.ones(1), None))
    {}
    """
    leaves = containers.flatten_with_paths(result)[0]  # diffusers outputs have no flatten_with_keys_fn
    return {_where(path): type(leaf).__name__ for path, leaf in leaves if is_model_cache(leaf)}


def _where(path: tuple[Any, ...]) -> str:
    """``result.cache`` for a ModelOutput field (a mapping key that is a name), ``result[1]`` for a position."""
    return "result" + "".join(
        f".{key.key}" if isinstance(key, pytree.MappingKey) and str(key.key).isidentifier() else pytree.keystr((key,))
        for key in path
    )


@contextlib.contextmanager
def forward_without_cache(
    model: torch.nn.Module, result: Any, args: tuple[Any, ...], kwargs: dict[str, Any], python_values: bool = False
) -> Iterator[dict[str, str]]:
    """Within the block, ``model``'s forward returns None in place of every cache object of ``result`` (its output
    on ``args`` and ``kwargs``), called with ``use_cache=False`` when that gives the same outputs (module doc);
    the block gets the dropped outputs (:func:`cache_outputs`), and nothing changes when there are none.
    ``python_values``: Python numbers, bools and strings in the result are None in the traced result too (the module
    returns them as constants: a graph has only tensor outputs)."""
    dropped = cache_outputs(result)
    if not dropped and not python_values:
        yield dropped
        return
    if dropped:
        logger.warning(
            "output %s dropped: %s",
            ", ".join(f"{where} ({kind})" for where, kind in dropped.items()),
            DROPPED_CACHE,
        )
    bound = model.forward
    asks = (
        bool(dropped)
        and "use_cache" in inspect.signature(bound).parameters
        and _same_without_cache(bound, result, args, kwargs)
    )
    replaced = _none_for_value if python_values else _none_for_cache

    @functools.wraps(bound)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if asks:
            kwargs["use_cache"] = False
        return pytree.tree_map(replaced, bound(*args, **kwargs))

    own = model.__dict__.get("forward")  # a forward set on the instance itself, if any, to put back
    model.forward = forward
    try:
        yield dropped
    finally:
        if own is None:
            del model.forward
        else:
            model.forward = own


def _same_without_cache(forward: Any, result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``forward`` called with ``use_cache=False`` gives exactly the tensors of ``result``, at the same
    places."""
    try:
        again = forward(*args, **{**kwargs, "use_cache": False})
    except Exception:  # noqa: BLE001 -- a forward that cannot run without its cache is exported as called
        logger.debug("the model fails with use_cache=False: exported as called, its cache dropped from the outputs")
        return False
    before, after = _tensors(result), _tensors(again)
    same = before.keys() == after.keys() and all(torch.equal(a, after[path]) for path, a in before.items())
    if not same:
        logger.info(
            "the model computes other outputs with use_cache=False: exported as called, its cache dropped from the "
            "outputs"
        )
    return same


def _tensors(result: Any) -> dict[str, torch.Tensor]:
    leaves = containers.flatten_with_paths(result)[0]
    return {pytree.keystr(path): leaf for path, leaf in leaves if isinstance(leaf, torch.Tensor)}


def _none_for_cache(leaf: Any) -> Any:
    return None if is_model_cache(leaf) else leaf


def _none_for_value(leaf: Any) -> Any:
    return None if is_model_cache(leaf) or isinstance(leaf, bool | int | float | str) else leaf
