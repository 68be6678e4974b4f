"""The one lifecycle of the test bed's subprocesses (tritonserver, Prometheus, the dev cluster's components).

A :class:`Process` is started with :meth:`Process.start`:

* in its own session, so it leads its own process group: a stop reaches the children it forks (Triton's
  Python-backend stubs) and nothing else, and a terminal's Ctrl-C is not delivered to it;
* with stdin from ``/dev/null`` and stdout and stderr appended to a log file, which :meth:`Process.log_tail`
  and :func:`tail_errors` read for failure messages;
* optionally with ``die_with_parent``: Linux ``PR_SET_PDEATHSIG`` sends it SIGTERM when the thread that started
  it exits, so a test session that dies without its teardown does not leave it behind.

A process is known by its PID, its start time (``/proc/<pid>/stat`` field 22) and its ``argv[0]``
(:meth:`Process.record`), so one recorded in a file by an earlier command (``batchfill dev-cluster up``, then
``down``) is signalled only while it is still that process, never a process that got its PID later.

Waiting is :func:`wait_until` (poll a readiness check, fail as soon as a watched process exits) and stopping is
:func:`stop_all` (SIGTERM, a grace period, SIGKILL to the process group, then the group's leftovers).
:func:`free_port` and :func:`free_ports` pick loopback ports for the servers.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

LOOPBACK = "127.0.0.1"
#: What tritonserver and Prometheus log when a port picked by :func:`free_ports` was taken before they bound it.
PORT_IN_USE = "already in use"
_POLL_S = 0.05
_PR_SET_PDEATHSIG = 1  # linux/prctl.h

T = TypeVar("T")


class ProcessError(RuntimeError):
    """A process exited before it was ready, did not become ready in time, or survived SIGKILL."""


class ProcessExitedError(ProcessError):
    """A watched process exited while :func:`wait_until` waited; ``process`` says which."""

    def __init__(self, process: Process) -> None:
        super().__init__(f"{process.name} exited with code {process.returncode}")
        self.process = process


class ReadinessTimeoutError(ProcessError):
    """:func:`wait_until`'s check did not hold within ``timeout_s`` seconds."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"not ready after {timeout_s:.0f} s")
        self.timeout_s = timeout_s


# Children started by this interpreter, by (PID, start time, argv[0]): only Popen.poll() may judge and reap them
# (Process.exited).
_children: dict[tuple[int, int, str], subprocess.Popen[bytes]] = {}


