"""The features of one image from a vision graph that takes the model's data-computed masks as keeping every element
(:mod:`pipeline.generation.kept_selections`: Idefics2, Idefics3 and SmolVLM drop all-zero padding images by a mask
computed from the pixels). Such a graph also outputs whether the masks the model computed on the call kept every
element (:data:`ALL_KEPT`) and whether they kept none (:data:`NONE_KEPT`), and, where the features are one block of
rows per element of its lone mask (:func:`pipeline.generation.kept_selections.by_element`: Idefics3's, one block per
image of a row), the mask itself (:data:`KEPT_ELEMENTS`). :func:`kept_features` gives the features, none (the model
drops the image: a row of padding images), the kept elements' blocks (a row with padding images after its own), or
refuses an image the model keeps in part that the graph cannot cut.
"""

from __future__ import annotations

import torch

from converters.errors import InputError

#: The vision graph's outputs when it takes masks as keeping every element: the features [tokens, hidden], whether
#: every mask the model computed kept every element, and whether every one kept none (boolean scalars); the model's
#: mask [elements] where the features are one block per element.
FEATURES, ALL_KEPT, NONE_KEPT, KEPT_ELEMENTS = "features", "all_kept", "none_kept", "kept_elements"


def kept_features(outputs: dict[str, torch.Tensor], index: int) -> torch.Tensor:
    """The features of image ``index`` from the vision graph's outputs of its call, by name (``outputs`` without
    :data:`ALL_KEPT`: the first output, a graph that selects as the model does): the features when the model's masks
    kept every element, none (zero rows) when they kept none, the kept elements' blocks of rows when the graph gives the
    mask (:data:`KEPT_ELEMENTS`), else an InputError when they kept some."""
    if ALL_KEPT not in outputs:
        return next(iter(outputs.values()))
    features = outputs[FEATURES]
    if bool(outputs[ALL_KEPT]):
        return features
    if bool(outputs[NONE_KEPT]):
        return features[:0]
    mask = outputs.get(KEPT_ELEMENTS)
    if mask is not None and mask.numel() and features.shape[0] % mask.numel() == 0:
        blocks = features.reshape(mask.numel(), -1, features.shape[-1])
        return blocks[mask.reshape(-1).to(torch.bool)].reshape(-1, features.shape[-1])
    raise InputError(
        f"image {index} is kept in part by the model (some of its sub-images are all-zero padding, which the model "
        "drops), but the vision graph for TensorRT takes each image whole or drops it whole",
        fix="pass images whose rows hold the same number of sub-images (one prompt per request, or prompts with the "
        "same images), or convert for backend='onnxruntime'",
    )
