"""A drop-in module that converts on its first call, with the arguments it is actually called with.

``pipe.unet = pipeline.on_first_call(pipe.unet, precision="fp16", dynamic={...})`` gives a module that a diffusers
pipeline (or any caller) uses as it used the original: the first call converts (``pipeline.convert`` with that
call as the sample and every keyword given here), later calls run the converted module, and every attribute the
caller reads (``config``, ``dtype``, ``device``, the original's methods and fields) is the original's. A call that
leaves what was converted (another fixed shape, another constant argument) converts again with a WARNING, up to
``max_conversions``; a call outside the dynamic ranges declared here is an InputError saying so, since converting
again would only declare the same ranges. ``artifact=path`` loads the converted module from ``path`` when it
exists and writes every new conversion there, with a fingerprint of the weights it converted (SHA-256 over the
module's ``state_dict``): an artifact converted from other weights (or saved without a fingerprint) is converted
again, with a WARNING, and overwritten. Calls from several threads at once convert (or load) once.

A bound method (``pipe.vae.decode``) is swapped the same way: ``pipe.vae.decode = pipeline.on_first_call(
pipe.vae.decode)`` converts the method (with its module's weights) on its first call.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from converters.errors import InputError
from converters.shapes import ProfileRange
from pipeline.conversion import convert
from pipeline.runtime.artifact_reading import read_metadata
from pipeline.runtime.loading import load
from pipeline.runtime.module import ConvertedModule

logger = logging.getLogger(__name__)
#: The artifact's metadata entry with the fingerprint of the weights converted (:func:`weights_fingerprint`).
SOURCE_WEIGHTS = "source_weights"


class FirstCall:
    """The conversions of one callable: made on demand, tried in order on every call, saved to ``artifact``."""

    def __init__(
        self,
        target: torch.nn.Module,
        convert_kwargs: dict[str, Any],
        artifact: str | Path | None = None,
        max_conversions: int = 4,
    ) -> None:
        self.target = target
        self.convert_kwargs = convert_kwargs
        self.artifact = None if artifact is None else Path(artifact)
        self.max_conversions = max_conversions
        self.conversions: list[ConvertedModule] = []
        self.warned_generator = False
        self.label = target.label if isinstance(target, MethodModule) else type(target).__name__
        self.lock = threading.Lock()  # held to load or convert, not to run a conversion already made
        self.tried_artifact = False

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the first conversion the call fits, loading the artifact or converting (again) when none does."""
        args, kwargs = self._without_generators(args, kwargs)
        reasons: list[str] = []
        tried = 0
        while True:
            for converted in self.conversions[tried:]:
                tried += 1
                try:
                    return converted(*args, **kwargs)
                except InputError as exc:  # raised before anything runs: the call does not fit this conversion
                    reasons.append(exc.message)
            with self.lock:
                if len(self.conversions) > tried:
                    continue  # another thread loaded or converted meanwhile: try that one (outside the lock)
                if not self.tried_artifact:
                    loaded = self._load_saved()  # an unreadable artifact raises, on this call and the next
                    self.tried_artifact = True
                    if loaded:
                        continue
                if self.conversions:
                    self._check_convertible(args, kwargs, reasons)
                converted = self._convert(args, kwargs)
            return converted(*args, **kwargs)

    def _load_saved(self) -> bool:
        """Load the artifact, if there is one converted from the target's present weights; False (a WARNING says
        why when there is an artifact) when there is none to use. The weights are hashed while it loads."""
        if self.artifact is None or not self.artifact.exists():
            return False
        recorded = read_metadata(self.artifact).get(SOURCE_WEIGHTS)
        if not isinstance(recorded, dict) or not isinstance(recorded.get("sha256"), str):
            logger.warning(
                "on_first_call: the artifact at %s records no fingerprint of the weights it was converted from "
                "(saved without on_first_call, or by an older version), so it may hold other weights than %s's: "
                "converting again and overwriting it",
                self.artifact,
                self.label,
            )
            return False
        with ThreadPoolExecutor(1, thread_name_prefix="weights-fingerprint") as pool:
            here = pool.submit(weights_fingerprint, self.target)  # hashlib releases the GIL: it runs beside the load
            loaded = load(self.artifact)
            current = here.result()
        if current["sha256"] != recorded["sha256"]:
            logger.warning(
                "on_first_call: the artifact at %s was converted from other weights (SHA-256 %s, %s tensors) than "
                "%s's (SHA-256 %s, %s tensors): converting again and overwriting it",
                self.artifact,
                recorded["sha256"][:16],
                recorded.get("tensors", "?"),
                self.label,
                current["sha256"][:16],
                current["tensors"],
            )
            return False
        self.conversions.append(loaded)
        logger.info("on_first_call: loaded %s", self.artifact)
        return True

    def _without_generators(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``torch.Generator`` arguments (diffusers passes one to ``vae.decode``) become None: a graph cannot take
        one, and its random ops (if any) draw from the backend's own generator. Said once, as a WARNING."""
        names = [k for k, v in kwargs.items() if isinstance(v, torch.Generator)]
        names += [f"#{i}" for i, v in enumerate(args) if isinstance(v, torch.Generator)]
        if not names:
            return args, kwargs
        if not self.warned_generator:
            logger.warning(
                "on_first_call: the generator argument(s) %s of %s are passed as None: a converted graph cannot take "
                "a torch.Generator (random ops in it draw from the backend's own generator)",
                ", ".join(names),
                self.label,
            )
            self.warned_generator = True
        args = tuple(None if isinstance(v, torch.Generator) else v for v in args)
        return args, {k: None if isinstance(v, torch.Generator) else v for k, v in kwargs.items()}

    def _check_convertible(self, args: tuple[Any, ...], kwargs: dict[str, Any], reasons: list[str]) -> None:
        outside = outside_declared_ranges(self.conversions[-1], args, kwargs)
        if outside:
            raise InputError(
                f"on_first_call: the call has {outside}; converting again would declare the same range",
                fix="declare a wider range (or another profile) in on_first_call(..., dynamic={...}, profiles=[...]), "
                "or call within it",
            )
        if len(self.conversions) >= self.max_conversions:
            raise InputError(
                f"on_first_call: the call fits none of the {len(self.conversions)} conversions made "
                f"(max_conversions={self.max_conversions}); the last one said: {reasons[-1]}",
                fix="declare the varying dimensions dynamic (dynamic={...}), or raise max_conversions",
            )
        logger.warning(
            "on_first_call: converting %s again: the call does not fit the conversion made before (%s)",
            self.label,
            reasons[-1],
        )

    def _convert(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ConvertedModule:
        converted = convert(self.target, (args, kwargs), **self.convert_kwargs)
        self.conversions.append(converted)
        if self.artifact is not None:
            self.save(self.artifact)
            logger.info("on_first_call: saved the conversion to %s", self.artifact)
        return converted

    def save(self, path: str | Path) -> Path:
        """Write the latest conversion as one artifact, with the fingerprint of the target's weights."""
        latest = _latest(self.conversions)
        return latest.save(path, metadata={SOURCE_WEIGHTS: weights_fingerprint(self.target)})


def weights_fingerprint(module: torch.nn.Module) -> dict[str, Any]:
    """The SHA-256 over a module's ``state_dict``: every tensor's name, dtype, shape and bytes, in name order (a
    tensor shared under several names is hashed once, then named), with the number of tensors and of bytes.

    All the bytes, not a sample: two fine-tunes may differ in a few weights. SHA-256 runs at about 1.3 GB/s where
    the CPU has SHA instructions (0.08 s for 100 MB)."""
    digest = hashlib.sha256()
    seen: dict[tuple[Any, ...], str] = {}
    tensors = size = 0
    for name, value in sorted(module.state_dict().items()):
        if not isinstance(value, torch.Tensor):
            continue  # a module's extra state (get_extra_state) is not a weight
        tensor = value.detach()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        key = (
            (tensor.device, tensor.dtype, tensor.shape, tensor.stride(), tensor.data_ptr()) if tensor.numel() else None
        )
        if key is not None and key in seen:
            digest.update(f"={seen[key]}\0".encode())
            continue
        if key is not None:
            seen[key] = name
        data = _plain(tensor).contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
        digest.update(data.data)
        tensors, size = tensors + 1, size + data.nbytes
    return {"sha256": digest.hexdigest(), "tensors": tensors, "bytes": size}


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """A dense, unquantized tensor of ``tensor``'s values (its bytes are what is hashed)."""
    if tensor.is_quantized:
        tensor = tensor.dequantize()
    return tensor.to_dense() if tensor.layout != torch.strided else tensor


def outside_declared_ranges(converted: ConvertedModule, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The first declared dynamic dimension the call is outside of, in words ('' when none is): such a call can
    not be converted again with the same declaration."""
    try:
        tensors = converted.io.flatten_call(args, kwargs)
    except InputError:
        return ""  # another structure or constant: a conversion of its own
    index = {spec.name: i for i, spec in enumerate(converted.io.inputs)}
    sizes: dict[str, int] = {}
    for dim in converted.settings.dynamic:
        if dim.input not in index or dim.axis >= tensors[index[dim.input]].dim():
            continue
        size = sizes[dim.name] = int(tensors[index[dim.input]].shape[dim.axis])
        where = f"size {size} on axis {dim.axis} of {dim.input!r}"
        if not dim.min <= size <= dim.max:
            return f"{where}, outside the declared range {dim.name!r} [{dim.min}, {dim.max}]"
        if size % dim.multiple:
            return f"{where}, not a multiple of {dim.multiple} (the model needs it for {dim.name!r})"
    return _outside_profiles(converted.settings.profiles, sizes)


def _outside_profiles(profiles: tuple[tuple[ProfileRange, ...], ...], sizes: dict[str, int]) -> str:
    """'' when the sizes fit one of the declared optimization profiles (or none is declared), else in words."""
    if not profiles or any(all(r.min <= sizes.get(r.name, r.min) <= r.max for r in p) for p in profiles):
        return ""
    declared = "; ".join(", ".join(f"{r.name} [{r.min}, {r.max}]" for r in p) for p in profiles)
    given = ", ".join(f"{name}={size}" for name, size in sizes.items())
    return f"{given}, in none of the declared optimization profiles ({declared})"


class FirstCallModule(torch.nn.Module):
    """The original module, converted on its first call; reads every other attribute from the original.

    ``.original`` is the PyTorch module, ``.conversions`` the converted modules made so far, ``.converted`` the
    latest one (None before the first call), ``.save(path)`` writes it as an artifact.
    """

    def __init__(self, original: torch.nn.Module, first_call: FirstCall) -> None:
        super().__init__()
        self.original = original
        self._first_call = first_call

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Convert on the first call (or when the call fits no conversion), then run the converted module."""
        return self._first_call(args, kwargs)

    @property
    def conversions(self) -> list[ConvertedModule]:
        """The converted modules made (or loaded) so far, tried in order on every call."""
        return self._first_call.conversions

    @property
    def converted(self) -> ConvertedModule | None:
        """The latest converted module, or None before the first call."""
        return self.conversions[-1] if self.conversions else None

    @property
    def dtype(self) -> torch.dtype:
        """The original's dtype (diffusers pipelines read ``unet.dtype``)."""
        return _dtype(self.original)

    @property
    def device(self) -> torch.device:
        """The original's device (diffusers pipelines read ``unet.device``)."""
        return _device(self.original)

    def save(self, path: str | Path) -> Path:
        """Write the latest conversion as one artifact (``on_first_call(..., artifact=path)`` loads it)."""
        return self._first_call.save(path)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "original":
                raise
        return getattr(self.original, name)


class FirstCallMethod:
    """A bound method (``vae.decode``), converted on its first call; assign it over the method.

    Not an ``nn.Module``: assigned as ``vae.decode = ...`` it must land in the instance's ``__dict__`` (a module
    attribute would be registered as a submodule, behind the class's own ``decode``).
    """

    def __init__(self, method: Callable[..., Any], first_call: FirstCall) -> None:
        self.method = method
        self._first_call = first_call
        self.__signature__ = inspect.signature(method)
        self.__doc__ = method.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Convert on the first call (or when the call fits no conversion), then run the converted method."""
        return self._first_call(args, kwargs)

    @property
    def conversions(self) -> list[ConvertedModule]:
        """The converted modules made (or loaded) so far."""
        return self._first_call.conversions

    def save(self, path: str | Path) -> Path:
        """Write the latest conversion as one artifact."""
        return self._first_call.save(path)


class MethodModule(torch.nn.Module):
    """A module whose forward is a bound method of another module (whose weights it holds): what is exported."""

    def __init__(self, method: Callable[..., Any]) -> None:
        super().__init__()
        self.owner = getattr(method, "__self__")  # noqa: B009 -- a bound method's module
        self.forward = method  # the signature export binds the sample to
        self.train(self.owner.training)  # the owner's mode, not a fresh module's (training)
        self.label = f"{type(self.owner).__name__}.{getattr(method, '__name__', 'method')}"


def on_first_call(
    module: torch.nn.Module | Callable[..., Any],
    *,
    artifact: str | Path | None = None,
    max_conversions: int = 4,
    **convert_kwargs: Any,
) -> Any:
    """``module`` (or a bound method of a module), converted by ``pipeline.convert`` on its first call.

    Every keyword but ``artifact`` and ``max_conversions`` goes to :func:`pipeline.convert` (``precision``,
    ``backend``, ``dynamic``, ``tolerances``, ``validate``, ``calibration``, ...). Declare the dimensions that vary
    between calls dynamic, by the forward's argument names: a UNet under classifier-free guidance doubles its batch,
    ``dynamic={"sample": {0: ("batch", 1, 2, 4)}, "encoder_hidden_states": {0: ("batch", 1, 2, 4)}}``; the latent's
    height and width (axes 2 and 3) for several resolutions, each resolution class an optimization profile
    (``profiles=[{"height": (64, 64, 64), "width": (64, 64, 64)}, ...]``).

    >>> pipe.unet = pipeline.on_first_call(pipe.unet, precision="fp16")          # doctest: +SKIP
    >>> pipe.vae.decode = pipeline.on_first_call(pipe.vae.decode)               # doctest: +SKIP
    """
    if isinstance(module, torch.nn.Module):
        return FirstCallModule(module, FirstCall(module, convert_kwargs, artifact, max_conversions))
    owner = getattr(module, "__self__", None)
    if callable(module) and isinstance(owner, torch.nn.Module):
        target = MethodModule(module)
        return FirstCallMethod(module, FirstCall(target, convert_kwargs, artifact, max_conversions))
    raise InputError(
        f"on_first_call takes an nn.Module or a bound method of one, got {type(module).__name__}",
        fix="pass the module (pipe.unet) or its method (pipe.vae.decode)",
    )


def _latest(conversions: list[ConvertedModule]) -> ConvertedModule:
    if not conversions:
        raise InputError(
            "nothing to save: the module has not been called yet, so it is not converted",
            fix="call it once (e.g. run the pipeline one step) before saving",
        )
    return conversions[-1]


def _dtype(module: torch.nn.Module) -> torch.dtype:
    found = getattr(type(module), "dtype", None)
    if isinstance(found, property):
        return found.fget(module)  # type: ignore[misc]
    first = next(iter(module.parameters()), None)
    return torch.get_default_dtype() if first is None else first.dtype


def _device(module: torch.nn.Module) -> torch.device:
    found = getattr(type(module), "device", None)
    if isinstance(found, property):
        return found.fget(module)  # type: ignore[misc]
    first = next(iter(module.parameters()), None)
    return torch.device("cpu") if first is None else first.device
