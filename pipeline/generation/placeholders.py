"""What a vision-language model embeds at its placeholder tokens when no media is handed: a decode step that
generates one (an image, video or audio token) must embed it as the model's own forward does.

Some models embed a placeholder as another token (Muse Spark embeds its image, video and audio placeholders as id 0,
Gemma 4 as its pad token); most embed the placeholder's own row. The step hands such a model ``inputs_embeds``, which
it computes from the ids itself, so it needs the rows the model would use: each is read from the model run on the
token alone, as its input embedding's output there. Nothing here reads one architecture's code: the config's
``*_token_id`` / ``*_token_index`` integers name the candidates, and the model's own forward says what it embeds.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from pipeline.generation.handed_features import placed_at

logger = logging.getLogger(__name__)

#: Config integers that name tokens but are no placeholder the model could embed otherwise (sequence marks).
_NOT_PLACEHOLDERS = frozenset(
    {"pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id"}
)


def embedded_at(model: torch.nn.Module, token: int) -> torch.Tensor | None:
    """What the model's input embedding gives at ``token`` when the model runs on that token alone ([hidden]), None
    where it refuses the call or embeds nothing there; where the step places the features in the embeddings the
    forward hands a module (:func:`~pipeline.generation.placement_check.placed_at`: Gemma 3n's language model), what
    the forward hands that module there."""
    embeddings: Any = getattr(model, "get_input_embeddings", None)
    if not callable(embeddings):
        return None
    module = embeddings()
    ids = torch.tensor([[token]], dtype=torch.int64)
    seen: list[Any] = []
    receiver = placed_at(model)
    if receiver is not None:
        hook = receiver.register_forward_pre_hook(
            lambda _module, _args, kwargs: seen.append(kwargs.get("inputs_embeds")), with_kwargs=True
        )
    else:
        hook = module.register_forward_hook(lambda _module, _args, out: seen.append(out))
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    except Exception as error:  # noqa: BLE001 - a model that refuses the token alone: said at debug, no row
        logger.debug("%s refuses token %d alone (%s)", type(model).__name__, token, error)
        return None
    finally:
        hook.remove()
    first = seen[0] if seen else None
    return first.reshape(-1).float() if isinstance(first, torch.Tensor) and first.shape[:2] == (1, 1) else None


def placeholder_rows(model: torch.nn.Module, image_token: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The placeholder tokens the model embeds as another row than their own (besides ``image_token``, whose row the
    step's decode features hold) and those rows: ids [K] int64 and rows [K, hidden] (K may be 0)."""
    config = getattr(model, "config", None)
    embeddings: Any = getattr(model, "get_input_embeddings", None)
    found: dict[int, torch.Tensor] = {}
    if config is not None and callable(embeddings):
        vocabulary = int(embeddings().weight.shape[0]) if hasattr(embeddings(), "weight") else 0
        for name, value in sorted(vars(config).items()):
            named = name.endswith(("_token_id", "_token_index")) and name not in _NOT_PLACEHOLDERS
            if not named or not isinstance(value, int) or isinstance(value, bool) or value == image_token:
                continue
            if not 0 <= value < vocabulary or value in found:
                continue
            row = embedded_at(model, value)
            with torch.no_grad():
                own = embeddings()(torch.tensor([value])).reshape(-1).float()
            if row is not None and row.shape == own.shape and not torch.equal(row, own):
                logger.info("vision-language: %s embeds its %s (%d) as another row", type(model).__name__, name, value)
                found[value] = row
    ids = torch.tensor(sorted(found), dtype=torch.int64)
    hidden = next(iter(found.values())).numel() if found else 0
    rows = torch.stack([found[i] for i in sorted(found)]) if found else torch.zeros(0, hidden)
    return ids, rows
