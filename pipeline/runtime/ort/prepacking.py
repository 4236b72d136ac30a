"""An ONNX Runtime session whose weights are prepacked in a background thread, so that a module runs from the moment
it is made or loaded.

Making the prepacked session of the issue-35 Llama step (216 MB of float32 weights) takes 0.3-0.36 s, 0.25 s of it
prepacking the weights; the same graph without prepacking is a session in 0.05 s (it maps a loaded artifact's
weights). :class:`PrepackingSession` holds the second and builds the first in a thread: every call runs on the
unprepacked session until the prepacked one is ready, then on that one (same graph, same inputs and outputs; only
slower before: a 128-token prefill 1.1-1.8x). No call waits for the build.

- Failure: an exception in the build is kept and raised, as a :class:`~converters.errors.BuildError` naming the fix,
  by every later call (never a silent fall back to the unprepacked session).
- Threads: the switch is one attribute written once; a call reads it once and runs on the session it read. A decode
  runner's ``IOBinding`` (:mod:`pipeline.runtime.generation.runners`) is a :class:`_SwitchingBinding`: it records
  what is bound and binds it again on the prepacked session at the first run after the switch (the same
  ``OrtValue`` buffers: the cache carries over).
- Lifetime: the thread is not a daemon. A daemon thread still inside ONNX Runtime when the interpreter exits is torn
  down in a C++ frame (measured: ``terminate called without an active exception``, exit status 134, and a load's
  weights directory removed under the build); a non-daemon one is waited for at exit, which costs at most the rest
  of the build. A module dropped during the build is freed when the build returns.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from converters.errors import BuildError

log = logging.getLogger(__name__)

#: What the error of a failed build tells the user to do.
_FIX = (
    "convert (or save and load) with ort_prepack_weights=False: every call then runs on the unprepacked session; "
    "or check the ONNX Runtime options and the memory available (prepacking copies every weight)"
)


class PrepackingSession:
    """An ONNX Runtime session that runs on ``interim`` (the graph without weight prepacking) until ``build()``,
    called in a background thread, returns the prepacked session, and on that one after (see the module docstring).

    >>> session = PrepackingSession(unprepacked, lambda: make_session(prepack=True))  # doctest: +SKIP
    >>> session.run(None, feed)  # on whichever is ready: never waits for the build  # doctest: +SKIP
    >>> session.wait()  # True once the prepacked session runs every call  # doctest: +SKIP
    """

    def __init__(self, interim: Any, build: Callable[[], Any], *, name: str = "prepacking-session") -> None:
        self._interim: Any = interim
        self._prepacked: Any = None
        self._failure: BaseException | None = None
        #: what the build reads must outlive it (:meth:`hold`): the thread holds this session until the build returns
        self._held: list[Any] = []
        self._done = threading.Event()
        # not a daemon: see the module docstring (interpreter exit during the build)
        self._thread = threading.Thread(target=self._build, args=(build,), name=name, daemon=False)
        self._thread.start()

    def _build(self, build: Callable[[], Any]) -> None:
        try:
            session = build()
        except BaseException as exc:  # noqa: BLE001 - kept, and raised as a BuildError by the next call
            log.warning("ONNX Runtime could not make the prepacked session: %s", exc)
            self._failure = exc
        else:
            self._prepacked = session
            self._interim = None  # calls that read it still hold it; the rest is freed
        finally:
            self._done.set()  # (the thread drops ``build``, and the graph and weights it holds, when this returns)

    def hold(self, value: Any) -> None:
        """Keep ``value`` alive as long as this session, and the build with it: the directory of a module's external
        weights (:class:`~passes.model_io.external_data.WeightFiles`), which a module dropped during the build would
        otherwise remove under it (ONNX Runtime then failed: "External data path does not exist")."""
        self._held.append(value)

    @property
    def ready(self) -> bool:
        """Does every call run on the prepacked session now?"""
        return self._prepacked is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait (up to ``timeout`` seconds) for the build; whether the prepacked session is ready. A failed build is
        raised here too (:class:`~converters.errors.BuildError`)."""
        self._done.wait(timeout)
        if self._failure is not None:
            raise self._error()
        return self.ready

    def current(self) -> Any:
        """The session a call runs on now: the prepacked one once made, the unprepacked one until then; a
        :class:`~converters.errors.BuildError` when the build failed."""
        prepacked = self._prepacked
        if prepacked is not None:
            return prepacked
        if self._failure is not None:
            raise self._error()
        interim = self._interim
        return interim if interim is not None else self._prepacked  # the switch fell between the two reads

    def _error(self) -> BuildError:
        error = BuildError(
            f"ONNX Runtime could not make the prepacked session (built in the background after the unprepacked one "
            f"the first calls ran on): {type(self._failure).__name__}: {self._failure}",
            fix=_FIX,
        )
        error.__cause__ = self._failure
        return error

    def run(self, output_names: Any, input_feed: Any, run_options: Any = None) -> Any:
        """``InferenceSession.run`` on :meth:`current`."""
        return self.current().run(output_names, input_feed, run_options)

    def io_binding(self) -> _SwitchingBinding:
        """An ``IOBinding`` that follows the switch (see the module docstring)."""
        return _SwitchingBinding()

    def run_with_iobinding(self, iobinding: Any, run_options: Any = None) -> None:
        """``InferenceSession.run_with_iobinding`` on :meth:`current`, the binding moved over to it if need be."""
        session = self.current()
        if isinstance(iobinding, _SwitchingBinding):
            iobinding.run_on(session, run_options)
        else:
            session.run_with_iobinding(iobinding, run_options)

    def __getattr__(self, name: str) -> Any:
        # get_inputs, get_outputs, get_session_options...: both sessions run the same graph with the same options
        # (but prepacking)
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.current(), name)


