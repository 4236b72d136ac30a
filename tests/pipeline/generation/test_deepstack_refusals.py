"""What the deepstack probe (:func:`pipeline.generation.deepstack.deepstack_layers`) reads from a model's forward, and
its three refusals, each an InputError naming the model and the fix: a text model with no list of decoder layers, one
that changes the hidden states between layers otherwise than by adding one level at the image tokens, and one that
places no features in its embeddings (``zeroed``) while its first layer takes no level alone. Toy models in the
shape of a vision-language model's text side: the probe reads only the hidden states its layers take and return."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from converters.errors import InputError
from pipeline.generation.deepstack import DeepstackLevels, deepstack_layers

HIDDEN = 4
IS_IMAGE = torch.tensor([[False, True, True, False], [True, True, False, False]])  # 4 image tokens in all
LEVELS = [torch.full((4, HIDDEN), 1.0), torch.arange(16, dtype=torch.float32).reshape(4, HIDDEN)]


class Layer(torch.nn.Module):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states * 0.5 + 1.0


class Text(torch.nn.Module):
    """Two decoder layers and a final norm; ``between(hidden)`` is what the model adds after its first layer."""

    def __init__(self, between: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer(), Layer()])
        self.norm = torch.nn.Identity()
        self.between = between

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = self.layers[0](hidden)
        hidden = hidden + self.between(hidden)
        return self.norm(self.layers[1](hidden))


class Model(torch.nn.Module):
    def __init__(self, text: torch.nn.Module) -> None:
        super().__init__()
        self.text = text

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.text(hidden)


def placed(level: torch.Tensor) -> torch.Tensor:
    """``level``'s rows at the image tokens, in order, zero elsewhere: what a deepstack model adds."""
    out = torch.zeros(*IS_IMAGE.shape, HIDDEN)
    out[IS_IMAGE] = level
    return out


def probe(text: torch.nn.Module, zeroed: bool = False) -> DeepstackLevels:
    return deepstack_layers(Model(text), text, {"hidden": torch.randn(2, 4, HIDDEN)}, IS_IMAGE, LEVELS, zeroed)


def test_a_level_added_at_the_image_tokens_after_a_layer_is_read() -> None:
    assert probe(Text(lambda _h: placed(LEVELS[1]))) == DeepstackLevels({0: (1,)})


def test_a_text_model_without_decoder_layers_is_refused_by_name() -> None:
    with pytest.raises(InputError, match=r"Model's text model \(Linear\) has no list of decoder layers") as error:
        probe(torch.nn.Linear(HIDDEN, HIDDEN))
    assert "without generation=" in str(error.value)


@pytest.mark.parametrize(
    "between",
    [lambda h: torch.ones_like(h), lambda _h: placed(LEVELS[1] * 2)],
    ids=["added at the text tokens too", "not one of the levels"],
)
def test_any_other_change_between_layers_is_refused(between: Callable[[torch.Tensor], torch.Tensor]) -> None:
    with pytest.raises(InputError, match="after its decoder layer 0 otherwise than by adding one level") as error:
        probe(Text(between))
    assert "without generation=" in str(error.value)


def test_a_model_without_features_whose_first_layer_takes_no_level_is_refused() -> None:
    """``zeroed``: the model's features are levels only (Granite 4 Vision's); its first layer must take one level
    alone at the image tokens. Here it takes the random hidden states."""
    with pytest.raises(InputError, match="places no image features in its embeddings"):
        probe(Text(lambda _h: placed(LEVELS[0])), zeroed=True)
