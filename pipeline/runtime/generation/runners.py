"""Who holds the key/value cache between decoder steps: the executor's side of generation.

A runner allocates each layer's static cache once per ``generate`` call (:meth:`start`) and runs one step at a time
(:meth:`run`), returning the logits of the last position. :class:`OrtBoundRunner` keeps the cache in ONNX Runtime
``OrtValue`` buffers bound to the session (``IOBinding``), each step's ``present`` outputs written into the buffers
the next step reads: nothing crosses into Python but the logits. :class:`CopyingRunner` is the plain form for any
executor (the cache comes back as new tensors and goes in again: a copy per step), used where no binding exists
and measured against the bound one by ``benchmarks/bench_generate.py``. TensorRT executors keep the cache on the
device: :mod:`pipeline.runtime.generation.trt_cache`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from pipeline.runtime.generation.layout import CacheLayout


class StepRunner(Protocol):
    """One decoder step at a time over a cache the runner holds."""

    def start(self, batch: int) -> None:
        """A fresh (zeroed) cache for ``batch`` rows."""
        ...

    def run(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, past_length: int
    ) -> torch.Tensor:
        """Run the step; the logits of the last position [batch, vocab]."""
        ...

    def reorder(self, rows: torch.Tensor) -> None:
        """Row ``i`` of the cache becomes what row ``rows[i]`` was (int64 [batch]; beam search between steps)."""
        ...


class CopyingRunner:
    """Any executor: the cache goes in and comes back as tensors every step."""

    def __init__(self, executor: Any, layout: CacheLayout, prompt: Any = None) -> None:
        self.executor = executor
        self.layout = layout
        #: a recurrent model's prompt graph's executor (the runs of several tokens), or None
        self.prompt = prompt
        self.cache: list[torch.Tensor] = []

    def start(self, batch: int) -> None:
        """Zeroed cache tensors for ``batch`` rows."""
        self.cache = [
            torch.zeros((batch, *s), dtype=d) for s, d in zip(self.layout.shapes, self.layout.dtypes, strict=True)
        ]

    def run(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, past_length: int
    ) -> torch.Tensor:
        """One step; the new cache replaces the old."""
        inputs = [input_ids, attention_mask, position_ids, torch.tensor(past_length, dtype=torch.int64), *self.cache]
        executor = self.prompt if self.prompt is not None and input_ids.shape[1] > 1 else self.executor
        outputs = executor.run(inputs)
        self.cache = list(outputs[1:])
        return outputs[0]

    def reorder(self, rows: torch.Tensor) -> None:
        """The cache tensors' rows picked anew."""
        self.cache = [tensor.index_select(0, rows.to(tensor.device)) for tensor in self.cache]


