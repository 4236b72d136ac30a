"""A Triton model repository in which every artifact is a Python-backend model around :func:`pipeline.load`.

``pipeline serve`` writes one into a private directory and starts the server over it. Each model is
``NAME/config.pbtxt`` (the graph's inputs and outputs, batching, instances) and ``NAME/1/model.py``: a few lines
that put this environment's packages on the backend stub's path and hand over to
:mod:`pipeline.serving.backend_model`. The artifact is read where it is (its absolute path is a parameter). The
portable variant (``pipeline export-triton``) copies the artifact beside ``model.py`` and writes no path of this
machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
from dataclasses import dataclass
from pathlib import Path

from converters.errors import InputError
from converters.files import write_file_atomically
from pipeline.runtime.artifact import settings_from_json
from pipeline.runtime.artifact_reading import read_metadata
from pipeline.runtime.io_spec import IOSpec, TensorSpec
from pipeline.serving.backend_model import TOKENS_OUTPUT
from pipeline.serving.model_config import batch_axis, check_max_batch, model_config, write_config
from pipeline.settings import DynamicDim

NAME = re.compile(r"^[A-Za-z0-9_.-]+$")

MODEL_PY = '''"""Triton Python-backend model written by `pipeline serve`: serves {artifact}."""
import json
import site
import sys


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        for entry in json.loads(parameters["site_dirs"]["string_value"]):
            site.addsitedir(entry)
        for entry in json.loads(parameters["python_path"]["string_value"]):
            if entry not in sys.path:
                sys.path.append(entry)
        import triton_python_backend_utils as pb_utils
        from pipeline.serving.backend_model import triton_model

        self.model = triton_model(args, pb_utils)

    def execute(self, requests):
        return self.model.execute(requests)

    def finalize(self):
        self.model.finalize()
'''


PORTABLE_MODEL_PY = '''"""Triton Python-backend model written by `pipeline export-triton`: serves {artifact},
the artifact beside this file. The server's Python needs the package: pip install torch-trt-pipeline."""
import json
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        artifact = config["parameters"]["artifact"]
        artifact["string_value"] = str(Path(__file__).resolve().parent / artifact["string_value"])
        import triton_python_backend_utils as pb_utils
        from pipeline.serving.backend_model import triton_model

        self.model = triton_model({{**args, "model_config": json.dumps(config)}}, pb_utils)

    def execute(self, requests):
        return self.model.execute(requests)

    def finalize(self):
        self.model.finalize()
'''


@dataclass(frozen=True)
class ServedArtifact:
    """One artifact to serve: its model name and file, and what its metadata says it is."""

    name: str
    path: Path
    io: IOSpec
    generative: bool
    dynamic: tuple[DynamicDim, ...] = ()


def default_name(path: Path) -> str:
    """An artifact's model name: its file's stem, or for ``model.ptrt`` (what ``pipeline convert -o DIR`` writes)
    its directory's name, so that ``out/cnn/model.ptrt`` is ``cnn``."""
    if path.stem == "model" and NAME.match(path.parent.name):
        return path.parent.name
    return path.stem


def served_artifact(path: str | Path, name: str | None = None) -> ServedArtifact:
    """Read what an artifact is from its metadata (the weights are not read), under ``name`` (default:
    :func:`default_name`)."""
    path = Path(path).resolve()
    if not path.is_file():
        raise InputError(f"serving: no artifact at {path}", fix="pass the path of a file written by module.save()")
    metadata = read_metadata(path)
    name = name or default_name(path)
    if not NAME.match(name):
        raise InputError(
            f"serving: {name!r} is not a Triton model name (letters, digits, '_', '.', '-')",
            fix="pass name= / --name with such a name",
        )
    settings = settings_from_json(metadata["settings"])
    io = IOSpec.from_json(metadata["io"])
    return ServedArtifact(name, path, io, settings.generation is not None, tuple(settings.dynamic))


def environment_paths() -> tuple[list[str], list[str]]:
    """This interpreter's site directories (their ``.pth`` files hold editable installs) and its ``PYTHONPATH``."""
    sites = [p for p in (*site.getsitepackages(), site.getusersitepackages()) if Path(p).is_dir()]
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).is_dir()]
    return sites, [str(Path(p).resolve()) for p in extra]


def write_serving_model(
    repository: Path,
    served: ServedArtifact,
    *,
    max_batch: int,
    queue_delay_us: int | None,
    instances: int,
    threads: int | None,
    spinning: bool | None = None,
    portable: bool = False,
) -> Path:
    """``repository/NAME``: the model's config and ``model.py``; its directory.

    ``portable`` (``pipeline export-triton``): for a Triton on another machine, whose Python has the package
    installed: the artifact is copied to ``NAME/1/`` and ``model.py`` finds it beside itself; no path of this machine
    is written.
    """
    if instances < 1:
        raise InputError(f"serving {served.name!r}: instances must be >= 1, not {instances}")
    runtime = {"threads": "" if threads is None else str(threads)}
    runtime["spinning"] = "" if spinning is None else str(spinning)
    if portable:
        parameters = {"artifact": served.path.name, **runtime}
    else:
        sites, rest = environment_paths()
        parameters = {
            "artifact": str(served.path),
            "site_dirs": json.dumps(sites),
            "python_path": json.dumps(rest),
            **runtime,
        }
    if served.generative:
        config = model_config(
            served.name,
            served.io,
            backend="python",
            instances=instances,
            decoupled=True,
            inputs=(
                TensorSpec("input_ids", "int64", ("batch", "length")),
                TensorSpec("attention_mask", "int64", ("batch", "length")),
            ),
            outputs=(TensorSpec(TOKENS_OUTPUT, "int64", ("batch", 1)),),
            parameters=parameters,
        )
        config.input[1].optional = True
    else:
        check_max_batch(served.name, batch_axis(served.io, served.dynamic), max_batch)
        config = model_config(
            served.name,
            served.io,
            backend="python",
            max_batch=max_batch,
            queue_delay_us=queue_delay_us,
            instances=instances,
            parameters=parameters,
        )
    directory = repository / served.name
    (directory / "1").mkdir(parents=True, exist_ok=True)
    if portable:
        with open(served.path, "rb") as source:
            write_file_atomically(directory / "1" / served.path.name, lambda out: shutil.copyfileobj(source, out))
        model_py = PORTABLE_MODEL_PY.format(artifact=served.path.name)
    else:
        model_py = MODEL_PY.format(artifact=served.path)
    write_file_atomically(directory / "1" / "model.py", model_py.encode())
    write_config(config, directory)
    return directory
