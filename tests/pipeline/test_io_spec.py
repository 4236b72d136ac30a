"""How calls and results map onto graph inputs and outputs."""

from __future__ import annotations

import inspect

import pytest
import torch

from pipeline.runtime import io_spec


def forward(x: torch.Tensor, pair: tuple[torch.Tensor, torch.Tensor], *rest: torch.Tensor, mask=None, flag=True):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN201
    return x


SIGNATURE = inspect.signature(forward)


def test_input_names_follow_argument_paths() -> None:
    t = torch.zeros(1)
    args, kwargs = io_spec.bind_call(SIGNATURE, (t, (t, t), t, t), {"flag": False, "mask": {"a": t}})
    names, tensors, leaves, _ = io_spec.input_names_and_leaves(SIGNATURE, args, kwargs)
    assert names == ["x", "pair_0", "pair_1", "rest_0", "rest_1", "mask_a"]
    assert len(tensors) == 6
    assert [leaf.value for leaf in leaves if leaf.kind == io_spec.CONSTANT] == [False]


def test_keyword_order_and_positional_keywords_are_canonical() -> None:
    t = torch.zeros(1)
    one = io_spec.bind_call(SIGNATURE, (t, (t, t)), {"flag": False, "mask": t})
    two = io_spec.bind_call(SIGNATURE, (), {"mask": t, "flag": False, "pair": (t, t), "x": t})
    assert list(one[1]) == list(two[1]) == ["x", "pair", "mask", "flag"]
    assert one[0] == two[0] == ()


def test_spelled_out_defaults_are_the_same_call() -> None:
    t = torch.zeros(1)
    omitted = io_spec.bind_call(SIGNATURE, (t, (t, t)), {})
    spelled = io_spec.bind_call(SIGNATURE, (t,), {"pair": (t, t), "mask": None, "flag": True})
    assert omitted[1].keys() == spelled[1].keys() and omitted[1]["flag"] is True and omitted[1]["mask"] is None


def test_values_in_star_args_keep_earlier_parameters_positional() -> None:
    t = torch.zeros(1)
    args, kwargs = io_spec.bind_call(SIGNATURE, (t, (t, t), t), {})
    assert len(args) == 3 and list(kwargs) == ["mask", "flag"]


@pytest.mark.parametrize(
    ("result", "names"),
    [
        (torch.zeros(1), ["out"]),
        ((torch.zeros(1), [torch.zeros(1), None]), ["out_0", "out_1_0"]),
        ({"logits": torch.zeros(1), "aux": {"loss": torch.zeros(1)}}, ["logits", "aux_loss"]),
    ],
)
def test_output_names(result: object, names: list[str]) -> None:
    got, _, leaves, tree = io_spec.output_names_and_leaves(result)
    assert got == names
    rebuilt = io_spec.IOSpec((), (), "", (), tree, leaves, ()).unflatten_outputs([torch.ones(1)] * len(names))
    assert torch.utils._pytree.tree_structure(rebuilt) == torch.utils._pytree.tree_structure(result)


def test_normalise_sample_forms() -> None:
    t = torch.zeros(1)
    assert io_spec.normalise_sample(t) == ((t,), {})
    assert io_spec.normalise_sample((t, t)) == ((t, t), {})
    assert io_spec.normalise_sample(((t,), {"m": t})) == ((t,), {"m": t})
