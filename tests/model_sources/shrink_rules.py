"""Shrink rules of the every-type transformers source (``transformers_all_models``) stated by what a config field is,
beside ``SMALL``'s sizes: a loop count the graph unrolls."""

from __future__ import annotations

import inspect
import re
from typing import Any

#: Iteration counts of a normalization the graph repeats (DeepSeek-V4's and GLM-5 Next's hyper-connections: 20
#: Sinkhorn-Knopp iterations, 39 chained divisions by a sum each), set to 2 as the shrink sets depths: TensorRT-RTX
#: 1.7's builder time grows about 3x per chained normalization (8 took 40 s; GLM-5 Next's step ran 16 min unbuilt).
REPEATS = re.compile(r"sinkhorn_iter")


def repeats(cls: type) -> dict[str, Any]:
    """The iteration counts (:data:`REPEATS`) that ``cls`` or its sub-configs take, 2 where their default is more.

    Example: ``repeats(transformers.DeepseekV4Config) == {"hc_sinkhorn_iters": 2}``.
    """
    owners = (cls, *(sub for sub in (getattr(cls, "sub_configs", None) or {}).values() if isinstance(sub, type)))
    return {
        name: 2
        for owner in owners
        for name, parameter in inspect.signature(owner.__init__).parameters.items()
        if REPEATS.search(name) and isinstance(parameter.default, int) and parameter.default > 2
    }
