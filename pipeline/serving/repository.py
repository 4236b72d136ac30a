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
from typing import Any

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


#: what a decoder-only generation request holds: the prompt and its padding (optional)
PROMPT_INPUTS = (
    TensorSpec("input_ids", "int64", ("batch", "length")),
    TensorSpec("attention_mask", "int64", ("batch", "length")),
)


@dataclass(frozen=True)
class ServedArtifact:
    """One artifact to serve: its model name and file (or directory: an encoder-decoder's, a vision-language
    model's, a cross-attended image model's), and what its metadata says it is. ``request`` is a generation request's
    inputs (the first required, the others optional); ``metadata_path`` the artifact whose metadata and settings speak
    for it (the step's)."""

    name: str
    path: Path
    io: IOSpec
    generative: bool
    dynamic: tuple[DynamicDim, ...] = ()
    request: tuple[TensorSpec, ...] = ()
    metadata_path: Path | None = None

    @property
    def metadata_file(self) -> Path:
        """The artifact file whose metadata describes what is served."""
        return self.metadata_path or self.path


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
    parts = _two_graphs(path) if path.is_dir() else None
    if parts is None and not path.is_file():
        raise InputError(
            f"serving: no artifact at {path}",
            fix="pass the path of a file written by module.save(), or the directory an encoder-decoder's or a "
            "vision-language model's save() wrote",
        )
    step, request = parts if parts is not None else (path, None)
    metadata = read_metadata(step)
    name = name or default_name(path)
    if not NAME.match(name):
        raise InputError(
            f"serving: {name!r} is not a Triton model name (letters, digits, '_', '.', '-')",
            fix="pass name= / --name with such a name",
        )
    settings = settings_from_json(metadata["settings"])
    io = IOSpec.from_json(metadata["io"])
    generative = settings.generation is not None
    if request is None:
        request = PROMPT_INPUTS if generative else ()
    return ServedArtifact(name, path, io, generative, tuple(settings.dynamic), request, step)


def _two_graphs(directory: Path) -> tuple[Path, tuple[TensorSpec, ...]] | None:
    """For a directory an encoder-decoder, a vision-language model, a cross-attended image model (Mllama, IDEFICS) or a
    recurrent model's step with its prompt graph saved: its step's artifact and what a request holds (the first input
    required); None for any other directory."""
    from pipeline.runtime.generation.encoder_decoder import DECODER_FILE, ENCODER_FILE
    from pipeline.runtime.generation.layout import STEP_INPUTS
    from pipeline.runtime.generation.vision_feed import DEEPSTACK, IMAGE_FEATURES, TOKEN_TYPES
    from pipeline.runtime.generation.vision_language import META_FILE, STEP_FILE, VISION_FILE

    if (directory / DECODER_FILE).is_file() and (directory / ENCODER_FILE).is_file():
        encoder = IOSpec.from_json(read_metadata(directory / ENCODER_FILE)["io"])
        decoder = read_metadata(directory / DECODER_FILE)
        cross = _cross_images_request(encoder, decoder)
        if cross is not None:
            return directory / DECODER_FILE, cross
        decoder_ids = TensorSpec("decoder_input_ids", "int64", ("batch", "decoder_length"))
        return directory / DECODER_FILE, (*(_any_size(spec) for spec in encoder.inputs), decoder_ids)
    if (directory / META_FILE).is_file() and (directory / VISION_FILE).is_file() and (directory / STEP_FILE).exists():
        vision = IOSpec.from_json(read_metadata(directory / VISION_FILE)["io"])
        # a text step with a prompt graph is a directory of its own (GenerativeModule.save)
        step_file = directory / STEP_FILE if (directory / STEP_FILE).is_file() else directory / STEP_FILE / STEP_FILE
        step_metadata = read_metadata(step_file)
        step = IOSpec.from_json(step_metadata["io"])
        typed = (
            [TensorSpec(TOKEN_TYPES, "int64", ("batch", "length"))]
            if any(spec.name == TOKEN_TYPES for spec in step.inputs)
            else []
        )
        # the model's own per-token input placing the images (Kosmos-2's image_embeds_position_mask), as the module
        # finds it: the step's one input that is neither the decoder-only step's, the features, the types nor cache
        known = {*STEP_INPUTS, IMAGE_FEATURES, TOKEN_TYPES, *_cache_inputs(step_metadata)}
        known |= {spec.name for spec in step.inputs if spec.name.startswith(f"{DEEPSTACK}.")}  # the vision graph's
        typed += [
            TensorSpec(spec.name, "int64", ("batch", "length")) for spec in step.inputs if spec.name not in known
        ][:1]
        # inputs the vision graph holds fixed (LLaVA-NeXT's image_sizes, Qwen2-VL's image_grid_thw): the module
        # checks them and cuts the images by them, so a request holds them too
        fixed = json.loads((directory / META_FILE).read_text()).get("fixed_inputs", {})
        held = [
            TensorSpec(name, dtype, tuple(f"{name}_{axis}" for axis in range(_depth(value))))
            for name, (dtype, value) in fixed.items()
        ]
        images = (*(_any_size(spec) for spec in vision.inputs), *held)
        return step_file, (*PROMPT_INPUTS, *images, *typed)
    from pipeline.runtime.generation.module import PROMPT_FILE

    if (directory / PROMPT_FILE).is_file() and (directory / STEP_FILE).is_file():  # a step and its prompt graph
        return directory / STEP_FILE, PROMPT_INPUTS
    return None


