"""The conversion layer's functions that took over the module's methods (``pipeline.refit``, ``pipeline.compare``
with ``module=``): what a user of the old methods meets, and what the functions refuse."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import pipeline

ROOT = Path(__file__).resolve().parents[2]


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


def test_threads_and_spinning_are_chosen_when_loading(
    mlp: tuple[torch.nn.Module, pipeline.ConvertedModule], tmp_path: Path
) -> None:
    model, _ = mlp
    saved = pipeline.convert(model, torch.randn(2, 8), validate=False, threads=2, spinning=True).save(
        tmp_path / "m.ptrt"
    )
    as_saved = pipeline.load(saved)
    assert (as_saved.settings.ort_intra_op_threads, as_saved.settings.ort_allow_spinning) == (2, True)
    options = as_saved.executor.session.get_session_options()  # type: ignore[attr-defined]
    assert options.intra_op_num_threads == 2
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"

    here = pipeline.load(saved, threads=1, spinning=False)
    options = here.executor.session.get_session_options()  # type: ignore[attr-defined]
    assert options.intra_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    x = torch.randn(2, 8)
    torch.testing.assert_close(here(x), as_saved(x))
    with pytest.raises(pipeline.InputError, match="threads .* must be >= 0"):
        pipeline.load(saved, threads=-1)
    with pytest.raises(pipeline.InputError, match="both threads= and ort_intra_op_threads="):
        pipeline.convert(model, torch.randn(2, 8), threads=1, ort_intra_op_threads=2)


def test_a_generation_module_does_not_spin_unless_asked(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("tiny_llama", ROOT / "examples" / "tiny_llama.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    llama, ids = example.build()
    module = pipeline.convert(llama, ids, generation={"max_length": 16, "max_batch": 1}, validate=False)
    options = module.executor.session.get_session_options()  # type: ignore[attr-defined]
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    spinning = pipeline.load(module.save(tmp_path / "llama.ptrt"), spinning=True)
    options = spinning.executor.session.get_session_options()  # type: ignore[attr-defined]
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
