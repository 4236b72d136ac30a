"""The comparison report: JSON for machines, Markdown for people, PNG plots, a short terminal table, and the
``polygraphy run`` command that reproduces the comparison on the saved final graph."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import onnx

from converters.errors import InputError
from passes.model_io.external_data import save_onnx
from pipeline.accuracy.distribution import DistributionStats
from pipeline.accuracy.stats import HIST_EDGES, ErrorStats, judgement
from pipeline.accuracy.uninitialised import ShapeStats
from pipeline.comparison.layers import Divergence, LayerComparison, LayerReport
from pipeline.comparison.markdown import render_markdown, render_table
from pipeline.runtime.io_spec import IOSpec
from pipeline.runtime.reports.accuracy import DroppedInput
from pipeline.settings import Settings
from pipeline.validation.stage import Feed

FILES = {
    "json": "report.json",
    "markdown": "report.md",
    "graph": "final.onnx",
    "inputs": "inputs.json",
    "reference": "reference_outputs.json",
    "layers_plot": "layers.png",
}


@dataclass(frozen=True)
class RunnerInfo:
    """One runner of a comparison: its name, what it runs, and why it was skipped, if it was."""

    name: str
    description: str
    skipped: str | None = None


@dataclass(frozen=True)
class OutputComparison:
    """One output of one backend runner against the reference, over all inputs."""

    runner: str
    output: str
    dtype: str
    atol: float
    rtol: float
    stats: ErrorStats | DistributionStats | ShapeStats
    #: the type the graph computes the output in (its tolerance's), and why the rule is not the plain one
    computed_in: str = ""
    note: str = ""
    rms_atol: float = 0.0
    rms: float = 0.0

    @property
    def passed(self) -> bool:
        """Within tolerance on every compared element (a random output: its distribution matches; uninitialised
        memory: its shape and dtype)."""
        return self.stats.passed

    def to_dict(self) -> dict[str, Any]:
        """The comparison as JSON-ready data."""
        return {
            "runner": self.runner,
            "output": self.output,
            "dtype": self.dtype,
            "computed_in": self.computed_in,
            "atol": self.atol,
            "rtol": self.rtol,
            "rms_atol": self.rms_atol,
            "rms": self.rms,
            "passed": self.passed,
            "note": self.note,
            "judged_by": _judged_by(self.stats),
            "outside": self.stats.outside,
            **self.stats.to_dict(),
        }


def _judged_by(stats: ErrorStats | DistributionStats | ShapeStats) -> str:
    if isinstance(stats, ShapeStats):
        return "shape"
    return "distribution" if isinstance(stats, DistributionStats) else "elementwise"


@dataclass(frozen=True)
class ComparisonReport:
    """Everything a comparison found. ``write(directory)`` saves the report files; ``table()`` is the short
    terminal summary; ``first_divergence`` is set by per-layer comparisons that found one. ``dropped`` lists the
    drawn inputs PyTorch itself refused, which were not compared (``inputs``, ``feeds`` and
    ``reference_outputs`` leave them out)."""

    model: str
    reference: str
    reference_dtype: str
    rule: str
    inputs: int
    input_source: str
    runners: tuple[RunnerInfo, ...]
    outputs: tuple[OutputComparison, ...]
    layers: LayerReport | None
    versions: dict[str, str]
    final: onnx.ModelProto = field(repr=False, compare=False)
    io: IOSpec = field(repr=False, compare=False)
    settings: Settings = field(repr=False, compare=False)
    feeds: list[Feed] = field(repr=False, compare=False)
    reference_outputs: list[Feed] = field(repr=False, compare=False)
    dropped: tuple[DroppedInput, ...] = ()

    @property
    def passed(self) -> bool:
        """Every output of every runner within tolerance."""
        return all(o.passed for o in self.outputs)

    @property
    def first_divergence(self) -> Divergence | None:
        """The first module (in execution order) whose outputs leave the tolerance, if a per-layer run found one."""
        return self.layers.first_divergence if self.layers else None

    # -- the reproducer ----------------------------------------------------------------------------------------

    def polygraphy_command(self, directory: str | Path, *, tensorrt: bool = True) -> list[str]:
        """``polygraphy run`` on the saved final graph and inputs, compared with the saved PyTorch outputs under
        the same rule and tolerances. With ``tensorrt`` it builds a strongly typed engine too (TensorRT against
        ONNX Runtime, then ONNX Runtime against PyTorch); without, ONNX Runtime only."""
        from pipeline.runtime.tensorrt.profiles import profile_shapes

        d = Path(directory)
        args = ["polygraphy", "run", str(d / FILES["graph"])]
        if tensorrt:
            args += ["--trt", "--strongly-typed"]
            if profiles := profile_shapes(self.io, self.settings):
                for index, flag in enumerate(("--trt-min-shapes", "--trt-opt-shapes", "--trt-max-shapes")):
                    args += [flag, *(f"{name}:[{','.join(map(str, s[index]))}]" for name, s in profiles.items())]
        args += ["--onnxrt", "--load-inputs", str(d / FILES["inputs"]), "--load-outputs", str(d / FILES["reference"])]
        args += ["--check-error-stat", "elemwise", "--infinities-compare-equal"]
        tolerances = [(s.name, judgement(s.name, s.dtype, self.settings).tolerance) for s in self.io.outputs]
        args += ["--atol", *(f"{name}:{self._atol_used(name, t.atol)!r}" for name, t in tolerances)]
        args += ["--rtol", *(f"{name}:{t.rtol!r}" for name, t in tolerances)]
        return args

    def _atol_used(self, output: str, atol: float) -> float:
        """The largest atol the comparison used for ``output`` (a magnitude-relative tolerance scales it with the
        output's RMS; Polygraphy's elementwise check takes one number, and has no RMS rule)."""
        used = [o.stats.atol_used for o in self.outputs if o.output == output and isinstance(o.stats, ErrorStats)]
        return max([atol, *used])

    # -- JSON --------------------------------------------------------------------------------------------------

    def to_dict(self, directory: str | Path | None = None) -> dict[str, Any]:
        """The report as JSON-ready data; with ``directory``, file references are relative to it."""
        data: dict[str, Any] = {
            "model": self.model,
            "passed": self.passed,
            "rule": self.rule,
            "reference": {"runner": self.reference, "dtype": self.reference_dtype},
            "inputs": {"count": self.inputs, "source": self.input_source},
            "dropped": [{**asdict(d), "summary": d.summary()} for d in self.dropped],
            "runners": [{"name": r.name, "description": r.description, "skipped": r.skipped} for r in self.runners],
            "outputs": [o.to_dict() for o in self.outputs],
            "per_layer": _layers_dict(self.layers) if self.layers else None,
            "versions": dict(self.versions),
        }
        from pipeline.comparison.plots import missing_reason

        data["plots_missing"] = missing_reason()
        if directory is not None:
            data["polygraphy_command"] = shlex.join(self.polygraphy_command(directory))
            data["polygraphy_command_onnxruntime"] = shlex.join(self.polygraphy_command(directory, tensorrt=False))
            data["files"] = {kind: str(Path(directory) / name) for kind, name in self.files().items()}
        return data

    def files(self) -> dict[str, str]:
        """Kind -> file name of everything :meth:`write` saves."""
        names = dict(FILES)
        if self.layers is None or not self.layers.layers:
            del names["layers_plot"]
        for output in dict.fromkeys(o.output for o in self.outputs if isinstance(o.stats, ErrorStats)):
            names[f"histogram:{output}"] = f"histogram_{_safe(output)}.png"
        from pipeline.comparison.plots import available

        return names if available() else {k: v for k, v in names.items() if not v.endswith(".png")}

    # -- Markdown and the terminal ---------------------------------------------------------------------------

    def markdown(self, directory: str | Path) -> str:
        """``report.md`` for the files written to ``directory`` (:func:`render_markdown` of :meth:`to_dict`)."""
        return render_markdown(self.to_dict(directory))

    def table(self, directory: str | Path | None = None) -> str:
        """The short terminal summary (:func:`render_table` of :meth:`to_dict`); with ``directory``, where the
        report files are and the Polygraphy command."""
        return render_table(self.to_dict(directory))

    # -- writing -----------------------------------------------------------------------------------------------

    def write(self, directory: str | Path) -> dict[str, Path]:
        """Write every report file into ``directory`` (created if needed); returns kind -> path."""
        from converters.files import write_file_atomically

        d = Path(directory)
        written = {}
        for kind, name in self.files().items():  # one file in memory at a time
            if kind == "graph":
                written[kind] = save_onnx(self.final, d / name)[0]
            else:
                written[kind] = write_file_atomically(d / name, self._content(kind, d))
        return written

    def _content(self, kind: str, directory: Path) -> bytes:
        from polygraphy.comparator import RunResults
        from polygraphy.json import to_json

        if kind == "json":
            return json.dumps(self.to_dict(directory), indent=2).encode()
        if kind == "markdown":
            return self.markdown(directory).encode()
        if kind == "inputs":
            return str(to_json(self.feeds)).encode()
        if kind == "reference":
            reference = RunResults()
            reference.add(self.reference_outputs, runner_name=self.reference)
            return str(to_json(reference)).encode()
        return self._plot(kind)

    def _plot(self, kind: str) -> bytes:
        from pipeline.comparison import plots

        if kind == "layers_plot":
            # rows judged by distribution (random tensors) have no element errors to plot
            rows = [r for r in (self.layers.layers if self.layers else ()) if isinstance(r.stats, ErrorStats)]
            title = f"MAX ABS ERROR ALONG DEPTH ({len(rows)} MODULES)"
            return plots.depth_png(
                [r.module for r in rows],
                [r.stats.max_abs for r in rows if isinstance(r.stats, ErrorStats)],
                [r.passed for r in rows],
                title,
            )
        return plots.png(self.histogram(kind.partition(":")[2]))

    def histogram(self, output: str) -> Any:
        """The matplotlib figure of ``output``'s absolute errors (the report's ``hist_<output>.png``): each
        runner's counts, and the atol its verdict used (a magnitude-relative tolerance's, ``max(atol, rms_atol x
        RMS)``, as the table prints it)."""
        from pipeline.comparison import plots

        mine = [o for o in self.outputs if o.output == output and isinstance(o.stats, ErrorStats)]
        if not mine:
            raise InputError(
                f"no element-wise comparison of {output!r} to draw",
                fix=f"name one of: {', '.join(dict.fromkeys(o.output for o in self.outputs))}",
            )
        atol = self._atol_used(output, mine[0].atol)
        label = f"atol {atol:.3g} ({mine[0].rms_atol:g} x RMS)" if mine[0].rms_atol else f"atol {atol:g}"
        counts = [(o.runner, o.stats.histogram) for o in mine if isinstance(o.stats, ErrorStats)]
        return plots.histogram_figure(output, counts, HIST_EDGES, atol, label=label)


def _layers_dict(layers: LayerReport) -> dict[str, Any]:
    divergence = layers.first_divergence
    return {
        "backend": layers.backend,
        "backend_note": layers.note,
        "first_divergence": None
        if divergence is None
        else {
            **_layer_dict(divergence.layer),
            "nodes": [{"name": n, "op_type": op} for n, op in divergence.nodes],
            "suspect_nodes": [{"name": n, "op_type": op} for n, op in divergence.suspects],
        },
        "layers": [_layer_dict(layer) for layer in layers.layers],
        "unmatched": [{"module": m, "type": t, "reason": r} for m, t, r in layers.unmatched],
        "nodes_without_module": layers.nodes_without_module,
        "chunks": layers.chunks,
        "memory_budget_bytes": layers.memory_budget,
        "matching": "each module's output is compared with the tensor of the last ONNX node (topological order) "
        "under its name scope whose shape fits and whose type can hold it (the graph's own: any float type for a "
        "float output), under the tolerance of the type the graph computes it in; a module run several times is "
        "compared at its last call",
    }


def _layer_dict(layer: LayerComparison) -> dict[str, Any]:
    return {
        "module": layer.module,
        "type": layer.type_name,
        "tensor": layer.tensor,
        "node": layer.node,
        "op_type": layer.op_type,
        "dtype": layer.dtype,
        "computed_in": layer.computed_in,
        "calls": layer.calls,
        "atol": layer.atol,
        "rtol": layer.rtol,
        "rms_atol": layer.rms_atol,
        "rms": layer.rms,
        "passed": layer.passed,
        **{k: v for k, v in layer.stats.to_dict().items() if k != "histogram"},
    }


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)
