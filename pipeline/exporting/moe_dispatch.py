"""Mixture-of-experts modules that loop over the experts their tokens chose, exported as a dense dispatch.

Some transformers expert modules (Switch Transformers, NLLB-MoE, DBRX, LongCat-Flash, OpenAI's privacy filter) are
plain Python loops: ``expert_hit = (expert_mask.sum(...) > 0).nonzero()``, then ``for expert_idx in expert_hit`` gather
the tokens routed to that expert, run it and ``index_add_`` the weighted result back. The loop's length and every
gather's size are data, so torch.export stops at the first one (``GuardOnDataDependentSymNode``), in plain
``torch.onnx.export`` too.
(transformers' other MoE models go through ``transformers::grouped_mm_fallback`` when exported, which
:mod:`converters.aten.grouped_mm` lowers.)

:func:`dense_expert_dispatch` replaces those modules' ``forward`` for the duration of the export with the same sum
written without data-dependent shapes: every expert runs on every token, and a token keeps an expert's output, times
its routing weight, where the routing mask sends it there (``Where``, so a non-finite output of an expert the token
was not routed to never leaks in). Per token the result is the eager loop's: the same experts, the same weights,
added in the same expert order (the others add exact zeros). The price is the experts' work times the expert count
over the tokens' top-k, said in the log. Only the module classes of :data:`_DISPATCH` are touched; their eager
``forward`` is restored when the block ends, so validation compares the graph with the model's own loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.exporting.patching import SharedPatch

logger = logging.getLogger(__name__)

Expert = Callable[[int, torch.Tensor], torch.Tensor]  # (expert index, tokens [T, H]) -> outputs [T, H]


def _dense(
    hidden: torch.Tensor, expert_mask: torch.Tensor, weights: torch.Tensor, experts: int, run: Expert
) -> torch.Tensor:
    """``sum_e where(routed_e, run(e, hidden) * w_e, 0)``: ``expert_mask`` is the eager loop's ``[E, K, T]`` (non-zero
    where slot ``k`` of token ``t`` goes to expert ``e``), ``weights`` its ``[T, K]`` routing weights."""
    out = torch.zeros_like(hidden)
    for e in range(experts):
        routed = (expert_mask[e] != 0).transpose(0, 1)  # [T, K]
        weight = torch.where(routed, weights, torch.zeros((), dtype=weights.dtype)).sum(-1, keepdim=True)  # [T, 1]
        contribution = (run(e, hidden) * weight).to(hidden.dtype)
        out = out + torch.where(routed.any(-1, keepdim=True), contribution, torch.zeros((), dtype=hidden.dtype))
    return out


def _switch(
    self: Any, hidden_states: torch.Tensor, selected_experts: torch.Tensor, routing_weights: torch.Tensor
) -> torch.Tensor:
    """``SwitchTransformersExperts.forward``: ``selected_experts`` ``[T, K, E]``, ``routing_weights`` ``[T, K]``."""
    return _dense(
        hidden_states,
        selected_experts.permute(2, 1, 0),
        routing_weights,
        self.num_experts,
        lambda e, h: self[f"expert_{e}"](h),
    )


def _nllb(
    self: Any, hidden_states: torch.Tensor, router_mask: torch.Tensor, router_probs: torch.Tensor
) -> torch.Tensor:
    """``NllbMoeExperts.forward`` in eval mode (token dropout scales by ``1 - p``)."""
    keep = 1 - self.moe_token_dropout

    def run(e: int, h: torch.Tensor) -> torch.Tensor:
        out = self[f"expert_{e}"](h)
        return out * keep if self.moe_token_dropout > 0 else out

    expert_mask = F.one_hot(router_mask, num_classes=self.num_experts).permute(2, 1, 0)
    return _dense(hidden_states, expert_mask, router_probs, self.num_experts, run)


def _dbrx(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """``DbrxExperts.forward``: one stacked GLU, expert ``e`` the ``e``-th block of its three matrices."""
    batch = hidden_states.shape[0]
    hidden = hidden_states.reshape(-1, self.hidden_size)
    split = (-1, self.ffn_hidden_size, self.hidden_size)
    mlp = self.mlp

    def run(e: int, h: torch.Tensor) -> torch.Tensor:
        out = mlp(h, mlp.w1.view(split)[e], mlp.v1.view(split)[e], mlp.w2.view(split)[e])
        return out.view(-1, self.hidden_size)

    expert_mask = F.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
    return _dense(hidden, expert_mask, top_k_weights, self.num_experts, run).view(batch, -1, self.hidden_size)


def _longcat(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """``LongcatFlashExperts.forward``: routed experts, then identity ("zero-compute") experts."""
    if top_k_index.numel() == 0:
        return torch.zeros_like(hidden_states)

    def run(e: int, h: torch.Tensor) -> torch.Tensor:
        if e >= self.num_routed_experts or self.gate_up_proj is None:
            return self.identity_expert(h)
        gate, up = F.linear(h, self.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(self.act_fn(gate) * up, self.down_proj[e])

    expert_mask = F.one_hot(top_k_index, num_classes=self.total_experts).permute(2, 1, 0)
    return _dense(hidden_states, expert_mask, top_k_weights, self.total_experts, run)


def _privacy_filter(
    self: Any, hidden_states: torch.Tensor, router_indices: torch.Tensor, routing_weights: torch.Tensor
) -> torch.Tensor:
    """``OpenAIPrivacyFilterExperts.forward``: GPT-OSS's clamped GLU with biases, every product in float32 and the sum
    too (cast back to the input's type at the end, as the loop does)."""

    def run(e: int, h: torch.Tensor) -> torch.Tensor:
        gate_up = h.float() @ self.gate_up_proj[e].float() + self.gate_up_proj_bias[e].float()
        return self._apply_gate(gate_up).float() @ self.down_proj[e].float() + self.down_proj_bias[e].float()

    expert_mask = F.one_hot(router_indices, num_classes=self.num_experts).permute(2, 1, 0)
    total = _dense(hidden_states.float(), expert_mask, routing_weights.float(), self.num_experts, run)
    return total.to(hidden_states.dtype)


# (module, class name) -> the dense forward and how to read the expert count off an instance
_DISPATCH: dict[tuple[str, str], tuple[Callable[..., torch.Tensor], Callable[[Any], int]]] = {
    ("transformers.models.switch_transformers.modeling_switch_transformers", "SwitchTransformersExperts"): (
        _switch,
        lambda m: m.num_experts,
    ),
    ("transformers.models.nllb_moe.modeling_nllb_moe", "NllbMoeExperts"): (_nllb, lambda m: m.num_experts),
    ("transformers.models.dbrx.modeling_dbrx", "DbrxExperts"): (_dbrx, lambda m: m.num_experts),
    ("transformers.models.longcat_flash.modeling_longcat_flash", "LongcatFlashExperts"): (
        _longcat,
        lambda m: m.total_experts,
    ),
    ("transformers.models.openai_privacy_filter.modeling_openai_privacy_filter", "OpenAIPrivacyFilterExperts"): (
        _privacy_filter,
        lambda m: m.num_experts,
    ),
}
_PATCHES: dict[type, SharedPatch] = {}


def _replaced_by(forward: Callable[..., torch.Tensor]) -> Callable[[Any], Callable[..., torch.Tensor]]:
    return lambda _original: forward


@contextmanager
def dense_expert_dispatch(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, the expert modules of :data:`_DISPATCH` in ``model`` run the dense dispatch (module doc)."""
    found: dict[type, list[int]] = {}
    for module in model.modules():
        entry = _DISPATCH.get((type(module).__module__, type(module).__qualname__))
        if entry is not None:
            found.setdefault(type(module), []).append(entry[1](module))
    with ExitStack() as stack:
        for cls, counts in found.items():
            forward = _DISPATCH[(cls.__module__, cls.__qualname__)][0]
            if cls not in _PATCHES:
                _PATCHES[cls] = SharedPatch(cls, "forward", _replaced_by(forward))
            stack.enter_context(_PATCHES[cls].held())
            logger.info(
                "%d %s module(s) exported with a dense expert dispatch: each runs all its %s experts on every "
                "token (the eager loop's per-expert gathers have data-dependent sizes)",
                len(counts),
                cls.__qualname__,
                "/".join(str(c) for c in sorted(set(counts))),
            )
        yield
