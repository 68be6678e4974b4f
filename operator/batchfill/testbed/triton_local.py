"""Run a real ``tritonserver`` as a local subprocess (component tests, demo, ``batchfill profile``).

The server comes from the ``nvidia-pytriton`` wheel, which ships tritonserver 2.51 with the Python backend and
one Python-backend stub per CPython version. Two things make it work outside a container:

* the Python backend expects ``triton_python_backend_stub`` next to ``libtriton_python.so``; the wheel keeps
  them apart, so :func:`prepare_backend_dir` assembles a backend directory in a cache directory outside the
  repository (``$XDG_CACHE_HOME/batchfill`` or ``~/.cache/batchfill``) and reuses it when it is complete;
* the stub embeds CPython and finds the interpreter's ``site-packages`` through the ``python3`` on ``PATH``
  (``PYTHONPATH`` alone is not enough), so the directory of the running interpreter goes first on ``PATH``;
  the copied binaries lose their ``$ORIGIN`` rpath, so ``nvidia_pytriton.libs`` goes on ``LD_LIBRARY_PATH``.

Every socket binds to loopback. :class:`LocalTriton` is a context manager that starts the server, waits for
``/v2/health/ready`` and stops it by its own PID (SIGTERM, then SIGKILL of its process group after a grace
period; the lifecycle of :mod:`batchfill.testbed.process`), so no test ever needs to kill processes by name.

A server that cannot have its addresses fails its start, naming the address: fixed ports are checked to be
free before the server starts, and it counts as started only once every listener on its three addresses is
its own (``/proc/net/tcp``, :mod:`batchfill.testbed.listeners`). Without that, a server on a taken HTTP port
looks ready (another server answers ``/v2/health/ready`` there) and one on a taken metrics port looks ready
for the moment before it exits: tritonserver starts gRPC, HTTP and then metrics, and exits when one fails.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
import socket
import sys
import tempfile
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchfill.testbed.listeners import listener_verdict
from batchfill.testbed.process import (
    LOOPBACK,
    LocalServer,
    Process,
    ProcessError,
    free_ports,
    start_with_port_retries,
    tail,
    tail_errors,
)

#: Seconds :meth:`LocalTriton.stop` waits for the server to exit after SIGKILL (``Process.stop``), and for its
#: Python-backend stubs to follow it; with ``stop_grace_s`` they bound how long a stop takes.
KILL_WAIT_S = 10.0
STUB_REAP_S = 5.0
# A Triton log line of severity E: "E1129 12:53:21.892942 15207 file.cc:1460] ..."
_ERROR_LINE = re.compile(r"^E\d{4} ")
_PORT_NAMES = ("HTTP", "gRPC", "metrics")
#: How long after /v2/health/ready the server may take to listen on all three addresses (it starts metrics last).
_LISTEN_TIMEOUT_S = 15.0


def _is_error_line(line: str) -> bool:
    """A Triton error (severity E), a protobuf parser ERROR, or an ``error:`` line of the server's own."""
    return bool(_ERROR_LINE.match(line)) or "ERROR" in line or line.startswith("error:")


class TritonNotInstalledError(RuntimeError):
    """The nvidia-pytriton wheel (or a part of it this module needs) is not installed."""


class TritonStartError(RuntimeError):
    """tritonserver exited or did not become ready in time; the message ends with the server log's tail."""


@dataclass(frozen=True)
class TritonInstallation:
    """Where the pieces of the tritonserver shipped in the nvidia-pytriton wheel are."""

    binary: Path
    python_backend: Path  # directory holding libtriton_python.so and triton_python_backend_utils.py
    stub: Path  # triton_python_backend_stub for the running interpreter's CPython version
    libs: Path  # the wheel's bundled shared libraries (nvidia_pytriton.libs)
    python_bin_dir: Path  # directory whose python3 the stub's embedded interpreter should find

    def version_key(self) -> str:
        """A short key that changes when the wheel's backend files change (for the backend-dir cache)."""
        h = hashlib.sha256()
        for p in (self.python_backend / "libtriton_python.so", self.stub):
            st = p.stat()
            h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}".encode())
        return h.hexdigest()[:16]


