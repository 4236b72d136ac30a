"""What a converter is registered for: a torch op or an ONNX op, reduced to the ONNX node it matches.

A ``torch.library`` op ``mylib::gelu_tanh`` is exported as an opaque node with domain ``mylib`` and op_type
``gelu_tanh`` (``gelu_tanh.<overload>`` for an overload other than ``default``); an ONNX op ``Gelu`` or
``com.microsoft::Gelu`` is its own node. Every spelling is checked against the op it names, and a misspelling
gets an error that gives the right one.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import onnx

from converters.errors import ConversionError

if TYPE_CHECKING:  # ONNX op targets (the parser fixes' rules, `pipeline check`) resolve without importing torch
    import torch

ONNX_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True, order=True)
class OpKey:
    """The ONNX node a converter matches: ``domain`` (``""`` for standard ONNX) and ``op_type``."""

    domain: str
    op_type: str

    def __str__(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    @property
    def is_standard(self) -> bool:
        """Is this an op of the standard ONNX domains?"""
        return self.domain in ONNX_DOMAINS


def node_key(domain: str | None, op_type: str) -> OpKey:
    """The key a graph node of ``domain``/``op_type`` is looked up by (standard domains spelled "")."""
    return OpKey("" if domain in (None, *ONNX_DOMAINS) else str(domain), op_type)


def torch_op_key(op: torch._ops.OpOverload) -> OpKey:
    """The opaque node a torch op is exported as."""
    namespace, _, name = op._schema.name.partition("::")
    overload = op._overloadname
    return OpKey(namespace, name if overload == "default" else f"{name}.{overload}")


def resolve_target(target: Any) -> tuple[OpKey, torch._ops.OpOverload | None]:
    """A registration target -> the node key it matches and, for a torch op, the overload."""
    torch = sys.modules.get("torch")  # a torch op object exists only once torch is imported
    if torch is not None and isinstance(target, torch._ops.OpOverload):
        return torch_op_key(target), target
    if torch is not None and isinstance(target, torch._ops.OpOverloadPacket):
        return _packet_key(target, str(target._qualified_op_name))
    if not isinstance(target, str) or not target:
        raise ConversionError(
            f"cannot register a converter for {target!r}",
            fix="name a torch op ('mylib::op', torch.ops.mylib.op) or an ONNX op ('Gelu', 'com.microsoft::Gelu')",
        )
    domain, sep, name = target.rpartition("::")
    if not sep:
        return _onnx_key("", target), None
    op_name, _, overload = name.partition(".")
    packet = _torch_packet(domain, op_name)
    if packet is not None:
        if not overload:
            return _packet_key(packet, target)
        if overload not in packet.overloads():
            raise ConversionError(
                f"{target!r} names no overload of {domain}::{op_name}",
                fix=f"use one of: {', '.join(f'{domain}::{op_name}.{o}' for o in packet.overloads())}",
            )
        op = getattr(packet, overload)
        return torch_op_key(op), op
    return _onnx_key(domain, name), None


def _packet_key(packet: torch._ops.OpOverloadPacket, spelled: str) -> tuple[OpKey, torch._ops.OpOverload]:
    overloads = list(packet.overloads())
    if overloads == ["default"]:
        op = packet.default
        return torch_op_key(op), op
    raise ConversionError(
        f"{spelled!r} is an overload packet with several overloads; a converter needs one",
        fix=f"register one of: {', '.join(f'{packet._qualified_op_name}.{o}' for o in overloads)}",
    )


def _torch_packet(namespace: str, name: str) -> torch._ops.OpOverloadPacket | None:
    if namespace in ONNX_DOMAINS or "." in namespace:  # ONNX domains are dotted (com.microsoft); torch ones aren't
        return None
    import torch

    try:
        packet = getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return None
    return packet if isinstance(packet, torch._ops.OpOverloadPacket) else None


def _onnx_key(domain: str, op_type: str) -> OpKey:
    key = node_key(domain, op_type)
    if onnx.defs.has(op_type, key.domain):
        return key
    if key.domain and "." not in key.domain:
        raise ConversionError(
            f"{domain}::{op_type} names no torch op (is the library that defines it imported?) and no ONNX op",
            fix=f"import the module that defines torch.ops.{domain}.{op_type} before registering, "
            "or check the spelling",
        )
    close = [
        s.name for s in onnx.defs.get_all_schemas() if s.name.lower() == op_type.lower() and s.domain == key.domain
    ]
    raise ConversionError(
        f"{str(key)!r} names no ONNX op",
        fix=f"did you mean {close[0]!r}?" if close else "check the op_type and domain against the ONNX operator list",
    )
