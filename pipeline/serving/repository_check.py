"""What can be checked of a Triton model repository on this machine: the real ``tritonserver`` loads it.

The server here is ``nvidia-pytriton``'s (:mod:`pipeline.serving.server`): it has the Python backend only. Loading a
repository, it first parses every ``config.pbtxt`` against Triton's ``ModelConfig`` schema (an unknown field, a
wrong enum, a model name other than its directory's, no version directory: the model never gets a state), then
hands each parsed model to its backend. So each model gets one verdict:

- ``loaded``: its backend is here and it loaded (a Python-backend model: ``initialize`` ran);
- ``backend-missing``: the configuration parsed and the server asked for the named backend (``onnxruntime``,
  ``tensorrt``), which this server lacks; what that backend would check (the model file, the dims against it, the
  profiles) is not checked here;
- ``config-error``: the server refused the configuration itself (the reason is the server's);
- ``load-error``: the backend is here and failed to load the model (the reason is the backend's).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converters.errors import InputError
from pipeline.serving.server import TritonServer

LOADED = "loaded"
BACKEND_MISSING = "backend-missing"
CONFIG_ERROR = "config-error"
LOAD_ERROR = "load-error"

_MISSING_BACKEND = re.compile(r"unable to find backend library for backend '([^']+)'")
# the server's log lines for a model directory it could not read (no index state follows)
_REFUSED = (
    re.compile(r"Poll failed for model directory '([^']+)': (.*?)\"?$"),
    re.compile(r"failed to load model '([^']+)': (.*?)\"?$"),
)


@dataclass(frozen=True)
class ModelVerdict:
    """One model of the repository as the server saw it."""

    name: str
    verdict: str
    reason: str = ""
    backend: str = ""  # the backend it asked for, when that is the reason it did not load

    def line(self) -> str:
        """The verdict as one line of text."""
        if self.verdict == LOADED:
            return f"{self.name}: loaded"
        if self.verdict == BACKEND_MISSING:
            return f"{self.name}: config parsed; backend '{self.backend}' is not in this server (not loaded here)"
        return f"{self.name}: {self.verdict}: {self.reason}"


@dataclass(frozen=True)
class RepositoryCheck:
    """The verdict of every model directory of a repository, from the real ``tritonserver``."""

    repository: Path
    models: tuple[ModelVerdict, ...]

    @property
    def ok(self) -> bool:
        """Every configuration parsed and no backend that is here failed."""
        return all(m.verdict in (LOADED, BACKEND_MISSING) for m in self.models)

    def verdict(self, name: str) -> ModelVerdict:
        """The verdict of model ``name`` (KeyError when the repository has no such model)."""
        for model in self.models:
            if model.name == name:
                return model
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """The verdicts as JSON-ready data."""
        return {
            "repository": str(self.repository),
            "ok": self.ok,
            "models": [dataclasses.asdict(model) for model in self.models],
        }

    def summary(self) -> str:
        """The verdicts as text (what ``pipeline export-triton --check`` prints)."""
        lines = [f"tritonserver over {self.repository} (this machine: Python backend only, no GPU):"]
        lines += [f"  {model.line()}" for model in self.models]
        return "\n".join(lines)


def check_repository(repository: str | Path, *, startup_timeout: float = 120.0) -> RepositoryCheck:
    """Start the real ``tritonserver`` over ``repository`` (free ports, staying up whatever fails to load), read
    every model's state and reason, stop it; each model's verdict.

    A Python-backend model needs the package on the server's Python: here the server's Python is this interpreter's
    environment (nothing of it is written into the repository); a GPU image installs the package. The byte code the
    Python backend compiles while loading (``__pycache__``) is removed afterwards.
    """
    repository = Path(repository)
    if not repository.is_dir():
        raise InputError(f"check: no model repository at {repository}", fix="pass the directory export-triton wrote")
    caches_before = set(repository.glob("*/*/__pycache__"))
    server = TritonServer(
        repository,
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        exit_on_error=False,
        startup_timeout=startup_timeout,
        environment=_server_environment(),
    )
    with server:
        index = server.models()
        log = server.log_path.read_text(errors="replace")
    for cache in set(repository.glob("*/*/__pycache__")) - caches_before:
        shutil.rmtree(cache, ignore_errors=True)
    directories = sorted(p.name for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))
    return RepositoryCheck(repository, tuple(_verdict(name, index, log, repository) for name in directories))


def _verdict(name: str, index: list[dict[str, str]], log: str, repository: Path) -> ModelVerdict:
    entry = next((e for e in index if e.get("name") == name), {})
    state, reason = entry.get("state", ""), entry.get("reason", "")
    if state == "READY":
        return ModelVerdict(name, LOADED)
    missing = _MISSING_BACKEND.search(reason)
    if missing:
        return ModelVerdict(name, BACKEND_MISSING, reason, missing.group(1))
    if state:
        return ModelVerdict(name, LOAD_ERROR, reason or state)
    return ModelVerdict(name, CONFIG_ERROR, _refusal(name, log, repository))


def _refusal(name: str, log: str, repository: Path) -> str:
    """Why the server refused model directory ``name``: its log line, with the parse error of Triton's schema (the
    server's log does not say which model a parse error was of) when the text did not parse."""
    reasons = [
        found.group(2)
        for line in log.splitlines()
        for pattern in _REFUSED
        if (found := pattern.search(line)) and found.group(1) == name
    ]
    reason = reasons[0] if reasons else "the server did not list it (a directory without a config.pbtxt it reads?)"
    if "text proto" in reason:
        reason += f" ({_parse_error(repository / name / 'config.pbtxt')})"
    return reason


def _parse_error(path: Path) -> str:
    from google.protobuf import text_format

    from pipeline.serving.model_config import config_pb2

    try:
        text_format.Parse(path.read_text(errors="replace"), config_pb2().ModelConfig())
    except (text_format.ParseError, OSError) as err:
        return str(err)
    return "it parses against tritonclient's schema, which may be newer than the server's"


def _server_environment() -> dict[str, str]:
    """This interpreter's ``bin/`` first on ``PATH``: the Python backend's stub embeds an interpreter that ignores
    ``PYTHONPATH`` and finds its prefix through the ``python3`` on ``PATH`` (measured), so that it is this
    environment (a virtual environment's site-packages and editable installs included), as the GPU image's Python
    is the one the package was installed into."""
    return {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