def find_installation() -> TritonInstallation:
    """Locate tritonserver, the Python backend and the matching stub inside the installed pytriton package."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonNotInstalledError("nvidia-pytriton is not installed (pip install nvidia-pytriton)")
    pkg = Path(next(iter(spec.submodule_search_locations)))
    server = pkg / "tritonserver"
    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    inst = TritonInstallation(
        binary=server / "bin" / "tritonserver",
        python_backend=server / "backends" / "python",
        stub=server / "python_backend_stubs" / pyver / "triton_python_backend_stub",
        libs=pkg.parent / "nvidia_pytriton.libs",
        python_bin_dir=_python_bin_dir(),
    )
    for p in (inst.binary, inst.python_backend / "libtriton_python.so", inst.stub, inst.libs):
        if not p.exists():
            raise TritonNotInstalledError(f"nvidia-pytriton is installed at {pkg} but {p} is missing")
    return inst


def _python_bin_dir() -> Path:
    """The directory of the running interpreter; it must contain a ``python3`` for the stub to find."""
    d = Path(sys.executable).parent
    if not (d / "python3").exists():
        raise TritonNotInstalledError(
            f"{d} has no python3; the Python-backend stub finds site-packages through the python3 on PATH"
        )
    return d


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/batchfill``, else ``~/.cache/batchfill``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "batchfill"


def prepare_backend_dir(installation: TritonInstallation | None = None, cache_dir: Path | None = None) -> Path:
    """A ``--backend-directory`` whose ``python/`` holds the Python backend and the stub; built once, reused.

    The directory is assembled under a temporary name and renamed into place, so concurrent callers never see
    a half-copied backend.
    """
    inst = installation or find_installation()
    root = (cache_dir or default_cache_dir()) / "triton-backends" / inst.version_key()
    py = root / "python"
    needed = [py / "libtriton_python.so", py / "triton_python_backend_utils.py", py / inst.stub.name]
    if all(p.exists() for p in needed):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root.parent))
    try:
        (tmp / "python").mkdir()
        for f in inst.python_backend.iterdir():
            if f.is_file():
                shutil.copy2(f, tmp / "python" / f.name)
        shutil.copy2(inst.stub, tmp / "python" / inst.stub.name)
        os.chmod(tmp / "python" / inst.stub.name, 0o755)
        try:
            tmp.rename(root)
        except OSError:
            # Someone else finished first (or a stale incomplete dir exists): replace an incomplete one.
            if not all(p.exists() for p in needed):
                shutil.rmtree(root, ignore_errors=True)
                tmp.rename(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def server_env(installation: TritonInstallation, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment tritonserver and its Python-backend stubs need (see the module docstring)."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join(p for p in (str(installation.python_bin_dir), env.get("PATH", "")) if p)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(installation.libs), env.get("LD_LIBRARY_PATH", "")) if p)
    env.pop("PYTHONHOME", None)
    return env


class LocalTriton(LocalServer):
    """A tritonserver subprocess on loopback; use as a context manager.

    >>> with LocalTriton("/path/to/model_repository") as triton:   # doctest: +SKIP
    ...     client = triton.http_client()
    ...     client.is_model_ready("sleep_model")

    Args:
        model_repository: directory holding ``<model>/config.pbtxt`` and ``<model>/<version>/...``.
        http_port, grpc_port, metrics_port: fixed ports; by default free loopback ports are picked (and
            picked again, up to 3 times, if one was taken before the server bound it). A fixed port that is
            in use on ``host`` fails :meth:`start` at once.
        host: the loopback address to bind (``127.0.0.1``; each dev cluster gives its kwok pods addresses in a
            loopback block of its own, ``ClusterInfo.pod_block``, so a server can listen on its pod's IP with
            Triton's standard ports).
        model_control_mode: ``none`` (load everything at start), ``explicit`` (load through the
            repository API, e.g. ``http_client().load_model(name)``) or ``poll``.
        load_models: ``--load-model`` names for ``explicit`` mode.
        strict_readiness: ready only when every model is ready (Triton's default).
        extra_args: further tritonserver arguments (e.g. ``--trace-config=...``).
        log_path: where the server's stdout/stderr go. By default a temporary directory, removed by
            :meth:`stop` after a run that became ready and exited cleanly (unless ``keep_log``); kept
            otherwise, and named in every error.
        log_verbose: tritonserver ``--log-verbose`` level.
        startup_timeout_s: how long :meth:`start` waits for ``/v2/health/ready``.
        stop_grace_s: how long :meth:`stop` waits after SIGTERM before SIGKILL.
        installation, cache_dir: override where tritonserver and the backend directory come from.

    The server always runs with ``--metrics-config=summary_latencies=true`` (for the p99 summary),
    ``--allow-gpu-metrics=false`` and ``--exit-timeout-secs=5``.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str],
        *,
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        host: str = LOOPBACK,
        model_control_mode: str = "none",
        load_models: Sequence[str] = (),
        strict_readiness: bool = True,
        extra_args: Sequence[str] = (),
        log_path: str | os.PathLike[str] | None = None,
        log_verbose: int = 0,
        keep_log: bool = False,
        startup_timeout_s: float = 120.0,
        stop_grace_s: float = 10.0,
        installation: TritonInstallation | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        self.model_repository = Path(model_repository).resolve()
        self._fixed_ports = (http_port, grpc_port, metrics_port)
        if not host.startswith("127."):
            raise ValueError(
                f"host {host!r} must be a loopback address (127.0.0.0/8): servers never leave this machine"
            )
        self.host = host
        self.model_control_mode = model_control_mode
        self.load_models = list(load_models)
        self.strict_readiness = strict_readiness
        self.extra_args = list(extra_args)
        self.log_verbose = log_verbose
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self._installation = installation
        self._cache_dir = cache_dir
        self._own_log_dir: Path | None = None
        self.keep_log = keep_log
        self._was_ready = False
        self.log_path: Path | None = Path(log_path) if log_path is not None else None
        self.http_port = self.grpc_port = self.metrics_port = 0
        self._process: Process | None = None

    # -- addresses --------------------------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        """``host:port`` as tritonclient.http takes it."""
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` as tritonclient.grpc takes it."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus metrics endpoint."""
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def http_client(self, **kwargs: Any) -> Any:
        """A new ``tritonclient.http.InferenceServerClient`` for this server."""
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(self.http_url, **kwargs)

    def grpc_client(self, **kwargs: Any) -> Any:
        """A new ``tritonclient.grpc.InferenceServerClient`` for this server."""
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(self.grpc_url, **kwargs)

    def metrics_text(self, timeout_s: float = 5.0) -> str:
        """The current Prometheus exposition text from the metrics endpoint."""
        import urllib.request

        with urllib.request.urlopen(self.metrics_url, timeout=timeout_s) as r:
            return str(r.read().decode())

    # -- lifecycle --------------------------------------------------------------------------------------
    def command(self) -> list[str]:
        """The tritonserver command line (ports must be assigned)."""
        inst = self._installation or find_installation()
        backend_dir = prepare_backend_dir(inst, self._cache_dir)
        cmd = [
            str(inst.binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backend_dir}",
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--metrics-config=summary_latencies=true",
            f"--model-control-mode={self.model_control_mode}",
            f"--strict-readiness={'true' if self.strict_readiness else 'false'}",
            "--exit-timeout-secs=5",
            f"--log-verbose={self.log_verbose}",
        ]
        cmd += [f"--load-model={m}" for m in self.load_models]
        cmd += self.extra_args
        return cmd

    def start(self) -> LocalTriton:
        """Start the server on free ports (or the fixed ones) and wait for ``/v2/health/ready``.

        Raises :class:`TritonStartError` (with the log's error lines and tail) when it exits or is not ready in
        ``startup_timeout_s``, and naming the address when a fixed port is in use on :attr:`host` or another
        process listens on one of the server's addresses; a port picked here and taken between its pick and the
        server's bind is picked again (3 tries).
        """
        if self._process is not None:
            raise RuntimeError("tritonserver is already running")
        self._check_fixed_ports_free()
        inst = self._installation = self._installation or find_installation()
        if not self.model_repository.is_dir():
            raise TritonStartError(f"model repository {self.model_repository} is not a directory")
        attempts = 1 if any(self._fixed_ports) else 3
        return start_with_port_retries(
            lambda: self._start_once(inst), attempts=attempts, stop=self.stop, log_tail=self.log_tail
        )

    def _start_once(self, inst: TritonInstallation) -> LocalTriton:
        self.http_port, self.grpc_port, self.metrics_port = (
            fixed or auto for fixed, auto in zip(self._fixed_ports, free_ports(3), strict=True)
        )
        if self.log_path is None or self._own_log_dir is not None:
            if self._own_log_dir is None:
                self._own_log_dir = Path(tempfile.mkdtemp(prefix="batchfill-triton-"))
            self.log_path = self._own_log_dir / f"tritonserver-{self.http_port}.log"
        self._process = Process.start(
            self.command(), self.log_path, name="tritonserver", env=server_env(inst), cwd=self.model_repository
        )
        self.wait_ready(self.startup_timeout_s)
        self._wait_listening_alone(_LISTEN_TIMEOUT_S)
        self._was_ready = True
        return self

    def _ports(self) -> list[tuple[str, int]]:
        return list(zip(_PORT_NAMES, (self.http_port, self.grpc_port, self.metrics_port), strict=True))

    def _check_fixed_ports_free(self) -> None:
        """Raise :class:`TritonStartError` naming ``host:port`` when a fixed port cannot be bound on :attr:`host`."""
        for name, port in zip(_PORT_NAMES, self._fixed_ports, strict=True):
            if not port:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                # As tritonserver binds: a port whose last connections are in TIME_WAIT is free; a listener is not.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((self.host, port))
                except OSError as e:
                    raise TritonStartError(
                        f"{self.host}:{port} ({name}) is already in use ({e.strerror}): another server listens "
                        f"there, so tritonserver could not bind it; not starting it"
                    ) from None

    def _listener_verdict(self) -> tuple[bool, list[str]]:
        """(every address has a listener and all are this server's, the addresses another process listens on)."""
        pid = self._process.pid if self._process is not None else -1
        return listener_verdict(pid, self.host, self._ports())

    def _wait_listening_alone(self, timeout_s: float) -> None:
        """Wait until the server listens on its three addresses and nothing else does; raise
        :class:`TritonStartError` naming the address when another process listens on one (that process, not
        this server, would answer clients), or when the server exits meanwhile (e.g. it could not bind one)."""
        foreign: list[str] = []

        def settled() -> bool:
            nonlocal foreign
            alone, foreign = self._listener_verdict()
            return alone or bool(foreign)

        if self._process is None:
            raise TritonStartError("tritonserver is not running")
        try:
            self._process.wait_ready(settled, timeout_s, where=self.http_url, interval_s=0.05)
        except ProcessError as e:
            raise TritonStartError(f"{e}\n{self.diagnostics()}") from None
        if foreign:
            raise TritonStartError(
                f"{', '.join(foreign)} already in use by another process: it, not this tritonserver "
                f"(pid {self._process.pid}), would answer there\n{self.diagnostics()}"
            )

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2.0) as r:
            return int(r.status) == 200

    def wait_ready(self, timeout_s: float) -> None:
        """Block until ``/v2/health/ready`` answers 200; raise :class:`TritonStartError` otherwise."""
        if self._process is None:
            raise TritonStartError("tritonserver is not running")
        try:
            self._process.wait_ready(self._ready, timeout_s, where=self.http_url, interval_s=0.2)
        except ProcessError as e:
            raise TritonStartError(f"{e}\n{self.diagnostics()}") from None

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server log (empty if there is none yet)."""
        return "" if self.log_path is None else tail(self.log_path, lines)

    def log_errors(self, max_lines: int = 20) -> list[str]:
        """The last ``max_lines`` error lines of the server log (Triton's ``E...`` lines, protobuf ERRORs)."""
        return [] if self.log_path is None else tail_errors(self.log_path, _is_error_line, max_lines)

    def diagnostics(self) -> str:
        """What a failure message should show: the server log's error lines, then its last lines."""
        errors = self.log_errors()
        head = ("errors in the log:\n" + "\n".join(errors) + "\n") if errors else ""
        return head + "last lines of the log:\n" + self.log_tail(15)

    def stop(self) -> int | None:
        """SIGTERM, wait ``stop_grace_s``, then SIGKILL the server's process group. Returns the exit code."""
        process, self._process = self._process, None
        # Python-backend stubs normally exit with the server; reap any that did not.
        code = (
            process.stop(self.stop_grace_s, reap_s=STUB_REAP_S, kill_wait_s=KILL_WAIT_S)
            if process is not None
            else None
        )
        if self._own_log_dir is not None and self._was_ready and code == 0 and not self.keep_log:
            # A log we chose the place of, of a run that went well: nobody will read it.
            shutil.rmtree(self._own_log_dir, ignore_errors=True)
            self._own_log_dir = None
            self.log_path = None
        self._was_ready = False
        return code


@contextlib.contextmanager
def local_triton(model_repository: str | os.PathLike[str], **kwargs: Any) -> Iterator[LocalTriton]:
    """Functional form of :class:`LocalTriton`."""
    with LocalTriton(model_repository, **kwargs) as t:
        yield t
