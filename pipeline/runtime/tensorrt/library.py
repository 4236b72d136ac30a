"""Which TensorRT library a build uses: NVIDIA TensorRT (``tensorrt``) or TensorRT-RTX (``tensorrt_rtx``).

The two share the builder, parser and runtime API, so one build path (``pipeline.backends.tensorrt.build``) serves
both, given a :class:`TrtLibrary`. What differs is recorded here: the module name, where an engine can run, and
which compute capabilities TensorRT-RTX targets.

Polygraphy's TensorRT loaders bind one library per process: each of its ``polygraphy.backend.trt`` modules does
``trt = lazy_import_trt()`` at import, choosing ``tensorrt_rtx`` when ``polygraphy.config.USE_TENSORRT_RTX`` is set
(``POLYGRAPHY_USE_TENSORRT_RTX=1``) and ``tensorrt`` otherwise. :func:`bind_polygraphy` makes that choice on the first
build in a process (it sets the flag before those modules are imported); asking for the other library later in the
same process is a :class:`BuildError` that says so, never a build with the wrong library.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from types import ModuleType

from converters.errors import BuildError, InputError


@dataclass(frozen=True)
class TrtLibrary:
    """One TensorRT library: the backend name that selects it, its Python module, its title and pip package."""

    backend: str
    module_name: str
    title: str
    package: str

    @property
    def rtx(self) -> bool:
        """Is this TensorRT-RTX?"""
        return self.module_name == "tensorrt_rtx"

    def import_module(self) -> ModuleType:
        """The library's Python module; a BuildError naming the package to install when it does not import."""
        try:
            return importlib.import_module(self.module_name)
        except ImportError as exc:
            raise BuildError(
                f"{self.title} is needed here but `import {self.module_name}` fails: {exc}",
                fix=f"pip install '{self.package}' (or the project's extra: pip install "
                f"'torch-trt-pipeline[{self.backend}]')",
            ) from exc

    def importable(self) -> bool:
        """Whether the module imports (without raising)."""
        try:
            self.import_module()
        except BuildError:
            return False
        return True

    def version(self) -> str:
        """The installed version (the module must import)."""
        return str(getattr(self.import_module(), "__version__", "unknown"))


TENSORRT = TrtLibrary("tensorrt", "tensorrt", "TensorRT", "tensorrt")
TENSORRT_RTX = TrtLibrary("tensorrt-rtx", "tensorrt_rtx", "TensorRT-RTX", "tensorrt-rtx")
LIBRARIES: dict[str, TrtLibrary] = {lib.backend: lib for lib in (TENSORRT, TENSORRT_RTX)}

#: The compute capabilities TensorRT-RTX 1.x builds for by default, and those it can target at all ("7.5" only when
#: asked for). "12.0" stands for 12.0 and later in the default set (TensorRT-RTX's wording).
RTX_DEFAULT_TARGETS: tuple[str, ...] = ("8.0", "8.6", "8.9", "12.0")
RTX_TARGETS: dict[str, str] = {
    "7.5": "SM75",
    "8.0": "SM80",
    "8.6": "SM86",
    "8.9": "SM89",
    "12.0": "SM120",
    "12.1": "SM121",
}


def library_for(backend: str) -> TrtLibrary:
    """The library behind a TensorRT backend name ("tensorrt" or "tensorrt-rtx")."""
    if backend not in LIBRARIES:
        raise BuildError(f"{backend!r} is not a TensorRT backend", fix=f"use one of {', '.join(LIBRARIES)}")
    return LIBRARIES[backend]


def rtx_targets(requested: tuple[str, ...]) -> tuple[str, ...]:
    """The compute capabilities a TensorRT-RTX engine is built for (``trt_compute_capabilities``; () = default)."""
    unknown = [cc for cc in requested if cc not in RTX_TARGETS]
    if unknown:
        raise InputError(
            f"trt_compute_capabilities {unknown} are not targets TensorRT-RTX can build for",
            fix=f"use some of {', '.join(RTX_TARGETS)} (or () for TensorRT-RTX's default {RTX_DEFAULT_TARGETS})",
        )
    return tuple(dict.fromkeys(requested)) or RTX_DEFAULT_TARGETS