class OrtBoundRunner:
    """ONNX Runtime with the cache in bound ``OrtValue`` buffers.

    ``aliased=True`` binds each ``present`` output to the very buffer its ``past`` input reads (the step writes the
    cache in place: ``TensorScatter`` copies its input onto itself, then writes the new positions); ``False`` keeps
    two sets of buffers and swaps them every step (the cache copied once per step inside ONNX Runtime). A recurrent
    state (:attr:`CacheLayout.in_place` false) has two buffers either way: the step computes its new state from the
    old one over many nodes, all of which must read the old.

    ``row_session`` (a callable giving a session or ``None``) is the executor's second session of the same graph for
    steps of one row and one token (:meth:`pipeline.runtime.ort.executor.OnnxRuntimeExecutor.row_session`): those
    steps run there, on the same cache buffers. ``prompt_session``: a recurrent model's prompt graph's session
    (:mod:`pipeline.generation.prompt_graph`), which runs the steps of several tokens on the same buffers."""

    def __init__(
        self,
        session: Any,
        layout: CacheLayout,
        aliased: bool = True,
        row_session: Callable[[], Any] | None = None,
        prompt_session: Any = None,
    ) -> None:
        self.session = session
        self.layout = layout
        self.aliased = aliased
        self.binding = _Binding(session, layout)
        self.prompt_binding = _Binding(prompt_session, layout) if prompt_session is not None else None
        self._row_session = row_session
        self._row_binding: _Binding | None = None
        self.reads: list[Any] = []
        self.writes: list[Any] = []
        self.read_arrays: list[np.ndarray] = []
        self.write_arrays: list[np.ndarray] = []

    def start(self, batch: int) -> None:
        """Zeroed ``OrtValue`` buffers for ``batch`` rows (one set when aliased, two otherwise)."""
        import onnxruntime as ort

        def arrays() -> list[np.ndarray]:
            return [
                np.zeros((batch, *s), dtype=torch.empty((), dtype=d).numpy().dtype)
                for s, d in zip(self.layout.shapes, self.layout.dtypes, strict=True)
            ]

        # the OrtValues wrap the arrays' memory (CPU: no copy), so a row of an array is a row of the buffer
        self.read_arrays = arrays()
        self.write_arrays = self.read_arrays if self.aliased else arrays()
        self.reads = [ort.OrtValue.ortvalue_from_numpy(a) for a in self.read_arrays]
        self.writes = self.reads if self.aliased else [ort.OrtValue.ortvalue_from_numpy(a) for a in self.write_arrays]
        if self.aliased and not all(self.layout.in_place):  # recurrent states: two buffers each, swapped every step
            self.write_arrays = [r if same else np.zeros_like(r) for r, same in self._pairs(self.read_arrays)]
            self.writes = [
                r if same else ort.OrtValue.ortvalue_from_numpy(w)
                for (r, same), w in zip(self._pairs(self.reads), self.write_arrays, strict=True)
            ]

    def run(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        past_length: int,
        extra: dict[str, np.ndarray] | None = None,
    ) -> torch.Tensor:
        """One step on the bound buffers; only the logits are read back. ``extra``: the step's other inputs by name
        (an encoder-decoder's cross keys and values, a vision-language step's image features); an array given again
        as the same object stays bound (the cross states: bound once per request). A step without an attention mask
        or positions (an encoder-decoder's) takes None for them.

        A prompt chunk after the first (several tokens over a filled cache) runs one row at a time when the batch
        has several: ONNX Runtime's ``GroupQueryAttention`` (the session graph of
        :mod:`pipeline.runtime.ort.grouped_attention`) takes several new tokens over a past for one row only (then
        ``extra`` inputs are cut by row too: only the decoder-only step, which has none, prefills in chunks)."""
        batch, steps = input_ids.shape
        binding = self._binding(steps)
        if batch > 1 and steps > 1 and past_length > 0:
            return self._by_row(
                binding,
                [
                    _named(
                        input_ids[row : row + 1],
                        None if attention_mask is None else attention_mask[row : row + 1],
                        None if position_ids is None else position_ids[row : row + 1],
                        past_length,
                        {name: value[row : row + 1] for name, value in (extra or {}).items()},
                    )
                    for row in range(batch)
                ],
            )
        target = self._row() if batch == 1 and steps == 1 else None
        named = _named(input_ids, attention_mask, position_ids, past_length, extra)
        logits = (target or binding).run(named, self.reads, self.writes)
        self._swap()
        return logits

    def prefill_leading(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        extra: dict[str, np.ndarray] | None = None,
        past_length: int = 0,
    ) -> torch.Tensor:
        """A prefill (nothing cached yet) of the buffers' first ``input_ids.shape[0]`` rows: each prompt once, its
        rows then repeated for its beams by :meth:`reorder`; ``past_length``: the tokens of the prompt already fed
        (a one-token step's prefill, token by token)."""
        rows, steps = (int(n) for n in input_ids.shape)
        binding = self._binding(steps)
        named = _named(input_ids, attention_mask, position_ids, past_length, extra)
        reads = [self._leading(a, rows) for a in self.read_arrays]
        writes = [
            r if w is a else self._leading(w, rows)
            for r, a, w in zip(reads, self.read_arrays, self.write_arrays, strict=True)
        ]
        logits = binding.run(named, reads, writes)
        self._swap()
        return logits

    def prefill_rows(self, rows: list[dict[str, np.ndarray]]) -> torch.Tensor:
        """A prefill run after the first of several rows, one row at a time (ONNX Runtime's ``GroupQueryAttention``
        takes several new tokens over a past for one row only: see :meth:`run`): ``rows[i]`` is row ``i``'s inputs
        by name (its own image features, a vision-language run's), each on its row of the buffers."""
        steps = int(rows[0]["input_ids"].shape[1])
        return self._by_row(self._binding(steps), rows)

    def _binding(self, steps: int) -> _Binding:
        """The prompt graph's binding for a run of several tokens (when there is one), else the step's."""
        return self.prompt_binding if self.prompt_binding is not None and steps > 1 else self.binding

    def _by_row(self, binding: _Binding, rows: list[dict[str, np.ndarray]]) -> torch.Tensor:
        """One run per row (``rows[i]``: row ``i``'s inputs by name) on that row of the buffers; the logits."""
        logits = torch.cat(
            [
                binding.run(named, self._rows(self.read_arrays, row), self._rows(self.write_arrays, row))
                for row, named in enumerate(rows)
            ]
        )
        self._swap()
        return logits

    def _swap(self) -> None:
        """The buffers just written are read by the next run."""
        self.reads, self.writes = self.writes, self.reads
        self.read_arrays, self.write_arrays = self.write_arrays, self.read_arrays

    @staticmethod
    def _leading(array: np.ndarray, rows: int) -> Any:
        import onnxruntime as ort

        return ort.OrtValue.ortvalue_from_numpy(array[:rows])

    def reorder(self, rows: torch.Tensor) -> None:
        """The rows moved in place in the arrays under the bound ``OrtValue`` buffers (they stay bound); both sets
        when there are two."""
        index = rows.cpu().numpy()
        for read, write in zip(self.read_arrays, self.write_arrays, strict=True):
            for array in (read,) if write is read else (read, write):
                array[...] = array[index]  # the fancy index copies first: no row is overwritten before it is read

    def _pairs(self, values: list[Any]) -> list[tuple[Any, bool]]:
        """``values`` each with whether its tensor is written in place (:attr:`CacheLayout.in_place`)."""
        return list(zip(values, self.layout.in_place, strict=True))

    def _row(self) -> _Binding | None:
        if self._row_binding is None and self._row_session is not None:
            session = self._row_session()
            self._row_session = None  # asked once
            if session is not None:
                self._row_binding = _Binding(session, self.layout)
        return self._row_binding

    @staticmethod
    def _rows(arrays: list[np.ndarray], row: int) -> list[Any]:
        import onnxruntime as ort

        return [ort.OrtValue.ortvalue_from_numpy(a[row : row + 1]) for a in arrays]


