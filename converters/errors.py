"""The one exception hierarchy of the project.

It lives in ``converters`` because that is the lowest package that raises; ``passes`` and ``pipeline``
import it from here and ``pipeline`` re-exports every class. Each error names the stage it came from, the op
or node involved when there is one, and what the user can do about it.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base class of every error raised by this project.

    >>> str(ExportError("torch.export failed", node="aten.nonzero", fix="mark the dimension dynamic"))
    '[export] torch.export failed (at aten.nonzero)\\n  fix: mark the dimension dynamic'
    """

    stage = "pipeline"

    def __init__(self, message: str, *, node: str | None = None, fix: str | None = None) -> None:
        self.message = message
        self.node = node
        self.fix = fix
        super().__init__(self._format())

    def _format(self) -> str:
        text = f"[{self.stage}] {self.message}"
        if self.node:
            text += f" (at {self.node})"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


class InputError(PipelineError):
    """The model, the sample or the call arguments are not what the pipeline can take."""

    stage = "input"


class ExportError(PipelineError):
    """torch.export or the ONNX translation of the exported program failed."""

    stage = "export"


class ConversionError(PipelineError):
    """A graph pass or a converter failed, or left the graph in a state the backends cannot take."""

    stage = "conversion"


class BuildError(PipelineError):
    """The backend could not be selected, or could not build an engine or session from the final graph."""

    stage = "build"


class AccuracyError(PipelineError):
    """The converted model departs from PyTorch beyond the tolerances.

    ``per_output`` maps each output name to its worst ``max_abs``/``max_rel`` error and the tolerance used.
    """

    stage = "validate"

    def __init__(
        self,
        message: str,
        *,
        per_output: dict[str, dict[str, float]] | None = None,
        node: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.per_output = per_output or {}
        super().__init__(message, node=node, fix=fix)


class ArtifactError(PipelineError):
    """A saved artifact is corrupted, incomplete, or was made for another TensorRT version or GPU."""

    stage = "artifact"


class ServingError(PipelineError):
    """The Triton server could not be found, started or reached, or a model it serves failed to load."""

    stage = "serving"
