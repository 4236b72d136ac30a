"""The conversion layer's functions that took over the module's methods (``pipeline.refit``, ``pipeline.compare``
with ``module=``): what a user of the old methods meets, and what the functions refuse."""

from __future__ import annotations

import pytest
import torch

import pipeline


@pytest.fixture(scope="module")
def mlp() -> tuple[torch.nn.Module, pipeline.ConvertedModule]:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    return model, pipeline.convert(model, torch.randn(2, 8), validate=False)


@pytest.mark.parametrize("method", ["refit", "compare"])
def test_the_old_methods_say_where_they_went(
    mlp: tuple[torch.nn.Module, pipeline.ConvertedModule], method: str
) -> None:
    with pytest.raises(
        AttributeError, match=rf"ConvertedModule\.{method} is now pipeline\.{method}: pipeline\.{method}\("
    ):
        getattr(mlp[1], method)
    with pytest.raises(AttributeError, match="has no attribute 'not_a_thing'"):  # other names: torch's own error
        mlp[1].not_a_thing  # noqa: B018


def test_compare_with_a_module_takes_no_conversion_option(
    mlp: tuple[torch.nn.Module, pipeline.ConvertedModule],
) -> None:
    model, module = mlp
    with pytest.raises(pipeline.InputError, match=r"takes no conversion option \['precision'\]"):
        pipeline.compare(model, torch.randn(2, 8), module=module, precision="fp16")
    with pytest.raises(pipeline.InputError, match="takes a converted module, got Sequential"):
        pipeline.compare(model, torch.randn(2, 8), module=model)  # type: ignore[arg-type]


def test_compare_with_a_module_judges_it_with_tolerances_given(
    mlp: tuple[torch.nn.Module, pipeline.ConvertedModule],
) -> None:
    model, module = mlp
    report = pipeline.compare(model, torch.randn(2, 8), module=module, random_inputs=0, backends=["onnxruntime"])
    assert report.passed
    off = torch.nn.Sequential(*model).eval()
    off[2] = torch.nn.Linear(16, 4)  # other weights: the module no longer matches this model
    assert not pipeline.compare(off, torch.randn(2, 8), module=module, random_inputs=0, backends=["onnxruntime"]).passed
    wide = pipeline.compare(
        off,
        torch.randn(2, 8),
        module=module,
        random_inputs=0,
        backends=["onnxruntime"],
        tolerances={module.io.outputs[0].name: (1e3, 1e3)},
    )
    assert wide.passed  # the tolerances given were used


def test_refit_takes_a_module_first(mlp: tuple[torch.nn.Module, pipeline.ConvertedModule]) -> None:
    model, _ = mlp
    with pytest.raises(pipeline.InputError, match="takes a converted module first, got Sequential"):
        pipeline.refit(model, model)  # type: ignore[arg-type]
