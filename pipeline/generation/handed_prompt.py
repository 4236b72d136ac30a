"""The prompt a model's ``generate`` hands the causal LM inside it (BLIP's captioning head sets its first token to its
bos and drops its last, the processor's separator, with its mask column), read from its behaviour rather than its
code: :func:`handed_prompt` compares what the causal LM's ``generate`` was handed with the sample's prompt, then with
the same prompt shifted by one token id (a column the model writes itself keeps its value; a column it passes on
follows the shift). The result, a :data:`~pipeline.runtime.generation.cross_images.PROMPT_EDIT`, is what the
converted module does to a prompt before it decodes, so that its sequences start as ``model.generate``'s do.
"""

from __future__ import annotations

import torch

from converters.errors import InputError
from pipeline.generation import PLAIN_FORWARD
from pipeline.generation.cross_layout import Delegate, record_generate


def handed_prompt(
    model: torch.nn.Module, first: dict[str, torch.Tensor], delegate: Delegate, vocabulary: int
) -> tuple[int, tuple[tuple[int, int], ...]]:
    """``(dropped, written)``: how many tokens (and mask columns) the model's ``generate`` drops from the end of the
    prompt (``first``: the sample's first row) before it hands it to ``delegate``'s, and the columns it writes a
    token of its own into, ``(column, token)``. An InputError when the handed prompt is not the given one so edited."""
    name, inner = type(model).__name__, type(delegate.module).__name__
    given = first["input_ids"]
    handed = delegate.handed.get("input_ids")
    if not isinstance(handed, torch.Tensor) or handed.dim() != 2 or handed.shape[0] != given.shape[0]:
        raise InputError(
            f"{name}.generate hands {inner}.generate no prompt of input_ids [batch, tokens]",
            fix=PLAIN_FORWARD,
        )
    kept = int(handed.shape[1])
    dropped = int(given.shape[1]) - kept
    refused = InputError(
        f"{name}.generate hands {inner}.generate a prompt that is not the given one with tokens dropped from its end "
        f"and columns of its own written: the converted module cannot prepare prompts as {name}.generate does",
        fix=PLAIN_FORWARD,
    )
    if dropped < 0 or kept < 1:
        raise refused
    shifted = (given + 1) % max(vocabulary, 2)
    again = record_generate(model, {**first, "input_ids": shifted})[2]
    handed_again = None if again is None else again.handed.get("input_ids")
    if not isinstance(handed_again, torch.Tensor) or handed_again.shape != handed.shape:
        raise refused
    written: list[tuple[int, int]] = []
    for column in range(kept):
        ours, theirs = handed[:, column], handed_again[:, column]
        if torch.equal(ours, given[:, column]) and torch.equal(theirs, shifted[:, column]):
            continue
        if torch.equal(ours, theirs) and bool((ours == ours[0]).all()):
            written.append((column, int(ours[0])))
            continue
        raise refused
    mask, handed_mask = first.get("attention_mask"), delegate.handed.get("attention_mask")
    if (
        isinstance(mask, torch.Tensor)
        and isinstance(handed_mask, torch.Tensor)
        and (handed_mask.shape != handed.shape or not torch.equal(handed_mask.to(mask.dtype), mask[:, :kept]))
    ):
        raise refused
    return dropped, tuple(written)