def describe_targets(requested: tuple[str, ...]) -> str:
    """``compute capabilities 8.0, 8.6, 8.9, 12.0+ (TensorRT-RTX's portable default)`` and the like."""
    if not requested:
        return "compute capabilities 8.0, 8.6, 8.9, 12.0 and later (TensorRT-RTX's portable default)"
    return "compute capabilit" + ("y " if len(requested) == 1 else "ies ") + ", ".join(rtx_targets(requested))


def rtx_runtime_problem(requested: tuple[str, ...]) -> str | None:
    """Why a TensorRT-RTX engine built for ``requested`` targets cannot run in this process; None when it can."""
    import torch  # here: the ONNX-level checks (`pipeline check`) import this module without running engines

    if not torch.cuda.is_available():
        return "no CUDA device (TensorRT-RTX runs engines on NVIDIA RTX/Ampere-or-later GPUs only)"
    major, minor = torch.cuda.get_device_capability()
    here = f"{major}.{minor}"
    name = torch.cuda.get_device_name()
    targets = rtx_targets(requested)
    if here in targets or (not requested and (major, minor) >= (12, 0)):  # the default covers 12.0 and later
        return None
    unsupported = here not in RTX_TARGETS and (major, minor) < (12, 0)
    return f"the GPU {name} has compute capability {here}; the engine targets {describe_targets(requested)}" + (
        f"; TensorRT-RTX does not run on compute capability {here} at all" if unsupported else ""
    )


def bind_polygraphy(library: TrtLibrary) -> None:
    """Make Polygraphy's TensorRT loaders use ``library`` (see the module docstring); call before importing them.

    The first call in a process decides; a later call for the other library raises a BuildError.
    """
    library.import_module()  # a missing library is reported as such, not as Polygraphy's import error
    from polygraphy import config

    loader = sys.modules.get("polygraphy.backend.trt.loader")
    if loader is None:
        config.USE_TENSORRT_RTX = library.rtx
        return
    bound = _bound_module(loader)
    if bound != library.module_name or bool(config.USE_TENSORRT_RTX) != library.rtx:
        raise BuildError(
            f"{library.title} was asked for, but Polygraphy's TensorRT loaders in this process already use "
            f"{bound!r}: Polygraphy binds one TensorRT library per process, when polygraphy.backend.trt is first "
            "imported (POLYGRAPHY_USE_TENSORRT_RTX)",
            fix=f"build with {library.title} in a separate process (e.g. the `pipeline convert --backend "
            f"{library.backend}` command), or use one TensorRT library per process",
        )


def _bound_module(loader: ModuleType) -> str:
    """The module name behind ``loader.trt`` (Polygraphy's lazy module), or why it cannot be told."""
    try:
        return str(loader.trt.__name__)
    except Exception as exc:  # the lazy module fails to import its library: it is not one that imports here
        return f"an unimportable module ({exc})"


def rtx_plugin_error(nodes: list[str]) -> BuildError:
    """The BuildError for plugin nodes given to TensorRT-RTX: its Python plugin API is what registers our plugins."""
    try:
        importlib.import_module("tensorrt_rtx.plugin")
        why = "this project registers its plugins through tensorrt.plugin only; TensorRT-RTX is not wired up yet"
    except ImportError as exc:  # 1.7.1.116: the bindings wheel lacks tensorrt_rtx_bindings.plugin
        why = f"TensorRT-RTX's Python plugin API does not import here ({exc})"
    return BuildError(
        f"the final graph has plugin node(s) {nodes}, which TensorRT-RTX cannot build: {why}",
        node=nodes[0] if nodes else None,
        fix="build with backend='tensorrt' (NVIDIA TensorRT, which registers the plugins), lower the op with a "
        "converter of ONNX ops instead of a plugin, or convert with backend='onnxruntime'",
    )
