"""``pipeline generate DIR --processor P --image a.png --prompt TEXT`` for a model whose text cross-attends to its
images (Llama 3.2 Vision: ``MllamaForConditionalGeneration``), through the real CLI in a subprocess: its processor
(saved locally, loaded offline) makes each prompt's ``cross_attention_mask``, ``pixel_values``, ``aspect_ratio_ids``
and ``aspect_ratio_mask`` (each prompt's images a list of its own), and each line printed is a prompt's new tokens as
the module's own ``generate`` gives them on the same inputs. A tiny model with random weights, converted once
(:mod:`image_prompts_support`); the errors a user meets, and Kosmos-2's processor (no image placeholder: the image
first, its tokens marked), in this process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from image_prompts_support import ImageModel, image_model, kosmos2_processor

import pipeline
from converters.errors import InputError
from pipeline.cli import main
from pipeline.cli.images import image_prompts, load_processor
from pipeline.runtime.generation.cross_images import CrossImagesModule

ROOT = Path(__file__).resolve().parents[3]
NEW = 6
#: the CLI as a user runs it, with the schemas torchvision needs here first (``tests_environment``)
CLI = (
    "import sys; sys.path.append(sys.argv.pop(1)); import tests_environment; from pipeline.cli import main; "
    "sys.exit(main())"
)


@pytest.fixture(scope="module")
def mllama(tmp_path_factory: pytest.TempPathFactory) -> ImageModel:
    return image_model("mllama", tmp_path_factory.getbasetemp())


def command(made: ImageModel, *extra: str, rows: int = 2) -> list[str]:
    pairs = [
        item
        for text, image in zip(
            ["<|image|> w5 w9 w12", "<|image|> w40 w41 w42 w43 w44"][:rows], made.images[:rows], strict=True
        )
        for item in ("--prompt", text, "--image", str(image))
    ]
    return ["generate", str(made.converted), "--processor", str(made.processor), *pairs, *extra]


def test_the_cli_prints_each_prompts_new_tokens_as_generate_gives_them(mllama: ImageModel) -> None:
    run = subprocess.run(
        [sys.executable, "-c", CLI, str(ROOT / "tests"), *command(mllama, "--max-new-tokens", str(NEW))],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    module = pipeline.load(mllama.converted)
    assert isinstance(module, CrossImagesModule)
    inputs = mllama.inputs()
    assert inputs["attention_mask"][0, 0] == 0  # the shorter prompt is left-padded
    new = module.generate(**inputs, max_new_tokens=NEW)[:, inputs["input_ids"].shape[1] :].tolist()
    assert len({token for row in new for token in row}) >= 4  # the decoding is worth comparing
    assert run.stdout.splitlines() == [mllama.decode(row) for row in new]


def test_stream_and_beams_in_process(mllama: ImageModel, capsys: pytest.CaptureFixture[str]) -> None:
    module = pipeline.load(mllama.converted)
    inputs = mllama.inputs(rows=1)
    assert main(command(mllama, "--max-new-tokens", "4", "--stream", rows=1)) == 0
    greedy = module.generate(**inputs, max_new_tokens=4)[0, inputs["input_ids"].shape[1] :].tolist()
    assert capsys.readouterr().out.strip() == mllama.decode(greedy)
    assert main(command(mllama, "--max-new-tokens", "4", "--num-beams", "2", rows=1)) == 0
    beams = module.generate(**inputs, max_new_tokens=4, num_beams=2)[0, inputs["input_ids"].shape[1] :].tolist()
    assert capsys.readouterr().out.strip() == mllama.decode(beams)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--prompt", "w5 w9", "--image", "{image}"), "a prompt lacks the image placeholder '<|image|>'"),
        (("--prompt", "<|image|> w5 <|image|>", "--image", "{image}"), "MllamaProcessor refuses the prompts"),
        (("--max-new-tokens", "60"), "exceeds the cache capacity max_length=48"),
        (("--num-beams", "3"), "max_batch=2"),
    ],
)
def test_bad_input_is_an_input_error_with_its_fix(
    mllama: ImageModel, extra: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    given = [item.format(image=mllama.images[0]) for item in extra]
    prompts = 0 if given[0] == "--prompt" else 1
    assert main([*command(mllama, rows=prompts), *given]) == 1
    err = capsys.readouterr().err
    assert "error: [input] " in err and message in err and "fix:" in err


def test_a_processor_without_a_placeholder_puts_the_image_first_and_refuses_one(tmp_path: Path) -> None:
    """Kosmos-2's processor (no ``image_token``) puts each image before its prompt's text and marks its tokens with
    ``image_embeds_position_mask``, left-padded with the prompts; a prompt holding ``<image>`` is refused by name."""
    from PIL import Image

    kosmos2_processor(tmp_path / "kosmos-2")
    processor = load_processor(tmp_path / "kosmos-2")
    images = [tmp_path / "0.png", tmp_path / "1.png"]
    for index, path in enumerate(images):
        Image.new("RGB", (20 + index, 24), color=(10 * index, 80, 160)).save(path)
    inputs = image_prompts(processor, ["w5 w9", "w40 w41 w42 w43"], images)
    marks = inputs["image_embeds_position_mask"]
    assert marks.shape == inputs["input_ids"].shape and marks.sum(-1).tolist() == [64, 64]
    assert inputs["attention_mask"][0, :2].tolist() == [0, 0] and marks[0, :4].tolist() == [0, 0, 0, 0]
    with pytest.raises(InputError, match="Kosmos2Processor has no image placeholder") as caught:
        image_prompts(processor, ["<image> w5"], images[:1])
    assert "without '<image>'" in str(caught.value)
