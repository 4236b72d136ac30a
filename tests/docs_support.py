"""The harness that runs the documentation's examples as a user runs them (tests/test_readme.py, tests/test_docs.py).

A page is a Markdown file. Its fenced code blocks are read in order:

- ```` ```python ````: run, in order, in one namespace, in a fresh interpreter whose working directory is a temporary
  directory holding the repository's ``examples/`` (as a user's checkout does);
- ```` ```bash ````: every line is a command (``\\`` continues a line, ``#`` starts a comment), run with ``bash -c``
  in the same directory after the page's Python blocks, with the environment's ``bin/`` first on ``PATH`` (so
  ``pipeline`` and ``python`` are the installed ones);
- ```` ```console ````: the lines starting with ``$`` are commands, as above; the others are their output;
- ```` ```text ````: what a program prints (a report, a table, a tree), not code: never run.

A block that must not run (it needs a GPU, installs packages, takes hours) is marked by the HTML comment
``<!-- skip: the reason -->`` on the line before it; the reason is required. Before a snippet include
(``--8<-- "path"``) the same comment skips every block of the included file. Any other language is an error, so no
block escapes the tests unnoticed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_LANGUAGES = ("python", "bash", "console")
LANGUAGES = (*RUN_LANGUAGES, "text")
SKIP = re.compile(r"^<!--\s*skip:(?P<reason>.*?)-->\s*$")
FENCE = re.compile(r"^```(?P<lang>[^\s`]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
INCLUDE = re.compile(r'^--8<--\s+"(?P<path>[^":]+)(?::[^"]*)?"\s*$', re.M)


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str
    line: int  # 1-based line of the opening fence
    language: str
    body: str
    skip: str | None  # the reason given in the skip comment; "" when the comment gives none; None: not skipped

    @property
    def label(self) -> str:
        return f"{self.page}:{self.line}"


def page_path(page: str) -> Path:
    return ROOT / page


def blocks(page: str, text: str | None = None) -> list[Block]:
    """The fenced blocks of ``page`` (a path relative to the repository), with included files' blocks in place."""
    text = page_path(page).read_text() if text is None else text
    found: list[tuple[int, Block]] = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        skip = _skip_before(text, match.start())
        found.append((match.start(), Block(page, line, match["lang"], match["body"], skip)))
    for match in INCLUDE.finditer(text):
        reason = _skip_before(text, match.start())
        included = match["path"]
        for block in blocks(included):
            found.append((match.start(), Block(included, block.line, block.language, block.body, reason)))
    return [block for _, block in sorted(found, key=lambda item: item[0])]


def _skip_before(text: str, position: int) -> str | None:
    previous = text[:position].rstrip("\n").rsplit("\n", 1)[-1]
    match = SKIP.match(previous.strip())
    return match["reason"].strip() if match else None


def commands(block: Block) -> list[str]:
    """The command lines of a bash or console block, one string each."""
    lines = block.body.replace("\\\n", " ").splitlines()
    if block.language == "console":
        lines = [line[1:] for line in lines if line.startswith("$")]
    words = [shlex.split(line, comments=True) for line in lines]
    return [shlex.join(w) for w in words if w]


def python_source(page: str) -> str | None:
    """The page's Python blocks as one program run by :func:`run_page` (None: the page has none to run)."""
    runnable = [b for b in blocks(page) if b.language == "python" and b.skip is None]
    return json.dumps([(b.label, b.body) for b in runnable]) if runnable else None


#: Python examples run with log records named (the format is the only change to a user's run): "log NAME: message".
NAMED_LOGS = "import logging\nlogging.basicConfig(format='log %(name)s: %(message)s')\n"
#: Runs the blocks (JSON on stdin: [label, source] pairs, then the test's own check) in one namespace.
DRIVER = NAMED_LOGS + (
    "import json, sys\n"
    "blocks, check = json.load(sys.stdin)\n"
    "scope = {'__name__': '__main__'}\n"
    "for label, source in blocks:\n"
    "    exec(compile(source, label, 'exec'), scope)\n"
    "exec(compile(check, 'the test check', 'exec'), scope)\n"
)


@dataclass(frozen=True)
class Run:
    """What running one program of a page gave."""

    what: str
    returncode: int
    stderr: str


