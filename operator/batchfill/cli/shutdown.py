"""Ctrl-C and SIGTERM for a command that starts processes: whatever moment the signal comes at, everything the
command started is stopped, in order, in bounded time.

Three rules make that hold:

* SIGINT and SIGTERM get handlers of their own while a :class:`Shutdown` is active. Python turns SIGINT into
  ``KeyboardInterrupt`` only when the process did not inherit SIGINT as ignored
  (https://docs.python.org/3/library/signal.html#general-rules), and a background job of a non-interactive shell
  (``make test &`` in a script, ``nohup``) inherits it ignored (POSIX, Shell Command Language, "Signals and Error
  Handling": https://pubs.opengroup.org/onlinepubs/9699919799/utilities/V3_chap02.html#tag_18_11). Relying on
  the default, the command would never see the Ctrl-C it documents and would run on. Go's ``signal.Notify``
  takes over an ignored SIGINT in the same way (https://pkg.go.dev/os/signal).
* Only the first signal raises. From then on, and from the end of the run on, the cleanup runs to its end: an
  exception inside a stop step would skip the rest of that step (the SIGKILL after a grace period, the later
  stages of a control plane) and leave processes running. A later signal is only reported, on stderr. If the
  interrupt is swallowed because the handler ran where Python ignores exceptions (an ``os.register_at_fork``
  hook such as logging's while ``subprocess`` forks, a ``__del__``: "Exception ignored in ..."), it reaches
  ``sys.unraisablehook`` (https://docs.python.org/3/library/sys.html#sys.unraisablehook) and is raised again.
* Every step has a timeout, documented by whoever registers it, so the cleanup takes at most their sum, which
  it prints when it starts. A step that fails is reported and the next one still runs. A last step stops any
  child process that no step stopped (one being started at the moment of the signal).

SIGPIPE is ignored meanwhile: with ``batchfill demo | tee log``, Ctrl-C stops ``tee`` too, and the next line
written would kill the process by SIGPIPE in the middle of its cleanup; a failed write is an error instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console

T = TypeVar("T")

#: Seconds the last step gives leftover child processes after SIGTERM, then again after SIGKILL.
CHILD_GRACE_S = 5.0
#: Seconds after which an interrupt that was swallowed is raised again.
REDELIVER_S = 0.05
#: Seconds :func:`run_cancellable` gives its cancelled coroutines to end (requests in flight).
CANCEL_WAIT_S = 5.0
HANDLED = (signal.SIGINT, signal.SIGTERM)
IGNORED = (signal.SIGPIPE,)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as an interrupt so that Ctrl-C's cleanup runs for both."""


@dataclass
class _Step:
    what: str  # completes "could not ..." in a report
    timeout_s: float | Callable[[], float]
    fn: Callable[[], object]

    def timeout(self) -> float:
        return float(self.timeout_s() if callable(self.timeout_s) else self.timeout_s)


def _say(text: str) -> None:
    """Write to stderr at once, even from a signal handler that interrupted a ``Console.print``."""
    with contextlib.suppress(OSError, ValueError):
        os.write(sys.stderr.fileno(), text.encode())


