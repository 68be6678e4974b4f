"""batchfill.cli.shutdown: what makes `batchfill demo` stop everything on Ctrl-C, at any moment.

Each case runs in a Python subprocess of its own: it installs signal handlers and its last step stops every
child process of the process it runs in, neither of which may touch the pytest process. The cluster tests
(tests/cluster/test_demo.py) check the same on the real demo.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRELUDE = """
import json, os, signal, subprocess, sys, threading, time, asyncio
from rich.console import Console
from batchfill.cli.shutdown import Shutdown, Terminated, run_cancellable
console = Console(file=sys.stdout, width=200)
done = []
"""


def _run(code: str, sigint: str = "default", timeout_s: float = 60.0) -> tuple[int, str, str]:
    """Run ``code`` after :data:`PRELUDE` in a subprocess started with SIGINT ``default`` or ``ignored``."""
    disposition = signal.SIG_IGN if sigint == "ignored" else signal.SIG_DFL
    r = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, disposition),  # the child's disposition before exec
    )
    return r.returncode, r.stdout, r.stderr


def _result(stdout: str) -> dict[str, object]:
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def test_ctrl_c_interrupts_the_run_even_with_sigint_inherited_ignored() -> None:
    # A background job of a non-interactive shell inherits SIGINT ignored; Python then makes no KeyboardInterrupt.
    code, out, err = _run(
        """
        t0 = time.monotonic()
        try:
            with Shutdown(console, "stopping") as s:
                s.on_exit("first registered", 1, done.append, "first registered")
                s.on_exit("last registered", 1, done.append, "last registered")
                signal.raise_signal(signal.SIGINT)
                time.sleep(30)
            outcome = "returned"
        except KeyboardInterrupt as e:
            outcome = type(e).__name__
        after = "ignored" if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else "other"
        print(json.dumps({"outcome": outcome, "signum": s.signum, "done": done, "after": after,
                          "s": time.monotonic() - t0, "problems": s.problems}))
        """,
        sigint="ignored",
    )
    assert code == 0, err
    r = _result(out)
    assert r["outcome"] == "KeyboardInterrupt"
    assert r["signum"] == signal.SIGINT
    assert r["done"] == ["last registered", "first registered"]  # reverse order of registration
    assert r["after"] == "ignored"  # the inherited disposition is back
    assert float(str(r["s"])) < 10
    assert r["problems"] == []
    assert "SIGINT: stopping (at most 12 s) ..." in out  # 1 + 1 + the leftover children's 2 x 5 s


def test_sigterm_raises_terminated() -> None:
    code, out, err = _run(
        """
        try:
            with Shutdown(console) as s:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
        except Terminated:
            print(json.dumps({"signum": s.signum}))
        """
    )
    assert code == 0, err
    assert _result(out) == {"signum": signal.SIGTERM}


def test_a_signal_during_the_cleanup_cuts_no_step_short_and_a_failing_step_stops_none() -> None:
    code, out, err = _run(
        """
        def slow_step():
            signal.raise_signal(signal.SIGINT)  # a second Ctrl-C, in the middle of a stop step
            time.sleep(0.5)
            done.append("slow step ended")

        def failing_step():
            raise RuntimeError("the API server did not answer")

        try:
            with Shutdown(console) as s:
                s.on_exit("run the last step", 1, done.append, "last step")
                s.on_exit("fail", 1, failing_step)
                s.on_exit("run the slow step", 1, slow_step)
                signal.raise_signal(signal.SIGINT)
                time.sleep(30)
        except KeyboardInterrupt:
            pass
        print(json.dumps({"done": done, "problems": s.problems, "signum": s.signum}))
        """
    )
    assert code == 0, err
    r = _result(out)
    assert r["done"] == ["slow step ended", "last step"]
    assert r["problems"] == ["could not fail: the API server did not answer"]
    assert r["signum"] == signal.SIGINT
    assert "could not fail: the API server did not answer" in out  # said when it happened
    assert "SIGINT while stopping: the cleanup goes on so that nothing is left running (at most" in err


def test_a_signal_after_the_run_ended_still_counts() -> None:
    # Ctrl-C during the cleanup of a run that went well: the exit code must still say interrupted.
    code, out, err = _run(
        """
        with Shutdown(console) as s:
            s.on_exit("stop", 1, signal.raise_signal, signal.SIGINT)
        print(json.dumps({"signum": s.signum, "problems": s.problems}))
        """
    )
    assert code == 0, err
    assert _result(out) == {"signum": signal.SIGINT, "problems": []}


def test_an_interrupt_swallowed_where_python_ignores_exceptions_is_raised_again() -> None:
    # As when the handler runs in logging's os.register_at_fork hook while subprocess forks: the interrupt
    # becomes "Exception ignored in ..." and, without a second raise, the run would go on as if never interrupted.
    code, out, err = _run(
        """
        class Swallows:
            def __del__(self):
                signal.raise_signal(signal.SIGINT)
                for _ in range(1000):  # the handler runs here, inside __del__
                    pass

        t0 = time.monotonic()
        try:
            with Shutdown(console) as s:
                Swallows()
                time.sleep(30)
            outcome = "returned"
        except KeyboardInterrupt:
            outcome = "interrupted"
        print(json.dumps({"outcome": outcome, "s": time.monotonic() - t0}))
        """
    )
    assert code == 0, err
    r = _result(out)
    assert "Exception ignored in" in err  # it was swallowed once
    assert r["outcome"] == "interrupted"
    assert float(str(r["s"])) < 10


def test_the_last_step_stops_child_processes_no_step_stopped(tmp_path: Path) -> None:
    code, out, err = _run(
        f"""
        from pathlib import Path
        marker = Path({str(tmp_path / "grandchild")!r})
        with Shutdown(console) as s:
            alone = subprocess.Popen(["sleep", "60"])  # e.g. started at the moment of the signal
            leader = subprocess.Popen(["sh", "-c", f"sleep 60 & echo $! > {{marker}}; wait"], start_new_session=True)
            while not marker.exists() or not marker.read_text().strip():
                time.sleep(0.05)
        stat = Path(f"/proc/{{marker.read_text().strip()}}/stat")
        grandchild = stat.read_text().rsplit(")", 1)[1].split()[0] if stat.exists() else "gone"
        print(json.dumps({{"alone": alone.poll(), "leader": leader.poll(), "grandchild": grandchild,
                          "problems": s.problems}}))
        """
    )
    assert code == 0, err
    r = _result(out)
    assert r["alone"] == -signal.SIGTERM
    assert r["leader"] == -signal.SIGTERM
    assert r["grandchild"] in ("gone", "Z")  # the sleep that sh started went with sh's process group
    assert r["problems"] == []
    assert out.count("stopped a leftover process:") == 2, out


def test_run_cancellable_returns_results_and_an_interrupt_cancels_a_long_run() -> None:
    code, out, err = _run(
        """
        async def job(value, seconds):
            await asyncio.sleep(seconds)
            return value

        results = run_cancellable({"a": lambda: job(1, 0.1), "b": lambda: job(2, 0.2)})
        t0 = time.monotonic()
        try:
            with Shutdown(console):
                threading.Timer(0.5, signal.raise_signal, (signal.SIGINT,)).start()
                run_cancellable({"long": lambda: job(3, 600)})
            outcome = "returned"
        except KeyboardInterrupt:
            outcome = "interrupted"
        print(json.dumps({"results": results, "outcome": outcome, "s": time.monotonic() - t0,
                          "threads": threading.active_count()}))
        """
    )
    assert code == 0, err
    r = _result(out)
    assert r["results"] == {"a": 1, "b": 2}
    assert r["outcome"] == "interrupted"
    assert float(str(r["s"])) < 10  # not the job's 600 s
    assert r["threads"] == 1  # the cancelled job's thread ended


def test_a_closed_output_pipe_does_not_kill_the_cleanup(tmp_path: Path) -> None:
    # `batchfill demo | tee log` and Ctrl-C: tee is gone before the demo writes "stopping ..."; by default SIGPIPE
    # would end the process on that line, before any step ran.
    marker = tmp_path / "stopped"
    code = f"""
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as batchfill's main() sets it
        with Shutdown(console) as s:
            s.on_exit("write the marker", 1, __import__("pathlib").Path({str(marker)!r}).write_text, "stopped")
            print("ready", flush=True)
            time.sleep(30)
        """
    proc = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    proc.stdout.close()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    assert proc.returncode != -signal.SIGPIPE
    assert marker.read_text() == "stopped"
