"""A real Triton Inference Server process over a model repository: found, started, watched and stopped.

The server is the ``tritonserver`` that ``nvidia-pytriton`` ships (the ``serve`` extra), with its Python backend.
Two facts of that wheel shape the start (measured; ``shared/reference/SERVING.md``):

- The backend's stub (one per CPython minor version) links ``libpython3.X.so.1.0`` by name. The system's copy can be
  another patch release than the interpreter whose standard library the stub then imports, which fails inside
  ``multiprocessing``. The server starts with this interpreter's own library directory first on
  ``LD_LIBRARY_PATH``.
- The stub is compiled against NumPy 1's C structures: its ``Tensor(name, ndarray)`` and ``as_numpy()`` misread
  NumPy 2 arrays (wrong sizes). The served models pass every tensor through DLPack instead, which works with both.

No ONNX Runtime or TensorRT backend is in the wheel: ``pipeline serve`` runs each artifact in the Python backend
through :func:`pipeline.load`; a GPU Triton loads the repository of ``pipeline export-triton`` instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from converters.errors import ServingError

logger = logging.getLogger(__name__)

# "failed to load 'NAME' version 1: Internal: ArtifactError: ...\n\nAt:\n  traceback" in the server's log
_FAILED_LOAD = re.compile(r"failed to load '([^']+)' version \d+: (.*?)\"?$", re.M)


def _reason(logged: str) -> str:
    """A logged load failure without Triton's status prefix and the Python traceback, newlines restored."""
    text = logged.replace("\\n", "\n").split("\n\nAt:")[0]
    return re.sub(r"^(Internal|Invalid argument|Unavailable): ", "", text).strip()


INSTALL_FIX = "pip install 'torch-trt-pipeline[serve]' (nvidia-pytriton ships the server, tritonclient the client)"