class _Binding:
    """One session's ``IOBinding``: the cache buffers (and a logits buffer of [batch, *vocabulary], when the logits'
    other dimensions are static) stay bound across the steps that use the same ones, so that a decode step binds
    only its four small inputs."""

    def __init__(self, session: Any, layout: CacheLayout) -> None:
        self.session = session
        self.layout = layout
        self.binding = session.io_binding()
        self._bound: tuple[list[Any], list[Any]] | None = None  # the cache buffers the binding holds
        self._logits: tuple[np.ndarray, Any] | None = None  # the bound logits buffer and its OrtValue
        #: bound input buffers (written in place while shapes hold), their OrtValues and the array last given
        self._inputs: dict[str, tuple[np.ndarray, Any, np.ndarray]] = {}
        self._vocabulary = _static_tail(session, "logits")

    def run(self, named: dict[str, np.ndarray], reads: list[Any], writes: list[Any]) -> torch.Tensor:
        """One run of the inputs ``named`` on ``reads``/``writes``; the logits."""
        import onnxruntime as ort

        binding = self.binding
        batch = int(named["input_ids"].shape[0])
        if self._bound is None or self._bound[0] is not reads or self._bound[1] is not writes:
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()
            for name, value in zip(self.layout.names, reads, strict=True):
                binding.bind_ortvalue_input(name, value)
            for name, value in zip(self.layout.present_names, writes, strict=True):
                binding.bind_ortvalue_output(name, value)
            self._bound, self._logits, self._inputs = (reads, writes), None, {}
        if self._vocabulary is not None and (self._logits is None or self._logits[0].shape[0] != batch):
            buffer = np.empty((batch, *self._vocabulary), np.float32)
            self._logits = (buffer, ort.OrtValue.ortvalue_from_numpy(buffer))
            binding.bind_ortvalue_output("logits", self._logits[1])
        elif self._vocabulary is None:
            binding.bind_output("logits")
        for name, value in named.items():
            self._input(name, value)
        self.session.run_with_iobinding(binding)
        if self._logits is not None:
            return torch.from_numpy(self._logits[0].copy())  # the buffer is written again by the next step
        index = len(self.layout.present_names)  # bound after the cache outputs
        return torch.from_numpy(binding.get_outputs()[index].numpy())

    def _input(self, name: str, value: np.ndarray) -> None:
        """``value`` into the buffer bound for ``name``: written in place when the shape and dtype are the bound
        ones (a decode step's four inputs: no binding call per step, measured 0.1 ms of a step's Python after the
        weights went through the caches), else a new buffer bound. The very array given last time is taken as
        unchanged (callers hand a request's fixed inputs as one array each and never write to them)."""
        bound = self._inputs.get(name)
        if bound is not None and bound[2] is value:  # the very array bound before (a request's cross states)
            return
        if bound is not None and bound[0].shape == value.shape and bound[0].dtype == value.dtype:
            np.copyto(bound[0], value)
            self._inputs[name] = (bound[0], bound[1], value)
            return
        import onnxruntime as ort

        buffer = np.array(value, copy=True, order="C")
        self._inputs[name] = (buffer, ort.OrtValue.ortvalue_from_numpy(buffer), value)
        self.binding.bind_ortvalue_input(name, self._inputs[name][1])


