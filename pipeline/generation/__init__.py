"""Generation: a transformers causal LM converted as one cached decoder step, and the decoding loop around it.

``pipeline.convert(model, input_ids, generation={"max_length": 256, "max_batch": 4})`` converts
:class:`~pipeline.generation.step.CachedStep` (static cache per layer as graph inputs, ``TensorScatter`` writes,
``Attention`` with a boolean mask) and returns a :class:`~pipeline.runtime.generation.module.GenerativeModule` whose
``generate``/``stream`` decode like transformers. The conversion needs transformers 5 (:func:`check_transformers`);
the converted modules' runtime (``pipeline.runtime.generation``) imports it only to return its output classes.
"""

from __future__ import annotations

import importlib.metadata

from converters.errors import InputError

#: The ``fix=`` of a refusal to convert a model for generation: its plain forward still converts.
PLAIN_FORWARD = "convert without generation= (the plain forward)"

#: The oldest transformers major version ``generation=`` converts with: its cache layers (``CacheLayerMixin``), its
#: masking functions, and a ``GenerationConfig`` whose fields are None unless set (a given ``generation_config``'s set
#: fields go over the model's own: in transformers 4 every field carries its default and would).
MIN_TRANSFORMERS = 5


def check_transformers() -> None:
    """An InputError naming the installed transformers when it is older than :data:`MIN_TRANSFORMERS` (or absent)."""
    from pipeline.versions import distribution_version

    try:
        found = distribution_version("transformers")
    except importlib.metadata.PackageNotFoundError:
        found = ""
    major = found.split(".")[0]
    if not major.isdigit() or int(major) < MIN_TRANSFORMERS:
        have = f"transformers {found} is installed" if found else "transformers is not installed"
        raise InputError(
            f"convert(..., generation=...) needs transformers {MIN_TRANSFORMERS} or later (its cache "
            f"layers, masking functions and generation-config semantics); {have}",
            fix=f"pip install 'transformers>={MIN_TRANSFORMERS}'",
        )
