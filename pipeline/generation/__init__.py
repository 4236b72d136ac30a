"""Generation: a transformers causal LM converted as one cached decoder step, and the decoding loop around it.

``pipeline.convert(model, input_ids, generation={"max_length": 256, "max_batch": 4})`` converts
:class:`~pipeline.generation.step.CachedStep` (static cache per layer as graph inputs, ``TensorScatter`` writes,
``Attention`` with a boolean mask) and returns a :class:`~pipeline.runtime.generation.module.GenerativeModule` whose
``generate``/``stream`` decode like transformers. ``step.py`` and ``conversion.py`` import transformers; the rest
does not.
"""

#: The ``fix=`` of a refusal to convert a model for generation: its plain forward still converts.
PLAIN_FORWARD = "convert without generation= (the plain forward)"