class Shutdown:
    """Signal handling and the ordered cleanup of one run (see the module docstring); a context manager.

    Register cleanup steps while starting things (:meth:`on_exit`, :meth:`enter`); they run in reverse order of
    registration when the ``with`` block ends, by return, exception or signal, with ``announce`` printed first.
    After the block, :attr:`signum` is the first SIGINT/SIGTERM received (None if none) and :attr:`problems`
    says what could not be stopped or removed. The exception that ended the block propagates unchanged.
    """

    def __init__(self, console: Console, announce: str = "stopping what was started") -> None:
        self.console = console
        self.announce = announce
        self.signum: int | None = None
        self.problems: list[str] = []
        self._raised = False  # an interrupt was raised into the run
        self._owed = False  # ... and swallowed: raise it again
        self._cleaning = False  # the cleanup has begun
        self._steps: list[_Step] = []
        self._previous: dict[int, Any] = {}
        self._previous_hook: Callable[[Any], object] = sys.unraisablehook
        self._step_deadline = 0.0  # monotonic end of the running step's timeout
        self._after_step_s = 0.0  # timeouts of the steps after it

    def on_exit(
        self, what: str, timeout_s: float | Callable[[], float], fn: Callable[..., object], *args: Any, **kw: Any
    ) -> None:
        """Run ``fn(*args, **kw)`` on exit; it must end within ``timeout_s`` seconds (a number, or a function
        giving it when the cleanup starts). ``what`` completes "could not ..." if it raises."""
        self._steps.append(_Step(what, timeout_s, lambda: fn(*args, **kw)))

    def enter(self, cm: AbstractContextManager[T], what: str, timeout_s: float) -> T:
        """Enter ``cm`` now and exit it on exit, as a step of at most ``timeout_s``."""
        value = cm.__enter__()
        self.on_exit(what, timeout_s, cm.__exit__, None, None, None)
        return value

    @property
    def interrupted(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> Shutdown:
        self._previous_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        for sig in HANDLED:
            self._previous[sig] = signal.signal(sig, self._handle)
        for sig in IGNORED:
            self._previous[sig] = signal.signal(sig, signal.SIG_IGN)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._cleaning = True
        try:
            self._run()
        finally:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            sys.unraisablehook = self._previous_hook

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        if frame is not None and frame.f_code is _EXIT_CODE:  # at the entry of __exit__: the cleanup has begun
            self._cleaning = True
        redelivered, self._owed = self._owed, False
        if not self._cleaning and (redelivered or not self._raised):
            self._raised = True
            raise Terminated if self.signum == signal.SIGTERM else KeyboardInterrupt
        if redelivered:
            return
        left = max(0.0, self._step_deadline - time.monotonic()) + self._after_step_s
        when = f"at most {left:.0f} s more" if self._cleaning else "once the interrupted step has ended"
        name = signal.Signals(signum).name
        _say(f"\n{name} while stopping: the cleanup goes on so that nothing is left running ({when})\n")

    def _unraisable(self, unraisable: Any) -> None:
        exc = unraisable.exc_value
        if isinstance(exc, KeyboardInterrupt) and self._raised and not self._cleaning and self.signum is not None:
            self._owed = True
            # From another thread, a little later: sent from here, the handler would run (and be swallowed) at
            # once, still inside the code that ignores exceptions.
            again = threading.Timer(REDELIVER_S, signal.pthread_kill, (threading.main_thread().ident or 0, self.signum))
            again.daemon = True
            again.start()
        self._previous_hook(unraisable)

    def _run(self) -> None:
        steps = [*reversed(self._steps), _Step("stop leftover child processes", 2 * CHILD_GRACE_S, self._leftovers)]
        self._steps = []
        prefix = f"{signal.Signals(self.signum).name}: " if self.signum is not None else ""
        total = sum(s.timeout() for s in steps)
        self._print(f"{prefix}{self.announce} (at most {total:.0f} s) ...")
        for i, step in enumerate(steps):
            self._step_deadline = time.monotonic() + step.timeout()
            self._after_step_s = sum(s.timeout() for s in steps[i + 1 :])
            try:
                step.fn()
            except BaseException as e:  # reported; the next steps must still run
                self.problems.append(f"could not {step.what}: {str(e) or type(e).__name__}")
                self._print(self.problems[-1], style="red")

    def _print(self, text: str, style: str | None = None) -> None:
        # A closed pipe: rich raises SystemExit (Console.on_broken_pipe, after pointing stdout to /dev/null), or
        # the write fails; the steps matter more than their report.
        with contextlib.suppress(OSError, SystemExit):
            self.console.print(text, style=style, markup=False, highlight=False)

    def _leftovers(self) -> None:
        for line in stop_children(CHILD_GRACE_S):
            self._print(f"stopped a leftover process: {line}")


_EXIT_CODE = Shutdown.__exit__.__code__


def _children() -> dict[int, tuple[int, str]]:
    """Live (not zombie) child processes of this process: PID -> (process group, command line). Linux /proc."""
    found: dict[int, tuple[int, str]] = {}
    me = os.getpid()
    with contextlib.suppress(OSError):
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
                cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()  # state ppid pgrp ...
            if len(fields) > 2 and int(fields[1]) == me and fields[0] not in ("Z", "X"):
                found[int(d.name)] = (int(fields[2]), cmdline[:200])
    return found


def _signal_child(pid: int, pgid: int, sig: int) -> None:
    # A child that leads its own group (start_new_session) takes its group along (Triton's Python-backend stubs).
    # Its PID cannot be reused before this process reaps it, so the PID still names the process started here.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if pgid == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def stop_children(grace_s: float = CHILD_GRACE_S) -> list[str]:
    """SIGTERM every live child process (with the process group it leads), SIGKILL those left after ``grace_s``,
    then wait up to ``grace_s`` again. Returns ``"<pid> <command line>"`` of each child found."""
    children = _children()
    for pid, (pgid, _) in children.items():
        _signal_child(pid, pgid, signal.SIGTERM)
    for sig in (signal.SIGKILL, None):
        deadline = time.monotonic() + grace_s
        while (left := set(_children()) & set(children)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if sig is not None:
            for pid in left:
                _signal_child(pid, children[pid][0], sig)
    return [f"{pid} {cmd}" for pid, (_, cmd) in sorted(children.items())]


def run_cancellable(jobs: Mapping[str, Callable[[], Coroutine[Any, Any, T]]]) -> dict[str, T]:
    """Run the coroutines at once, each on an event loop of its own (daemon) thread; returns their results.

    An exception in the main thread (Ctrl-C) cancels them all, waits up to :data:`CANCEL_WAIT_S` for them to end
    and propagates. A thread pool could not do that: its exit joins the workers, so an interrupt would wait for
    the whole run (a load of ``--duration`` seconds) before any cleanup began. Raises the first job's error.
    """
    runners = {key: asyncio.Runner(loop_factory=asyncio.new_event_loop) for key in jobs}
    for runner in runners.values():
        runner.get_loop()  # made here, not in the threads: a cancel below must find the loop the thread runs
    results: dict[str, T] = {}
    errors: list[BaseException] = []

    def run(key: str) -> None:
        try:
            with runners[key] as runner:
                results[key] = runner.run(jobs[key]())
        except BaseException as e:  # raised again in the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(key,), name=f"job-{key}", daemon=True) for key in jobs]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.5)  # polls: a signal delivered to another thread still gets handled here soon
    except BaseException:
        for runner in runners.values():
            with contextlib.suppress(RuntimeError):  # that run has ended and closed its loop
                runner.get_loop().call_soon_threadsafe(_cancel_tasks)
        deadline = time.monotonic() + CANCEL_WAIT_S
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        raise
    if errors:
        raise errors[0]
    return results


def _cancel_tasks() -> None:
    for task in asyncio.all_tasks():
        task.cancel()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` (a KeyboardInterrupt) in the main thread while inside; a second SIGTERM
    is ignored so it cannot cut that cleanup short. (The demo itself uses :class:`Shutdown`, which also takes
    SIGINT over and keeps later signals out of the whole cleanup.)"""

    def raise_interrupt(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
