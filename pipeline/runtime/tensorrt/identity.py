"""What a TensorRT engine is tied to and whether it can run here: the library's version and the GPU compute
capability it was built for, the build options that change it, and this machine's answer. The runtime checks a
saved engine with these before loading it; the build records them (and keys its engine cache on them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from pipeline.runtime.io_spec import IOSpec
from pipeline.runtime.tensorrt.library import TENSORRT, TrtLibrary, rtx_runtime_problem, rtx_targets
from pipeline.runtime.tensorrt.profiles import profile_shapes
from pipeline.settings import Settings


def trt_major() -> int:
    """TensorRT's major version; the one form of version check (see the module docstring)."""
    import tensorrt as trt

    return int(trt.__version__.split(".")[0])


def tensorrt_status() -> tuple[bool, str]:
    """Whether TensorRT can build and run here, and why (or why not)."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        return False, f"the tensorrt package does not import ({exc})"
    version = getattr(trt, "__version__", "unknown")
    if trt_major() < 10:
        return False, f"tensorrt {version} is too old: this project supports TensorRT 10 and 11"
    if not torch.cuda.is_available():
        return False, f"tensorrt {version} imports but no CUDA device is present"
    major, minor = torch.cuda.get_device_capability()
    return True, f"tensorrt {version} with CUDA device {torch.cuda.get_device_name()} (sm_{major}{minor})"


def engine_runtime_status(library: TrtLibrary, settings: Settings) -> tuple[bool, str]:
    """Whether an engine of ``library`` built with ``settings`` can run here, and why (or why not)."""
    if not library.rtx:
        return tensorrt_status()
    if not library.importable():
        return False, f"the {library.module_name} package does not import"
    version = library.version()
    problem = rtx_runtime_problem(settings.trt_compute_capabilities)
    if problem is not None:
        return False, problem
    major, minor = torch.cuda.get_device_capability()
    return True, f"tensorrt_rtx {version} with CUDA device {torch.cuda.get_device_name()} (sm_{major}{minor})"


def device_identity(library: TrtLibrary = TENSORRT, settings: Settings | None = None) -> dict[str, str]:
    """What an engine is tied to: the library's version and the GPU compute capability it was built for (TensorRT:
    this GPU's; TensorRT-RTX: the targets of ``settings.trt_compute_capabilities``, no GPU needed)."""
    if library.rtx:
        requested = settings.trt_compute_capabilities if settings is not None else ()
        return {"tensorrt_rtx": library.version(), "compute_capability": ",".join(rtx_targets(requested))}
    import tensorrt as trt

    major, minor = torch.cuda.get_device_capability()
    return {"tensorrt": trt.__version__, "compute_capability": f"{major}.{minor}"}


def engine_mismatch(built_for: Mapping[str, str], here: Mapping[str, str], settings: Settings) -> str | None:
    """Why an engine built for ``built_for`` cannot run on ``here`` (both from :func:`device_identity`); None if
    it can. Version-compatible engines run on later releases of the same major; ``ampere_plus`` engines on any
    GPU of compute capability 8.0 or later."""
    built_trt, here_trt = built_for.get("tensorrt", "?"), here.get("tensorrt", "?")
    if built_trt != here_trt and not (settings.trt_version_compatible and _later_same_major(built_trt, here_trt)):
        return f"it was built with TensorRT {built_trt}; this machine has {here_trt}"
    built_cc, here_cc = built_for.get("compute_capability", "?"), here.get("compute_capability", "?")
    portable = settings.trt_hardware_compatibility == "ampere_plus" and _version(here_cc)[:1] >= (8,)
    if built_cc != here_cc and not portable:
        return f"it was built for GPU compute capability {built_cc}; this GPU has {here_cc}"
    return None


def build_options(io: IOSpec, settings: Settings) -> dict[str, Any]:
    """Everything besides the graph that changes the engine: part of the engine cache key.

    The optimization profile, and every setting marked ``engine=True`` on its field (``Settings.engine_settings``;
    ``profiles`` among them, when the engine has several).
    """
    engine = {k: _jsonable(v) for k, v in settings.engine_settings().items()}
    profile = {name: [list(s) for s in shapes] for name, shapes in profile_shapes(io, settings).items()}
    # the budget is set at load; only whether the engine streams its weights is built in (and keyed on)
    streaming = {"weight_streaming": True} if settings.weight_streaming_budget is not None else {}
    return {"profile": profile, **engine, **streaming}


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    return value


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def _later_same_major(built: str, here: str) -> bool:
    b, h = _version(built), _version(here)
    return bool(b) and b[:1] == h[:1] and h >= b