class RowsOfTwoCaches:
    """A two-graph feed's cache: in a bound runner's buffers on ONNX Runtime (``runner``), else the tensors it copies
    through each step (``cache``); :meth:`reorder` moves its rows (beam search) either way."""

    runner: OrtBoundRunner | None
    cache: list[torch.Tensor]
    #: the positions the cache holds
    length: int

    def reorder(self, rows: torch.Tensor) -> None:
        """Row ``i`` of the cache becomes what row ``rows[i]`` was."""
        if self.runner is not None:
            self.runner.reorder(rows)
        else:
            self.cache = [tensor.index_select(0, rows) for tensor in self.cache]

    def copied_step(self, graph: Any, names: CopiedNames, named: dict[str, torch.Tensor]) -> torch.Tensor:
        """One run of the step ``graph`` (a converted module) on ``named`` (its inputs but the cache and
        ``past_length``) with the cache copied in, the new cache copied out; the logits, as float32."""
        ids = named["input_ids"]
        given = {
            **named,
            "past_length": torch.tensor(self.length, dtype=torch.int64),
            **dict(zip(names.layers, self.cache, strict=True)),
        }
        outputs = graph.executor.run([given[name] for name in names.inputs])
        by_name = dict(zip((o.name for o in graph.io.outputs), outputs, strict=True))
        self.cache = [by_name[name] for name in names.presents]
        self.length += ids.shape[1]
        return by_name["logits"].float()


@dataclass(frozen=True)
class CopiedNames:
    """The names :meth:`RowsOfTwoCaches.copied_step` runs a step by: its inputs in order, its cache inputs and the
    matching outputs."""

    inputs: tuple[str, ...]
    layers: tuple[str, ...]
    presents: tuple[str, ...]


def _named(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    past_length: int,
    extra: dict[str, np.ndarray] | None,
) -> dict[str, np.ndarray]:
    """A step's inputs by name (those given)."""
    named = {"input_ids": input_ids.numpy(), "past_length": np.array(past_length, dtype=np.int64)}
    if attention_mask is not None:
        named["attention_mask"] = attention_mask.numpy()
    if position_ids is not None:
        named["position_ids"] = position_ids.numpy()
    return {**named, **(extra or {})}


def _static_tail(session: Any, name: str) -> tuple[int, ...] | None:
    """The dimensions after the first (the batch) of the float32 output ``name``, when all are static."""
    output = next((o for o in session.get_outputs() if o.name == name), None)
    if output is None or output.type != "tensor(float)" or len(output.shape) < 2:
        return None
    tail = output.shape[1:]
    return tuple(tail) if all(isinstance(d, int) for d in tail) else None


def step_runner(
    executor: Any, layout: CacheLayout, *, bound: bool = True, aliased: bool = True, prompt: Any = None
) -> StepRunner:
    """The runner for ``executor``: device buffers aliased in place on a TensorRT engine, bound ``OrtValue``
    buffers on an ONNX Runtime session (also the one beside a TensorRT-RTX engine that cannot run here), else
    copies. ``prompt``: a recurrent model's prompt graph's executor (of the same backend), which runs the runs of
    several tokens over the same cache."""
    engine = getattr(executor, "engine_runner", None)
    prompt_engine = getattr(prompt, "engine_runner", None)
    if bound and engine is not None and (prompt is None or prompt_engine is not None):
        from pipeline.runtime.generation.trt_cache import TrtCacheRunner

        return TrtCacheRunner(engine, layout, prompt_engine)
    session = _ort_session(executor)
    prompt_session = _ort_session(prompt) if prompt is not None else None
    if bound and session is not None and (prompt is None or prompt_session is not None):
        ort_executor = getattr(executor, "onnxruntime", executor)
        row_session = getattr(ort_executor, "row_session", None)
        return OrtBoundRunner(session, layout, aliased=aliased, row_session=row_session, prompt_session=prompt_session)
    return CopyingRunner(executor, layout, prompt)


def bound_runner(executor: Any, layout: CacheLayout, prompt: Any = None) -> OrtBoundRunner | None:
    """The in-place runner on ``executor``'s ONNX Runtime session (also the one beside a TensorRT-RTX engine that
    cannot run here), None for any other executor (a TensorRT engine, or one without a session): the two-graph
    modules (encoder-decoder, vision-language) then copy their cache through ``executor.run``. ``prompt``: a
    recurrent text model's prompt graph's executor, whose session runs the runs of several tokens."""
    session = _ort_session(executor)
    prompt_session = _ort_session(prompt) if prompt is not None else None
    if session is None or (prompt is not None and prompt_session is None):
        return None
    return OrtBoundRunner(session, layout, prompt_session=prompt_session)


def _ort_session(executor: Any) -> Any:
    """The ONNX Runtime session that runs ``executor``'s steps with ``IOBinding`` (its own, or the one beside a
    TensorRT-RTX engine that cannot run here), None for a runnable TensorRT engine or an executor without one."""
    if getattr(executor, "engine_runner", None) is not None:
        return None
    session = getattr(getattr(executor, "onnxruntime", executor), "session", None)
    return session if session is not None and hasattr(session, "io_binding") else None