@dataclass(frozen=True)
class TritonInstall:
    """Where the server binary, its Python backend and this interpreter's backend stub are."""

    server: Path
    python_backend: Path
    stub: Path

    @property
    def library_path(self) -> str:
        """``LD_LIBRARY_PATH`` for the server: this interpreter's ``libpython`` first (see the module docstring)."""
        parts = [str(sysconfig.get_config_var("LIBDIR") or "")]
        parts += [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
        return os.pathsep.join(p for p in parts if p)


def find_triton() -> TritonInstall:
    """The Triton server of the installed ``nvidia-pytriton``, or a ``ServingError`` naming what is missing."""
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServingError("the Triton Inference Server is not installed", fix=INSTALL_FIX)
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    server = root / "bin" / "tritonserver"
    backend = root / "backends" / "python"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not server.is_file() or not (backend / "libtriton_python.so").is_file():
        raise ServingError(
            f"nvidia-pytriton at {root.parent} has no tritonserver binary or Python backend", fix=INSTALL_FIX
        )
    if not stub.is_file():
        have = sorted(p.name for p in (root / "python_backend_stubs").glob("*") if p.is_dir())
        raise ServingError(
            f"Triton's Python backend has no stub for Python {version} (it has {', '.join(have) or 'none'})",
            fix="serve from an environment of one of those Python versions",
        )
    return TritonInstall(server, backend, stub)


def backend_directory(install: TritonInstall, workdir: Path) -> Path:
    """A backend directory holding the Python backend with this interpreter's stub (as the server expects it)."""
    target = workdir / "backends" / "python"
    target.mkdir(parents=True, exist_ok=True)
    for source in (*install.python_backend.iterdir(), install.stub):
        link = target / source.name
        if source.name != "__pycache__" and not link.exists():
            link.symlink_to(source)
    return workdir / "backends"


def free_port() -> int:
    """A TCP port nothing listens on now (for tests and ``port=0``)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports nothing listens on now: the probes stay bound until all are chosen, so the system
    cannot hand one port out twice (two ``free_port()`` calls once gave Triton's gRPC and metrics endpoints the same
    port, and the server refused to start)."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]


class TritonServer:
    """A running ``tritonserver`` over ``repository``: a context manager that stops it (SIGTERM, then SIGKILL).

    ``http_port``/``grpc_port``/``metrics_port`` of 0 take free ports. :meth:`start` returns when every model is
    ready, or raises a ``ServingError`` with the server's reasons (a model that failed to load, a port in use).
    With ``exit_on_error=False`` it returns once the server is live, whatever failed to load (:meth:`models` says).
    """

    def __init__(
        self,
        repository: Path,
        *,
        http_port: int = 8000,
        grpc_port: int = 8001,
        metrics_port: int = 8002,
        startup_timeout: float = 300.0,
        exit_timeout: int = 30,
        environment: dict[str, str] | None = None,
        workdir: Path | None = None,
        exit_on_error: bool = True,
    ) -> None:
        self.repository = Path(repository)
        given = (http_port, grpc_port, metrics_port)
        fresh = iter(port for port in free_ports(6) if port not in given)  # distinct, and none of the given ones
        self.http_port, self.grpc_port, self.metrics_port = (port or next(fresh) for port in given)
        self.startup_timeout = startup_timeout
        self.exit_timeout = exit_timeout
        self.environment = dict(environment or {})
        # False: the server starts and stays up whatever models fail to load (their states and reasons are in
        # models()); start() then waits for liveness instead of readiness
        self.exit_on_error = exit_on_error
        self._scratch = tempfile.TemporaryDirectory(prefix="pipeline-triton-") if workdir is None else None
        self.workdir = Path(self._scratch.name) if self._scratch else Path(workdir)  # type: ignore[arg-type]
        self.log_path = self.workdir / "tritonserver.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def http_url(self) -> str:
        """``localhost:PORT`` of the HTTP/REST endpoint (what ``tritonclient.http`` takes)."""
        return f"localhost:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``localhost:PORT`` of the gRPC endpoint."""
        return f"localhost:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """The Prometheus metrics page."""
        return f"http://localhost:{self.metrics_port}/metrics"

    def command(self, install: TritonInstall) -> list[str]:
        """The server's command line."""
        return [
            str(install.server),
            f"--model-repository={self.repository}",
            f"--backend-directory={backend_directory(install, self.workdir)}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--strict-readiness=true",
            f"--exit-on-error={'true' if self.exit_on_error else 'false'}",
            f"--exit-timeout-secs={self.exit_timeout}",
            "--log-verbose=0",
        ]

    def start(self) -> TritonServer:
        """Start the server and wait until it and every model are ready."""
        install = find_triton()
        env = {**os.environ, **self.environment, "LD_LIBRARY_PATH": install.library_path}
        log = open(self.log_path, "wb")  # noqa: SIM115 - the server writes it for its whole life
        try:
            self._process = subprocess.Popen(
                self.command(install), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        except OSError as err:
            raise ServingError(f"could not start {install.server}: {err}", fix=INSTALL_FIX) from err
        finally:
            log.close()
        logger.info("tritonserver pid %d: HTTP %s, gRPC %s", self._process.pid, self.http_url, self.grpc_url)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise ServingError(
                    f"tritonserver exited with code {self._process.returncode} while starting: {self.failure()}",
                    fix=f"the server's whole log: {self._keep_log()}",
                )
            if self._get("/v2/health/ready" if self.exit_on_error else "/v2/health/live") == 200:
                return
            time.sleep(0.25)
        raise ServingError(
            f"tritonserver was not ready after {self.startup_timeout:.0f} s: {self.failure()}",
            fix=f"a large model may need a longer startup_timeout; the server's whole log: {self._keep_log()}",
        )

    def _keep_log(self) -> Path:
        """A copy of the server's log outside the private directory (which goes with the server)."""
        handle, name = tempfile.mkstemp(prefix="pipeline-tritonserver-", suffix=".log")
        with os.fdopen(handle, "wb") as kept, contextlib.suppress(OSError):
            kept.write(self.log_path.read_bytes())
        return Path(name)

    def _get(self, route: str) -> int:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{route}", timeout=2) as reply:
                status: int = reply.status
                return status
        except urllib.error.HTTPError as err:
            return err.code
        except (urllib.error.URLError, OSError):
            return 0

    def models(self) -> list[dict[str, Any]]:
        """The repository index: each model's name, version, state and (when it failed) reason."""
        request = urllib.request.Request(f"http://{self.http_url}/v2/repository/index", data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=10) as reply:
            index: list[dict[str, Any]] = json.loads(reply.read())
            return index

    def failure(self) -> str:
        """What the server said went wrong: each model that failed to load with its reason, else its error lines
        (or the log's tail)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "no log"
        failed = {name: _reason(reason) for name, reason in _FAILED_LOAD.findall(text)}
        if failed:
            return "; ".join(f"model {name!r} failed to load: {reason}" for name, reason in failed.items())
        lines = text.splitlines()
        errors = [line for line in lines if line.startswith("E") or "Error" in line]
        relevant = [e for e in errors if not any(word in e for word in ("NVML", "DCGM", "CUDA"))]
        return " | ".join((relevant or lines)[-6:]) or "no output"

    @property
    def running(self) -> bool:
        """The server process is alive."""
        return self._process is not None and self._process.poll() is None

    def stop(self) -> int | None:
        """Stop gracefully (SIGTERM: in-flight requests finish, up to ``exit_timeout``), else kill; the exit code."""
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=self.exit_timeout + 10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        return process.returncode

    def wait(self) -> int:
        """Block until the server exits (``pipeline serve`` in the foreground); its exit code."""
        assert self._process is not None, "start() the server first"
        return self._process.wait()

    def __enter__(self) -> TritonServer:
        if self._process is None:
            self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
        if self._scratch is not None:
            self._scratch.cleanup()