def proc_stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (index 0 = state, 2 = pgrp, 19 = starttime), or None
    when there is no such process. The command name may hold spaces and parentheses, hence the last ``)``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def process_group_alive(pgid: int) -> bool:
    """Whether a process of process group ``pgid`` still runs (Linux /proc; False elsewhere).

    Zombies do not count: they have exited and only wait for their parent (often PID 1 once their own parent
    has gone) to reap them.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        return False
    for d in proc.iterdir():
        if d.name.isdigit():
            fields = proc_stat(int(d.name))
            if fields is not None and len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                return True
    return False


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """preexec_fn: SIGTERM this child when the thread that started it exits (Linux PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(eq=False)
class Process:
    """One subprocess in its own process group (module docstring); started here or read back from a record.

    Attributes:
        pid: its PID, which is also its process group ID.
        start_ticks: its start time in clock ticks since boot (``/proc/<pid>/stat`` field 22).
        exe: its ``argv[0]``, compared with ``/proc/<pid>/cmdline``.
        name: what messages call it (``tritonserver``, ``etcd``).
        log_path: the file its output goes to (None: unknown).
    """

    pid: int
    start_ticks: int
    exe: str
    name: str = ""
    log_path: Path | None = None
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        log_path: Path,
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        die_with_parent: bool = False,
        preexec: Callable[[], None] | None = None,
    ) -> Process:
        """Start ``argv`` (module docstring), appending its output to ``log_path`` (its directory is created).

        ``preexec``: called in the child just before ``exec`` (e.g. to enter a network namespace), so the
        recorded ``argv[0]`` is the program itself rather than a wrapper such as ``nsenter``.
        """
        log_path.parent.mkdir(parents=True, exist_ok=True)
        pdeath = die_with_parent and sys.platform == "linux"

        def child_setup() -> None:  # pragma: no cover - runs in the child between fork and exec
            if pdeath:
                _die_with_parent()
            if preexec is not None:
                preexec()

        with open(log_path, "ab") as out:  # the child keeps its own descriptor
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=None if env is None else dict(env),
                cwd=None if cwd is None else str(cwd),
                start_new_session=True,
                preexec_fn=child_setup if pdeath or preexec is not None else None,
            )
        fields = proc_stat(popen.pid)
        ticks = int(fields[19]) if fields else 0
        exe = str(argv[0])
        _children[(popen.pid, ticks, exe)] = popen
        return cls(popen.pid, ticks, exe, name or Path(exe).name, log_path, popen)

    @classmethod
    def from_record(cls, record: Mapping[str, Any], *, name: str = "", log_path: Path | None = None) -> Process:
        """The process of a :meth:`record`; still our child if this interpreter started it."""
        pid, ticks, exe = int(record["pid"]), int(record["start_ticks"]), str(record["exe"])
        return cls(pid, ticks, exe, name or Path(exe).name, log_path, _children.get((pid, ticks, exe)))

    def record(self) -> dict[str, Any]:
        """What :meth:`from_record` needs (JSON-ready): ``pid``, ``start_ticks``, ``exe``."""
        return {"pid": self.pid, "start_ticks": self.start_ticks, "exe": self.exe}

    @property
    def popen(self) -> subprocess.Popen[bytes] | None:
        """The ``Popen`` of a child of this interpreter (None for a process of an earlier run)."""
        return self._popen

    @property
    def returncode(self) -> int | None:
        """Exit code of a child that has exited (negative: killed by that signal); None otherwise."""
        return None if self._popen is None else self._popen.poll()

    def alive(self) -> bool:
        """Still running, and still this process (for a process of an earlier run: same start time and argv[0])."""
        if self._popen is not None:
            return not self.exited()
        fields = proc_stat(self.pid)
        if fields is None or fields[0] in ("Z", "X") or int(fields[19]) != self.start_ticks:
            return False
        try:
            argv0 = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            return False
        return argv0 == self.exe

    def exited(self) -> bool:
        """Exited, and for a child also reaped, so ``/proc/<pid>`` is gone when this says so.

        A child is judged by ``Popen.poll()`` only: after SIGKILL a multi-threaded Go process shows state ``Z``
        while its other threads are still exiting, and cannot be reaped until they have. (Its PID cannot be
        reused before it is reaped, so the /proc identity check is only needed for processes of an earlier run.)
        """
        if self._popen is None:
            return not self.alive()
        if self._popen.poll() is None:
            return False
        _children.pop((self.pid, self.start_ticks, self.exe), None)
        return True

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the process alone, if it is still this process."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL its process group, if it is still this process and still leads its group."""
        if self.exited():
            return
        fields = proc_stat(self.pid)
        if fields is not None and int(fields[2]) == self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)

    def stop(self, grace_s: float = 10.0, *, reap_s: float = 0.0, kill_wait_s: float = 10.0) -> int | None:
        """:func:`stop_all` of this one process; returns :attr:`returncode`. Raises :class:`ProcessError` when
        it survives SIGKILL."""
        if stop_all([self], grace_s, reap_s=reap_s, kill_wait_s=kill_wait_s):
            raise ProcessError(f"{self.name} (pid {self.pid}) survived SIGKILL")
        return self.returncode

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of :attr:`log_path` (empty if there is none)."""
        return "" if self.log_path is None else tail(self.log_path, lines)

    def wait_ready(
        self, check: Callable[[], bool], timeout_s: float, *, where: str = "", interval_s: float = 0.1
    ) -> float:
        """:func:`wait_until` ``check`` holds, watching this process. Returns the seconds waited.

        Raises :class:`ProcessError` naming the process, its exit code or PID, ``where`` it was to be ready (an
        address) and its log.
        """
        on = f" on {where}" if where else ""
        try:
            return wait_until(check, timeout_s, watch=[self], interval_s=interval_s)
        except ProcessExitedError:
            raise ProcessError(
                f"{self.name} exited with code {self.returncode} before it was ready; log {self.log_path}"
            ) from None
        except ReadinessTimeoutError:
            raise ProcessError(
                f"{self.name} (pid {self.pid}) not ready after {timeout_s:.0f} s{on}; log {self.log_path}"
            ) from None


class LocalServer:
    """What a server run as a :class:`Process` (tritonserver, Prometheus) shares: its PID, whether it runs, and
    being a context manager that stops it by its PID on leaving, and as a last resort when it is collected.

    Subclasses set ``_process`` in ``start`` and implement ``start`` and ``stop``; ``close`` (what leaving the
    ``with`` block and a failed ``__enter__`` call) is ``stop`` unless they add to it.
    """

    _process: Process | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def is_running(self) -> bool:
        return self._process is not None and not self._process.exited()

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> int | None:
        raise NotImplementedError

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:  # last resort; normal code uses the context manager
        with contextlib.suppress(Exception):
            if self.is_running():
                self.stop()


def wait_until(
    check: Callable[[], bool], timeout_s: float, *, watch: Iterable[Process] = (), interval_s: float = 0.25
) -> float:
    """Call ``check`` every ``interval_s`` seconds until it returns true (an exception counts as not yet).

    Returns the seconds waited. Raises :class:`ProcessExitedError` as soon as a process of ``watch`` has exited
    (checked before each call), :class:`ReadinessTimeoutError` after ``timeout_s`` seconds.
    """
    watched = list(watch)
    t0 = time.monotonic()
    while True:
        for p in watched:
            if p.exited():
                raise ProcessExitedError(p)
        with contextlib.suppress(Exception):
            if check():
                return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise ReadinessTimeoutError(timeout_s)
        time.sleep(interval_s)


def _wait_exited(processes: Sequence[Process], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exited() for p in processes) and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def stop_all(
    processes: Iterable[Process], grace_s: float = 10.0, *, reap_s: float = 0.0, kill_wait_s: float = 10.0
) -> list[Process]:
    """Stop ``processes`` together; returns those that survived SIGKILL (normally none).

    SIGTERM to each live one, up to ``grace_s`` seconds for all to exit, SIGKILL to the process group of each
    that did not, up to ``kill_wait_s`` seconds for those. Then, for the children of this interpreter, up to
    ``reap_s`` seconds for members of their process groups that outlive them (Triton's Python-backend stubs)
    before SIGKILL to whatever is left, and up to ``kill_wait_s`` seconds for that to take effect.
    """
    given = list(processes)
    live = [p for p in given if p.alive()]
    for p in live:
        p.send_signal(signal.SIGTERM)
    _wait_exited(live, grace_s)
    for p in live:
        p.kill()
    _wait_exited(live, kill_wait_s)
    groups = [p.pid for p in given if p.popen is not None and p.exited()]
    deadline = time.monotonic() + reap_s
    while any(process_group_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [g for g in groups if process_group_alive(g)]
    for g in left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(g, signal.SIGKILL)
    deadline = time.monotonic() + kill_wait_s
    while any(process_group_alive(g) for g in left) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    return [p for p in live if not p.exited()]


def kill_all(processes: Iterable[Process], wait_s: float = 10.0) -> list[Process]:
    """SIGKILL the process group of each (a crash, not a stop); returns those still there after ``wait_s``."""
    given = list(processes)
    for p in given:
        p.kill()
    _wait_exited(given, wait_s)
    return [p for p in given if not p.exited()]


def start_with_port_retries(
    start: Callable[[], T], *, attempts: int, stop: Callable[[], object], log_tail: Callable[[int], str]
) -> T:
    """``start()`` (pick free ports, start a server, wait until it is ready), again while a failure was a port taken.

    :func:`free_ports` only says a port was free when it was picked; another process may bind it before the
    server does. When ``start`` raises and the server's log (``log_tail(40)``) says a port was
    :data:`PORT_IN_USE`, ``stop()`` is called and ``start`` tried again, up to ``attempts`` calls in all; any
    other failure, or the last one, is raised after ``stop()``.
    """
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except Exception:
            retry = attempt < attempts and PORT_IN_USE in log_tail(40)
            stop()
            if not retry:
                raise
    raise ValueError(f"attempts must be >= 1, got {attempts}")


def tail(path: Path, lines: int = 20, max_bytes: int = 64 * 1024) -> str:
    """The last ``lines`` lines of the last ``max_bytes`` bytes of ``path`` (empty if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def tail_errors(path: Path, is_error: Callable[[str], bool], max_lines: int = 20) -> list[str]:
    """The last ``max_lines`` lines of ``path``'s last 64 KiB for which ``is_error`` holds."""
    return [line for line in tail(path, 100_000).splitlines() if is_error(line)][-max_lines:]


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """``n`` distinct TCP ports that are free on ``host`` right now (all held bound at once while picked)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
