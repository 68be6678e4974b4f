"""The test bed's one process lifecycle (batchfill.testbed.process) on real, small processes (sh, sleep)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from batchfill.testbed.process import (
    PORT_IN_USE,
    Process,
    ProcessError,
    ProcessExitedError,
    ReadinessTimeoutError,
    free_port,
    free_ports,
    kill_all,
    proc_stat,
    process_group_alive,
    start_with_port_retries,
    stop_all,
    tail,
    tail_errors,
    wait_until,
)


def sh(script: str, log: Path, name: str | None = None) -> Process:
    return Process.start(["/bin/sh", "-c", script], log, name=name)


def test_start_leads_its_own_group_logs_and_reads_no_stdin(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "p.log"
    p = sh("echo out; echo err >&2; read x || echo no-stdin; exec sleep 60", log, name="p")
    try:
        fields = proc_stat(p.pid)
        assert fields is not None
        assert int(fields[2]) == p.pid  # its process group is its own
        assert wait_until(lambda: "no-stdin" in p.log_tail(), 5.0, interval_s=0.02) < 5.0
        assert p.log_tail(3).splitlines() == ["out", "err", "no-stdin"]
        assert p.alive()
        assert not p.exited()
        assert (p.name, p.exe, p.log_path) == ("p", "/bin/sh", log)
    finally:
        p.stop(grace_s=5)
    assert p.returncode == -signal.SIGTERM
    assert not p.alive()
    assert p.exited()
    assert not Path(f"/proc/{p.pid}").exists()  # reaped


def test_preexec_runs_in_the_child_before_exec(tmp_path: Path) -> None:
    """What ``preexec`` does (here: change directory) is what the program starts with; the parent is untouched."""
    here = Path.cwd()
    target = tmp_path / "elsewhere"
    target.mkdir()
    p = Process.start(["/bin/sh", "-c", "pwd"], tmp_path / "p.log", preexec=lambda: os.chdir(target))
    wait_until(p.exited, 5.0, interval_s=0.02)
    assert p.returncode == 0
    assert p.log_tail(1) == str(target)
    assert Path.cwd() == here
    assert p.exe == "/bin/sh"


def test_stop_kills_what_ignores_sigterm_after_the_grace(tmp_path: Path) -> None:
    p = sh("trap '' TERM; echo trapped; while :; do sleep 0.05; done", tmp_path / "p.log")
    wait_until(lambda: "trapped" in p.log_tail(), 5.0, interval_s=0.02)
    t0 = time.monotonic()
    assert p.stop(grace_s=0.5) == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - t0 < 5.0
    assert not process_group_alive(p.pid)  # the group's sleeps went with it


def test_stop_reaps_group_members_that_outlive_the_leader(tmp_path: Path) -> None:
    # The leader exits on SIGTERM, its background child (in the same group) ignores it: as Triton's stubs can.
    p = sh("(trap '' TERM; exec sleep 300) & trap 'exit 0' TERM; echo ready; wait", tmp_path / "p.log")
    wait_until(lambda: "ready" in p.log_tail(), 5.0, interval_s=0.02)
    assert p.stop(grace_s=5, reap_s=0.3) == 0
    assert not process_group_alive(p.pid)


def test_a_record_is_signalled_only_while_it_is_the_same_process(tmp_path: Path) -> None:
    p = Process.start(["/bin/sleep", "60"], tmp_path / "p.log")
    record = p.record()
    assert record == {"pid": p.pid, "start_ticks": p.start_ticks, "exe": "/bin/sleep"}
    impostor = Process.from_record({**record, "start_ticks": p.start_ticks + 1})
    assert impostor.popen is None
    assert not impostor.alive()
    assert impostor.exited()
    assert not Process.from_record({**record, "exe": "/bin/other"}).alive()
    assert stop_all([impostor], grace_s=0.2) == []
    assert p.alive()
    again = Process.from_record(record, name="sleeper")
    assert again.popen is p.popen  # still this interpreter's child: judged and reaped by Popen
    assert kill_all([again]) == []
    assert again.returncode == -signal.SIGKILL
    assert not p.alive()


def test_wait_until_fails_as_soon_as_a_watched_process_exits(tmp_path: Path) -> None:
    p = sh("echo boom; exit 3", tmp_path / "p.log", name="boom")
    t0 = time.monotonic()
    with pytest.raises(ProcessExitedError) as err:
        wait_until(lambda: False, 30.0, watch=[p], interval_s=0.02)
    assert time.monotonic() - t0 < 5.0
    assert err.value.process is p
    assert str(err.value) == "boom exited with code 3"


def test_wait_until_counts_exceptions_as_not_yet_and_times_out() -> None:
    calls = []

    def check() -> bool:
        calls.append(1)
        if len(calls) < 3:
            raise OSError("connection refused")
        return True

    assert wait_until(check, 5.0, interval_s=0.01) < 5.0
    assert len(calls) == 3
    with pytest.raises(ReadinessTimeoutError) as err:
        wait_until(lambda: False, 0.1, interval_s=0.02)
    assert err.value.timeout_s == 0.1


def test_wait_ready_names_the_process_its_exit_code_and_log(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    p = sh("exit 7", log, name="server")
    with pytest.raises(ProcessError, match=rf"^server exited with code 7 before it was ready; log {log}$"):
        p.wait_ready(lambda: False, 30.0)
    q = Process.start(["/bin/sleep", "60"], log, name="slow")
    try:
        with pytest.raises(ProcessError, match=rf"^slow \(pid {q.pid}\) not ready after 0 s on 127\.0\.0\.1:1; log "):
            q.wait_ready(lambda: False, 0.2, where="127.0.0.1:1")
        assert q.wait_ready(lambda: True, 1.0) < 1.0
    finally:
        q.stop()


def test_die_with_parent_sends_sigterm_when_the_starting_thread_exits(tmp_path: Path) -> None:
    started: list[Process] = []
    t = threading.Thread(target=lambda: started.append(Process.start(["/bin/sleep", "60"], tmp_path / "p.log",
                                                                      die_with_parent=True)))  # fmt: skip
    t.start()
    t.join()
    (p,) = started
    wait_until(p.exited, 5.0, interval_s=0.02)
    assert p.returncode == -signal.SIGTERM


def test_start_with_port_retries_retries_only_a_port_taken(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    attempts: list[int] = []
    stops: list[int] = []

    def start() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            log.write_text(f"bind: address {PORT_IN_USE}\n")
            raise RuntimeError("not ready")
        return "up"

    def log_tail(lines: int) -> str:
        return tail(log, lines)

    assert start_with_port_retries(start, attempts=3, stop=lambda: stops.append(1), log_tail=log_tail) == "up"
    assert (len(attempts), len(stops)) == (3, 2)

    attempts.clear()
    stops.clear()
    with pytest.raises(RuntimeError, match="not ready"):
        start_with_port_retries(start, attempts=2, stop=lambda: stops.append(1), log_tail=log_tail)
    assert (len(attempts), len(stops)) == (2, 2)  # the last failure is raised, after its stop

    def broken() -> str:
        log.write_text("E1129 bad config\n")
        raise RuntimeError("exited")

    stops.clear()
    with pytest.raises(RuntimeError, match="exited"):
        start_with_port_retries(broken, attempts=3, stop=lambda: stops.append(1), log_tail=log_tail)
    assert len(stops) == 1  # another failure is not retried


def test_tail_and_error_lines(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    assert tail(log) == ""  # no file yet
    log.write_text("".join(f"line {i}\n" for i in range(100)) + "E0001 first\nok\nE0002 second\n")
    assert tail(log, 2).splitlines() == ["ok", "E0002 second"]
    assert tail(log, 1000, max_bytes=16) == "ok\nE0002 second"  # only the last 16 bytes are read
    assert tail_errors(log, lambda line: line.startswith("E")) == ["E0001 first", "E0002 second"]
    assert tail_errors(log, lambda line: line.startswith("E"), max_lines=1) == ["E0002 second"]


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in [*ports, free_port()]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))
