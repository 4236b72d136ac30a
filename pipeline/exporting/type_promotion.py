"""The exporter's type-promotion pass without running every node of the program again.

Before translating, ``torch.onnx.export`` makes PyTorch's implicit type promotion explicit: an FX interpreter walks
the program with fake tensors, and where a node's inputs need a cast (``aten.add`` of an int64 and a float32 tensor)
it inserts one. It runs *every* node through the fake-tensor dispatcher to get the values the next nodes read, even
though torch.export already recorded each node's fake value in ``node.meta["val"]``: 1.4 of the 5 seconds the ONNX
translation of a small 8-layer Llama decoder step takes.

Within :func:`fast_type_promotion`, a node that the pass leaves as it is (no rule, or a rule that casts nothing) gives
the interpreter its recorded value instead of running again. A node the pass changes, the casts it inserts, and
every node without a recorded value run as before, so the graph and every value the pass reads are the same: the
promotion of a node depends only on its inputs' dtypes, which the recorded values carry, and a promoted node's output
is cast back to the recorded type (``_rerun_node_after_type_promotion``), so the nodes after it keep theirs.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from pipeline.exporting.patching import SharedPatch


def _recorded(node: torch.fx.Node) -> Any:
    """The node's recorded fake value, or None when it has none to reuse."""
    value = node.meta.get("val")
    return value if node.op == "call_function" and value is not None else None


def _patch() -> SharedPatch | None:
    try:
        from torch.onnx._internal.fx.passes import type_promotion
    except ImportError:  # another PyTorch: its own pass runs unchanged
        return None
    interpreter = getattr(type_promotion, "_TypePromotionInterpreter", None)
    rule_of = getattr(type_promotion, "get_type_promotion_rule", None)
    if interpreter is None or rule_of is None or "run_node" not in interpreter.__dict__:
        return None

    def wrap(original: Any) -> Any:
        def run_node(self: Any, node: torch.fx.Node) -> Any:
            recorded = _recorded(node)
            if recorded is None:
                return original(self, node)
            args, kwargs = node.args, dict(node.kwargs)
            with self._set_current_node(node):
                rule = rule_of(node, self.type_promotion_table)
                if rule is not None:
                    self._maybe_promote_node(node, rule)
            if node.args != args or dict(node.kwargs) != kwargs:  # promoted: run it, as the pass does
                return torch.fx.Interpreter.run_node(self, node)
            return recorded

        return run_node

    return SharedPatch(interpreter, "run_node", wrap)


_PATCH = _patch()


def fast_type_promotion() -> Any:
    """A context in which the exporter's type-promotion pass reuses the values torch.export recorded (a no-op where
    this PyTorch's pass is not the one this was written for)."""
    return _PATCH.held() if _PATCH is not None else contextlib.nullcontext()