def _cache_inputs(step: dict[str, Any]) -> set[str]:
    """The cache inputs of a generation step, from its metadata."""
    from pipeline.runtime.generation.layout import INDEXER, past_name

    generation = settings_from_json(step["settings"]).generation
    layers = generation.layers if generation is not None else 0
    return {past_name(layer, kind) for layer in range(layers) for kind in ("key", "value", INDEXER)}


def _cross_images_request(encoder: IOSpec, decoder: dict[str, Any]) -> tuple[TensorSpec, ...] | None:
    """What a request to a model whose text cross-attends to its images holds (its step prefills a prompt: it takes
    the decoder-only step's inputs): the prompt, the image graph's inputs and the per-token image masks (the step's
    other inputs); None for an encoder-decoder's step."""
    from pipeline.runtime.generation.layout import STEP_INPUTS

    step = IOSpec.from_json(decoder["io"])
    names = {spec.name for spec in step.inputs}
    if not set(STEP_INPUTS) <= names:
        return None
    given = {*STEP_INPUTS, *_cache_inputs(decoder), *(spec.name for spec in encoder.outputs)}
    masks = [_any_size(spec) for spec in step.inputs if spec.name not in given]
    return (*PROMPT_INPUTS, *(_any_size(spec) for spec in encoder.inputs), *masks)


def _depth(value: object) -> int:
    """The number of dimensions of a nested list (a tensor's ``tolist()``)."""
    depth = 0
    while isinstance(value, list):
        depth, value = depth + 1, value[0] if value else None
    return depth


def _any_size(spec: TensorSpec) -> TensorSpec:
    """``spec`` with every dimension free: a request holds any number of rows (or images) of any size the module
    takes; the module checks them."""
    return TensorSpec(spec.name, spec.dtype, tuple(f"{spec.name}_{axis}" for axis in range(len(spec.shape))))


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
            inputs=served.request,
            outputs=(TensorSpec(TOKENS_OUTPUT, "int64", ("batch", 1)),),
            parameters=parameters,
        )
        for optional in config.input[1:]:
            optional.optional = True
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
    if portable and served.path.is_dir():  # inside the export's staging directory: renamed into place whole
        shutil.copytree(served.path, directory / "1" / served.path.name, dirs_exist_ok=True)
        model_py = PORTABLE_MODEL_PY.format(artifact=served.path.name)
    elif portable:
        with open(served.path, "rb") as source:
            write_file_atomically(directory / "1" / served.path.name, lambda out: shutil.copyfileobj(source, out))
        model_py = PORTABLE_MODEL_PY.format(artifact=served.path.name)
    else:
        model_py = MODEL_PY.format(artifact=served.path)
    write_file_atomically(directory / "1" / "model.py", model_py.encode())
    write_config(config, directory)
    return directory
