"""``pipeline convert --generation``, ``pipeline generate`` and ``pipeline bench --generate``, through the real CLI.

One tiny Llama (the factory file below, random weights) is converted once for the module by ``pipeline convert``
in a subprocess; the tokens the CLI prints are judged against transformers' own ``generate`` on the same weights.
The text path uses a word-level tokenizer built and saved inside the test (nothing downloaded). Subprocesses
cover what a shell user sees (exit code, output, streaming, no traceback); the conversion and the error cases call
the same entry point, ``pipeline.cli.main``, in this process (its exit code and stderr are what the shell gets).
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import pipeline
from pipeline.cli import main
from pipeline.cli.common import call_factory

ROOT = Path(__file__).resolve().parents[3]

FACTORY = """
    import sys

    sys.path.insert(0, TESTS_DIR)
    import tests_environment  # torchvision's operator schemas, before transformers imports torchvision

    import torch
    import transformers


    def build():
        config = transformers.LlamaConfig(
            vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, eos_token_id=95, pad_token_id=0,
        )
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
        return model, torch.randint(1, 90, (1, 6), generator=torch.Generator().manual_seed(1))
"""

PROMPTS = ([5, 6, 7, 8, 9], [40, 41, 42])
NEW = 8


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("factory") / "tiny_llama.py"
    path.write_text(textwrap.dedent(FACTORY).replace("TESTS_DIR", repr(str(ROOT / "tests"))))
    return f"{path}:build"


@pytest.fixture(scope="module")
def artifact(spec: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pipeline convert SPEC --generation ...`` (in this process: the export is the slow part, not the CLI)."""
    out = tmp_path_factory.mktemp("step")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["convert", spec, "--generation", "max_length=40,max_batch=3", "-o", str(out)]) == 0
    assert "accuracy  PASS" in printed.getvalue()
    assert "generate  max_length 40, max_batch 3, 2 cached layers, eos [95]: pipeline generate " in printed.getvalue()
    assert f"{out / 'model.ptrt'} --prompt-ids 1,2,3" in printed.getvalue()
    return out / "model.ptrt"


@pytest.fixture(scope="module")
def expected(spec: str) -> list[list[int]]:
    """transformers' greedy tokens for the left-padded batch of PROMPTS (eos off): the new ids of each row."""
    model, _ = call_factory(spec)
    longest = max(map(len, PROMPTS))
    ids = torch.zeros(len(PROMPTS), longest, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(PROMPTS):
        ids[row, longest - len(prompt) :] = torch.tensor(prompt)
        mask[row, longest - len(prompt) :] = 1
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return [row[longest:] for row in out.tolist()]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer over the tiny Llama's 96 ids ("w5" is id 5; "</s>" is the eos 95), saved locally."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, 95)}, "</s>": 95}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", eos_token="</s>"
    )
    directory = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(directory)
    return directory


def words(ids: list[int]) -> str:
    return " ".join(f"w{i}" for i in ids)


def test_generate_prints_the_new_ids_of_each_prompt_as_transformers(artifact: Path, expected: list[list[int]]) -> None:
    prompt_args = [arg for p in PROMPTS for arg in ("--prompt-ids", ",".join(map(str, p)))]
    done = run_cli("generate", str(artifact), *prompt_args, "--max-new-tokens", str(NEW), "--ignore-eos")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [" ".join(map(str, row)) for row in expected]


