"""Prompts whose placeholder tokens come in one run per item: what a features graph that gives each item's features
in a prompt of its own can place (:mod:`pipeline.generation.prompt_features`: MusicFlamingo times an audio window by
its index within its run of audio tokens, so a run holding several windows gives the later ones other features).

>>> check_item_runs(torch.tensor([[5, 9, 9, 5, 9, 9]]), 9, [2, 2], "audio")
>>> check_item_runs(torch.tensor([[5, 9, 9, 9, 9, 5]]), 9, [2, 2], "audio")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
converters.errors.InputError: [input] a run of 4 audio tokens (9) in prompt 0 holds the features of audio 0 to 1...
"""

from __future__ import annotations

import torch

from converters.errors import InputError


def placeholder_runs(ids: torch.Tensor, token: int) -> list[tuple[int, int]]:
    """Every run of ``token`` in the prompts ``ids`` [rows, tokens] as (row, length), row after row, in order (the
    order the features are placed in)."""
    runs: list[tuple[int, int]] = []
    for row, prompt in enumerate(ids.tolist()):
        length = 0
        for value in [*prompt, None]:
            if value == token:
                length += 1
            elif length:
                runs.append((row, length))
                length = 0
    return runs


def check_item_runs(ids: torch.Tensor, token: int, counts: list[int], item: str) -> None:
    """An InputError unless each run of ``token`` in ``ids`` holds exactly one item's features, in order (``counts``:
    the number of features of each item, 0 for an item the model drops); ``item`` names one ("audio", "image")."""
    given = [count for count in counts if count > 0]
    first = 0  # the item the next run starts with
    for row, length in placeholder_runs(ids, token):
        held, last = 0, first
        while last < len(given) and held < length:
            held += given[last]
            last += 1
        if last - first == 1 and held == length:
            first = last
            continue
        items = f"{item} {first}" if last - first <= 1 else f"{item} {first} to {last - 1}"
        raise InputError(
            f"a run of {length} {item} tokens ({token}) in prompt {row} holds the features of {items} "
            f"({', '.join(str(count) for count in given[first:last]) or 'none'}): the model's features of an {item} "
            f"depend on where it is within its run of {item} tokens, and the features graph gives each {item}'s "
            "features as the first of its run",
            fix=f"pass prompts whose every run of {item} tokens holds one {item}'s features (one row of the {item} "
            "inputs), or convert without generation= (the plain forward)",
        )