def run_page(page: str, workdir: Path, check: str = "", timeout: float = 900) -> list[Run]:
    """Run the page's Python blocks (then ``check``, code in their namespace) in one fresh interpreter, then each
    command of its bash and console blocks, in ``workdir``; skipped blocks are not run."""
    env = user_env(workdir)
    runs = []
    source = python_source(page)
    if source is not None:
        payload = json.dumps([json.loads(source), check])
        done = subprocess.run(
            [sys.executable, "-c", DRIVER],
            input=payload,
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        runs.append(Run(f"{page}: python blocks", done.returncode, done.stderr))
    for block in blocks(page):
        if block.language in ("bash", "console") and block.skip is None:
            for command in commands(block):
                done = subprocess.run(
                    ["bash", "-c", command], cwd=workdir, capture_output=True, text=True, timeout=timeout, env=env
                )
                runs.append(Run(f"{block.label}: {command}", done.returncode, done.stderr))
    return runs


def user_env(workdir: Path) -> dict[str, str]:
    """The user's environment, minus what would make the run unlike a user's (pytest's warning filters), with the
    environment's ``bin/`` first on ``PATH`` (an activated virtual environment). One addition, as in every test
    process: torchvision's wheel cannot load its C++ ops beside the CPU torch of our installs, so transformers' and
    diffusers' models do not import; ``tests_environment`` defines the two schemas first (a ``sitecustomize`` of
    ``workdir``'s ``.site``, made by :func:`make_workdir`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.pop("PYTHONWARNINGS", None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(workdir / ".site"), str(ROOT / "tests"), str(ROOT)])
    return env


def make_workdir(directory: Path) -> Path:
    """``directory`` holding the repository's examples/, as a user's checkout does (outputs land in its out/)."""
    shutil.copytree(ROOT / "examples", directory / "examples", dirs_exist_ok=True)
    (directory / ".site").mkdir(exist_ok=True)
    (directory / ".site" / "sitecustomize.py").write_text("import tests_environment  # noqa: F401\n")
    return directory


OURS = r"(pipeline|passes|converters)"


def third_party_lines(stderr: str, expected: tuple[str, ...] = ()) -> list[str]:
    """The lines of ``stderr`` a default run should not print: anything from a third party (another library's log
    record, a Python warning raised outside our packages, a raw print) and our own warnings that the example does not
    expect (``expected``: their first words). Always allowed: the CLI's stage lines (two spaces, then a message of
    our loggers: no other logger has that handler)."""
    own_log = re.compile(rf"^log {OURS}(\.\w+)*: (.*)")
    own_warning = re.compile(rf"/{OURS}/[\w/]+\.py:\d+: \w*Warning: (.*)")
    # our warning pointed at the example's own line (stacklevel): the block's label, "page.md:LINE", then its line
    example_warning = re.compile(r"^[\w./-]+\.md:\d+:\d+: (\w*Warning: .*)")
    lines = stderr.splitlines()
    foreign = []
    for index, line in enumerate(lines):
        previous = lines[index - 1] if index else ""
        message = next(
            (
                m.group(m.lastindex or 0)
                for m in (own_log.match(line), own_warning.search(line), example_warning.match(line))
                if m
            ),
            line[len("warning: ") :] if line.startswith("warning: ") else None,
        )
        if message is not None:  # ours, or a Python warning as the CLI prints it: say-so needed
            if not any(message.startswith(e) for e in expected):
                foreign.append(line)
        elif own_warning.search(previous) and line.startswith("  "):
            continue  # the source line Python prints under our warning
        elif not re.match(r"^  \S", line) or re.match(r"^  (TensorRT|Polygraphy|onnxscript|torch)\b", line):
            foreign.append(line)
    return foreign


def problems(page: str, text: str | None = None) -> list[str]:
    """What is wrong with the page's blocks as blocks: an unknown language, a skip without a reason, a command that
    is neither ``pipeline`` nor ``python`` left to run (installs and the like must be marked), a skip comment before
    nothing."""
    text = page_path(page).read_text() if text is None else text
    found = []
    for block in blocks(page, text):
        if block.language not in LANGUAGES and not (block.page != page and block.skip):  # an included file's own
            # blocks, skipped at the include with the reason, are not ours to label
            found.append(
                f"{block.label}: a ```{block.language or '(no language)'} block: say python, bash, console "
                "or text (output)"
            )
        if block.skip == "":
            found.append(f"{block.label}: a skip comment without a reason")
        if block.language in ("bash", "console") and block.skip is None:
            for command in commands(block):
                if shlex.split(command)[0] not in ("pipeline", "python"):
                    found.append(f"{block.label}: `{command}` is neither pipeline nor python: mark it skip, with why")
    for number, line in enumerate(text.splitlines(), 1):
        if SKIP.match(line.strip()):
            after = text.splitlines()[number : number + 1]
            if not after or not (after[0].startswith("```") or INCLUDE.match(after[0])):
                found.append(f"{page}:{number}: a skip comment not directly before a block or an include")
    return found