def test_text_prompt_streams_through_a_local_tokenizer(
    artifact: Path, expected: list[list[int]], tokenizer_dir: Path
) -> None:
    done = run_cli(
        "generate",
        str(artifact),
        "--tokenizer",
        str(tokenizer_dir),
        "--prompt",
        words(PROMPTS[0]),
        "--max-new-tokens",
        str(NEW),
        "--ignore-eos",
        "--stream",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == words(expected[0])


def test_stream_of_ids_and_text_output_in_process(
    artifact: Path, expected: list[list[int]], tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = ["--max-new-tokens", str(NEW), "--ignore-eos"]
    ids = ",".join(map(str, PROMPTS[0]))
    assert main(["generate", str(artifact), "--prompt-ids", ids, "--stream", "--echo", *options]) == 0
    assert capsys.readouterr().out == " ".join(map(str, [*PROMPTS[0], *expected[0]])) + "\n"
    text = ["--prompt", words(PROMPTS[0]), "--prompt", words(PROMPTS[1])]
    assert main(["generate", str(artifact), "--tokenizer", str(tokenizer_dir), *text, *options]) == 0
    assert capsys.readouterr().out.splitlines() == [words(row) for row in expected]


def test_sampling_options_reach_generate(artifact: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--do-sample with a seed: the tokens of module.generate with the same options, the same on every call."""
    options = {"do_sample": True, "seed": 3, "top_k": 20, "top_p": 0.9, "temperature": 0.8, "repetition_penalty": 1.3}
    flags = [
        "--do-sample",
        "--seed",
        "3",
        "--top-k",
        "20",
        "--top-p",
        "0.9",
        "--temperature",
        "0.8",
        "--repetition-penalty",
        "1.3",
        "--ignore-eos",
        "--max-new-tokens",
        str(NEW),
    ]
    assert main(["generate", str(artifact), "--prompt-ids", "5,6,7", *flags]) == 0
    first = capsys.readouterr().out
    module = pipeline.load(artifact)
    sampled = module.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=NEW, eos_token_id=[], **options)
    assert first == " ".join(map(str, sampled[0, 3:].tolist())) + "\n"
    greedy = module.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=NEW, eos_token_id=[])
    assert not torch.equal(sampled, greedy)  # the flags did reach the sampler


def test_eos_stops_a_prompt_and_the_rest_is_not_printed(
    artifact: Path, expected: list[list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    stop = expected[0][2]  # the prompt's third new token ends it
    ids = ",".join(map(str, PROMPTS[0]))
    assert main(["generate", str(artifact), "--prompt-ids", ids, "--eos-token-id", str(stop)]) == 0
    assert capsys.readouterr().out == " ".join(map(str, expected[0][:3])) + "\n"


def test_bench_generate_reports_prefill_and_decode_tokens_per_second(artifact: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_cli("bench", str(artifact), "--generate", "--batch", "2", "--iterations", "2", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "prefill" in done.stdout and "decode" in done.stdout and "tokens/s" in done.stdout
    figures = json.loads(out.read_text())
    assert figures["batch"] == 2 and figures["prompt_tokens"] == 20 and figures["new_tokens"] == 20
    assert figures["prefill_tokens_per_s"] > 0 and figures["decode_tokens_per_s"] > 0 and figures["runs"] == 2


def test_a_plain_artifact_is_refused_with_the_fix_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "plain.ptrt"
    pipeline.convert(torch.nn.Identity(), torch.ones(2, 3), validate=False).save(plain)
    for command in (["generate", str(plain), "--prompt-ids", "1,2"], ["bench", str(plain), "--generate"]):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert "is not a generation artifact" in err
        assert "fix: convert it with `pipeline convert SPEC --generation" in err


BAD_INPUTS = {
    "empty prompt": (["--prompt-ids", " "], "prompt 1 is empty"),
    "id outside the vocabulary": (["--prompt-ids", "5,96"], "outside the model's vocabulary [0, 96)"),
    "prompt longer than max_length": (["--prompt-ids", ",".join(["5"] * 41)], "more than the cache holds"),
    "prompt + new tokens over max_length": (["--prompt-ids", "5,6", "--max-new-tokens", "39"], "max_length=41"),
    "text without a tokenizer": (["--prompt", "w5"], "--prompt TEXT needs a tokenizer"),
    "ids that are not numbers": (["--prompt-ids", "5,x"], "token ids are whole numbers"),
    "more prompts than max_batch": (["--prompt-ids", "5"] * 4, "max_batch=3"),
    "stream of two prompts": (["--prompt-ids", "5", "--prompt-ids", "6", "--stream"], "give one prompt with --stream"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_a_clear_error(artifact: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    arguments, message = BAD_INPUTS[case]
    assert main(["generate", str(artifact), *arguments]) == 1
    err = capsys.readouterr().err
    assert message in err and "fix:" in err


def test_bad_generation_setting_fails_before_the_model_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for setting, message in (
        ("max_length=x", "cannot read --generation 'max_length=x'"),
        ("max_lenght=64", "unknown generation setting(s) max_lenght"),
    ):
        assert main(["convert", "no/such/file.py:build", "--generation", setting, "-o", str(tmp_path)]) == 1
        assert message in capsys.readouterr().err
