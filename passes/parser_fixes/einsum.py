"""Einsum equations rewritten in the form TensorRT's parser reads: lowercase subscripts, no spaces, explicit output.

ONNX allows any letter and whitespace in an ``Einsum`` equation, and ``torch.einsum`` passes the user's text
through (torchvision's MaxViT writes ``"B G P N E, B G P M E -> B G P N M"``); TensorRT-RTX's parser rejects it
("Invalid character(s) in Einsum equation"). The rewrite drops the whitespace, gives every capital letter its
lowercase one (an unused one when that is taken; lowercase letters keep theirs) and writes the output of an implicit
equation (``"ij,jk"``: the subscripts used once, in alphabetical order of the original letters, as ONNX defines it)
explicitly. Renaming subscripts consistently does not change what an equation computes: the rewrite is exact.
Declined: more than 26 distinct letters (no lowercase left) and ellipses (``...``), left as they are.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from passes.rules import Facts, RewriteContext, RewriteRule


def normalized_equation(equation: str) -> str | None:
    """``equation`` with lowercase subscripts, no whitespace and an explicit output; None when it cannot be
    (an ellipsis, more than 26 letters).

    >>> normalized_equation("B G N E, B G M E -> B G N M")
    'bgne,bgme->bgnm'
    >>> normalized_equation("ij,Jk")
    'ij,ak->aijk'
    >>> normalized_equation("ij,jk")
    'ij,jk->ik'
    """
    text = "".join(equation.split())
    if "..." in text:
        return None
    inputs, arrow, output = text.partition("->")
    letters = [c for c in inputs if c.isalpha()]
    if not arrow:  # implicit: the subscripts used exactly once, in alphabetical order of the original letters
        output = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    used = sorted(set(letters) | set(output))
    if len(used) > len(string.ascii_lowercase):
        return None
    mapping = {c: c for c in used if c.islower()}
    for capital in (c for c in used if not c.islower()):  # its own lowercase when free, else the first free one
        taken = set(mapping.values())
        free = capital.lower() not in taken
        mapping[capital] = capital.lower() if free else min(set(string.ascii_lowercase) - taken)
    rename = str.maketrans(mapping)
    return f"{inputs.translate(rename)}->{output.translate(rename)}"


def _equation(node: gs.Node) -> str:
    value = node.attrs.get("equation", "")
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class EquationPlan:
    """The equation to write on the node."""

    equation: str


class EinsumEquationForParser(RewriteRule[EquationPlan]):
    """``Einsum(equation=e)`` -> ``Einsum(equation=normalized_equation(e))``, edited in place (module doc)."""

    name = "einsum_equation_for_parser"
    ops = frozenset({"Einsum"})

    def check(self, node: gs.Node, facts: Facts) -> EquationPlan | str:
        """The equation to write when it differs from the node's; else the reason the node stays."""
        equation = _equation(node)
        normalized = normalized_equation(equation)
        if normalized is None:
            return f"equation {equation!r} has an ellipsis or more than 26 subscripts: not rewritten"
        if normalized == equation:
            return f"equation {equation!r} is already in the parser's form"
        return EquationPlan(normalized)

    def rewrite(self, plan: EquationPlan, ctx: RewriteContext) -> None:
        """Set the node's equation (in place: same inputs, outputs and meaning)."""
        ctx.node.attrs["equation"] = plan.equation