class _SwitchingBinding:
    """An ``IOBinding`` for :class:`PrepackingSession`: each ``bind_*`` call is applied to the real binding of the
    session the last run ran on and recorded (by name, as ONNX Runtime keeps them: a name bound again keeps its
    place), so that a run on the other session binds the same values there first. Used by one caller at a time, as
    an ``IOBinding`` is."""

    _BINDS = {
        "bind_input": "inputs",
        "bind_cpu_input": "inputs",
        "bind_ortvalue_input": "inputs",
        "bind_output": "outputs",
        "bind_ortvalue_output": "outputs",
    }

    def __init__(self) -> None:
        self._session: Any = None
        self._real: Any = None
        self._bound: dict[str, dict[str, tuple[str, tuple[Any, ...], dict[str, Any]]]] = {"inputs": {}, "outputs": {}}

    def __getattr__(self, name: str) -> Any:
        kind = _SwitchingBinding._BINDS.get(name)
        if kind is not None:

            def bind(bound_name: str, *args: Any, **kwargs: Any) -> None:
                self._bound[kind][bound_name] = (name, args, kwargs)
                if self._real is not None:
                    getattr(self._real, name)(bound_name, *args, **kwargs)

            return bind
        if name.startswith("_") or self._real is None:
            raise AttributeError(name)
        return getattr(self._real, name)  # get_outputs, copy_outputs_to_cpu, synchronize_*: of the last run

    def clear_binding_inputs(self) -> None:
        self._bound["inputs"].clear()
        if self._real is not None:
            self._real.clear_binding_inputs()

    def clear_binding_outputs(self) -> None:
        self._bound["outputs"].clear()
        if self._real is not None:
            self._real.clear_binding_outputs()

    def run_on(self, session: Any, run_options: Any) -> None:
        """Run ``session`` on what is bound, in a binding of that session (made and bound anew after a switch)."""
        if session is not self._session:
            real = session.io_binding()
            for kind in ("inputs", "outputs"):
                for bound_name, (method, args, kwargs) in self._bound[kind].items():
                    getattr(real, method)(bound_name, *args, **kwargs)
            self._session, self._real = session, real
        session.run_with_iobinding(self._real, run_options)
