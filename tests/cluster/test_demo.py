"""`batchfill demo`, the README's first command, run as a user runs it: a subprocess with its own control plane.

It starts its own dev cluster (not the session's), so it needs the built binaries but not the ``kube`` fixture.
Checked: exit code, what it prints for the user (the profile measured on this machine next to the declared one,
the plan and load sized from it, printer columns, the derived config, pods on GPU nodes, the real tritonserver's
p99 against T), and that nothing it started survives the end of the run or Ctrl-C: at any step, with SIGINT
inherited as ignored (a background job of a script, as `make test &` runs), with a second Ctrl-C during the
cleanup, and with its API server hanging, within the stop timeouts the demo documents.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from batchfill.api.reasons import EventReason
from batchfill.api.spec import ProfilePoint
from batchfill.api.validate import load_model
from batchfill.cli import demo
from batchfill.cli.demo import EXAMPLE
from batchfill.policy.plan import plan_batching
from batchfill.testbed import devcluster

from .conftest import USE_EXISTING

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        USE_EXISTING, reason="the demo's Triton pods are kwok pods; on an existing cluster they would run real images"
    ),
]

#: What a loaded 2-core machine adds to the waits the demo's stop timeouts bound (Python, /proc scans, kubectl).
SLACK_S = 20.0
# Starts the demo with SIGINT's disposition set (exec keeps SIG_IGN and SIG_DFL, POSIX execve): "ignored" is what a
# background job of a non-interactive shell inherits, "default" what an interactive one does.
_LAUNCH = (
    "import os, signal, sys; "
    "signal.signal(signal.SIGINT, signal.SIG_IGN if sys.argv[1] == 'ignored' else signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
)


class Demo:
    """A ``batchfill demo`` subprocess in a session of its own; a thread reads its output, so no wait blocks."""

    def __init__(self, run_dir: Path, *args: str, sigint: str | None = None) -> None:
        if devcluster.missing_binaries():
            devcluster.ensure_binaries()
        self.run_dir = run_dir
        cmd = ["-m", "batchfill.cli", "demo", "--run-dir", str(run_dir), *args]
        argv = [sys.executable, *cmd] if sigint is None else [sys.executable, "-c", _LAUNCH, sigint, *cmd]
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, COLUMNS="200"),
            start_new_session=True,
        )
        self.lines: list[tuple[float, str]] = []  # (monotonic time, line)
        self._eof = False
        self._new = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._new:
                self.lines.append((time.monotonic(), line))
                self._new.notify_all()
        with self._new:
            self._eof = True
            self._new.notify_all()

    @property
    def text(self) -> str:
        with self._new:
            return "".join(line for _, line in self.lines)

    def wait_for(self, marker: str, timeout_s: float) -> float:
        """Wait for an output line holding ``marker``; returns when it came (monotonic). Fails on timeout/exit."""
        deadline = time.monotonic() + timeout_s
        with self._new:
            while True:
                hit = next((t for t, line in self.lines if marker in line), None)
                if hit is not None:
                    return hit
                if self._eof:
                    pytest.fail(f"the demo exited ({self.proc.returncode}) before {marker!r}:\n{self.text[-6000:]}")
                if time.monotonic() > deadline:
                    pytest.fail(f"no {marker!r} after {timeout_s:g} s:\n{self.text[-6000:]}")
                self._new.wait(timeout=1.0)

    def wait_exit(self, timeout_s: float) -> int:
        """The exit code, once the demo has exited and all its output is read."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the demo did not exit within {timeout_s:.0f} s:\n{self.text[-6000:]}")
        self._reader.join(timeout=10)
        return code

    def interrupt(self) -> float:
        """Ctrl-C as a terminal sends it: SIGINT to the demo's process group. Returns when (monotonic)."""
        t = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGINT)
        return t

    def close(self) -> None:
        """After a failed test: stop the demo (SIGTERM, then SIGKILL) and whatever of its run is left, so that
        a failure does not leave a control plane running. Every process named here runs from this test's run
        directory, so it is this test's."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=demo.stop_timeout_s() + SLACK_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        for pid in _processes(self.run_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)


def _measured_profile(out: str) -> dict[int, float]:
    """The demo's table of the profile measured on this machine: batch size -> measured ms (declared ms checked)."""
    declared = {1: 28.2, 2: 52.9, 4: 105.7, 8: 224.8, 16: 533.0}  # deploy/examples/ocr-recognizer.yaml
    start = out.index("declared ms")
    table = out[start : out.index("└", start)]
    rows = re.findall(r"│\s*(\d+)\s*│\s*([0-9.]+)\s*│\s*([0-9.]+)\s*│\s*([0-9.]+)\s*│", table)
    assert {int(b): float(d) for b, d, _, _ in rows} == declared, out
    measured = {int(b): float(m) for b, _, m, _ in rows}
    assert all(ms > 0 for ms in measured.values()), out
    return measured


@pytest.fixture
def demos() -> Iterator[list[Demo]]:
    """Demos started by a test; stopped, with everything of their runs, whatever the test's outcome."""
    started: list[Demo] = []
    yield started
    for d in started:
        d.close()


def _processes(run_dir: Path) -> dict[int, list[str]]:
    """Live processes whose command line or KUBECONFIG mentions ``run_dir`` (tritonservers, etcd, the operator...):
    PID -> argv."""
    found = {}
    needle = str(run_dir).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:  # gone
            continue
        environ = b""
        with contextlib.suppress(OSError):
            environ = (proc / "environ").read_bytes()
        if needle in cmdline or needle in environ:
            found[int(proc.name)] = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
    return found


def _survivors(run_dir: Path) -> list[str]:
    return [f"{pid}: {' '.join(argv)[:200]}" for pid, argv in sorted(_processes(run_dir).items())]


def _wait_gone(run_dir: Path, timeout_s: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := _survivors(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _triton_logs(run_dir: Path) -> str:
    return "".join(
        f"\n--- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        for log in sorted(run_dir.glob("run-*/pods/*/tritonserver.log"))
    )


def _freeze_api_server(run_dir: Path) -> int:
    """SIGSTOP the kube-apiserver of the run in ``run_dir``: from now on every API call of the run hangs."""
    pid = next((p for p, argv in _processes(run_dir).items() if argv[0].endswith("/kube-apiserver")), None)
    assert pid is not None, _survivors(run_dir)
    os.kill(pid, signal.SIGSTOP)
    return pid


def _stop_bound(text: str, existing_objects: int | None = None) -> float:
    """The bound of the cleanup the demo printed (the sum of the stop timeouts of what it had started), checked
    against the one of a full run, plus :data:`SLACK_S`."""
    said = re.search(r"stopping what the demo started: .* \(at most (\d+) s\)", text)
    assert said, text[-4000:]
    assert 0 < float(said.group(1)) <= round(demo.stop_timeout_s(existing_objects)), said.group(0)
    return float(said.group(1)) + SLACK_S


def _assert_all_stopped(d: Demo, code: int, since: float, existing_objects: int | None = None) -> None:
    elapsed = time.monotonic() - since
    assert code == 130, d.text[-4000:]
    assert elapsed <= _stop_bound(d.text, existing_objects), f"{elapsed:.0f} s to stop:\n{d.text[-4000:]}"
    assert _wait_gone(d.run_dir, 5.0) == []


def test_demo_serves_the_example_within_its_sla_and_cleans_up(tmp_path: Path, demos: list[Demo]) -> None:
    run_dir = tmp_path / "demo"
    d = Demo(run_dir, "--duration", "8")
    demos.append(d)
    code = d.wait_exit(600)
    out = d.text
    assert code == 0, out[-6000:]
    # what a user checks
    header = r"NAMESPACE\s+NAME\s+SLA\s+REPLICAS\s+DESIRED\s+FILL\s+QUEUE MS\s+PLACEMENT\s+READY\s+PROGRESSING"
    assert re.search(header, out), out
    assert re.search(r"ocr\s+text-recognizer\s+500\s+1\s+.*True", out), out
    for rendered in ("max_batch_size:", "dynamic_batching {", "kind: KIND_GPU"):
        assert rendered in out, out
    assert re.search(r"text-recognizer-triton-\S+\s+gpu-node-\d\s+1\s+True\s+[0-9a-f]{16}", out), out
    assert EventReason.DEPLOYED in out, out
    match = re.search(r"SLA kept: worst server p99 ([0-9.]+) ms against T = 450 ms", out)
    assert match, out
    assert 0 < float(match.group(1)) <= 450
    # the profile measured here, next to the declared one, is what the operator planned and the load was sized from
    measured = _measured_profile(out)
    assert sorted(measured) == [1, 2, 4, 8, 16], out
    assert "with the profile measured here" in out, out
    plan = re.search(r"capacity at SLA ([0-9.]+) req/s per replica .* λ = 70% of it = ([0-9.]+) req/s", out)
    assert plan, out
    capacity, rate = float(plan.group(1)), float(plan.group(2))
    assert rate == pytest.approx(0.7 * capacity, abs=0.051)  # printed to 0.1
    spec = load_model(yaml.safe_load(EXAMPLE.read_text())).spec
    profile = [ProfilePoint(batchSize=b, latencyMs=ms) for b, ms in sorted(measured.items())]
    local = plan_batching(spec.model_copy(update={"profile": profile})).to_status()
    assert capacity == pytest.approx(local.capacityPerReplicaRps, rel=0.03), (capacity, local)
    assert f"max_batch_size: {local.maxBatchSize}\n" in out, (local, out)
    # the load table: the Poisson rate next to what was sent per second of the 8 s
    cell = r"\s*([0-9.]+)\s*│"
    row = re.search(rf"│\s*text-recognizer-triton-\S+\s*│{cell}{cell}{cell}\s*(\d+)/0\s*│", out)
    assert row, out
    assert float(row.group(1)) == pytest.approx(rate, abs=0.001)
    assert float(row.group(2)) == pytest.approx(int(row.group(4)) / 8, abs=0.051)
    # nothing left behind
    assert _wait_gone(run_dir) == []
    assert list(run_dir.iterdir()) == [], "the demo left its working directory behind"


def test_demo_keep_stops_everything_on_ctrl_c(tmp_path: Path, demos: list[Demo]) -> None:
    run_dir = tmp_path / "demo"
    d = Demo(run_dir, "--duration", "3", "--keep", sigint="default")
    demos.append(d)
    d.wait_for("Ctrl-C stops everything", 600)
    assert "the demo stays up" in d.text, d.text[-6000:]
    kubeconfig = re.search(r"export KUBECONFIG=(\S+)", d.text)
    assert kubeconfig, d.text
    # the cluster is usable from outside while the demo holds it
    listed = devcluster.kubectl(kubeconfig.group(1), "get", "bm", "-n", "ocr", "-o", "name").stdout
    assert listed.strip() == "batchedmodel.batchfill.io/text-recognizer"
    assert _survivors(run_dir), "nothing of the demo is running while it says it stays up"

    since = d.interrupt()
    _assert_all_stopped(d, d.wait_exit(demo.stop_timeout_s() + SLACK_S), since)
    assert "everything the demo started has been stopped" in d.text
    assert list(run_dir.iterdir()) == []


def test_demo_stops_everything_on_ctrl_c_when_its_api_server_hangs(tmp_path: Path, demos: list[Demo]) -> None:
    # The slow shutdown of a loaded machine, made certain: every API call of the cleanup would hang. The demo
    # inherits SIGINT ignored, as under a `make test` started in the background by a script (the demo then used
    # to ignore Ctrl-C and run on), and a second Ctrl-C comes while it stops.
    run_dir = tmp_path / "demo"
    d = Demo(run_dir, "--duration", "3", "--keep", sigint="ignored")
    demos.append(d)
    d.wait_for("Ctrl-C stops everything", 600)
    running = "\n".join(_survivors(run_dir))
    assert "tritonserver" in running, running + _triton_logs(run_dir)
    assert "batchfill.cli run" in running, running
    _freeze_api_server(run_dir)

    since = d.interrupt()
    d.wait_for("stopping what the demo started", 30)
    time.sleep(1.0)
    d.interrupt()
    code = d.wait_exit(demo.stop_timeout_s() + SLACK_S)
    _assert_all_stopped(d, code, since)
    assert "SIGINT while stopping: the cleanup goes on" in d.text, d.text[-4000:]
    assert "interrupted: everything the demo started has been stopped" in d.text, d.text[-4000:]
    assert list(run_dir.iterdir()) == []


@pytest.mark.parametrize(
    ("step", "marker", "after_s"),
    [
        ("control plane start", "etcd healthy", 0.0),
        ("operator start", "operator running as ServiceAccount", 0.0),
        ("load", "tritonserver pid", 2.0),
    ],
)
def test_demo_ctrl_c_at_any_step_stops_everything(
    tmp_path: Path, demos: list[Demo], step: str, marker: str, after_s: float
) -> None:
    # --duration 600: an interrupted load must not be waited for (it used to be, in full, before any cleanup)
    run_dir = tmp_path / "demo"
    d = Demo(run_dir, "--duration", "600", sigint="default")
    demos.append(d)
    d.wait_for(marker, 600)
    time.sleep(after_s)
    assert _survivors(run_dir), f"nothing of the demo runs at the {step}"
    since = d.interrupt()
    _assert_all_stopped(d, d.wait_exit(demo.stop_timeout_s() + SLACK_S), since)
    assert "interrupted: everything the demo started has been stopped" in d.text, d.text[-4000:]
    assert list(run_dir.iterdir()) == []


def test_demo_on_an_existing_cluster_stops_its_processes_and_names_what_it_could_not_delete(
    tmp_path: Path, demos: list[Demo]
) -> None:
    # --kubeconfig: the demo's objects live on in the cluster, so its cleanup deletes them; with that cluster's
    # API server hanging, it still stops the operator and the tritonservers in time, and says what is left.
    run_dir = tmp_path / "demo"
    with devcluster.running_cluster(tmp_path / "cluster", die_with_parent=True, build=False, quiet=True) as info:
        api_server = info.pids["kube-apiserver"]
        try:
            d = Demo(run_dir, "--kubeconfig", str(info.kubeconfig), "--duration", "3", "--keep", sigint="default")
            demos.append(d)
            d.wait_for("Ctrl-C stops everything", 600)
            running = "\n".join(_survivors(run_dir))
            assert "tritonserver" in running, running + _triton_logs(run_dir)
            os.kill(api_server, signal.SIGSTOP)
            since = d.interrupt()
            _assert_all_stopped(d, d.wait_exit(demo.stop_timeout_s(3) + SLACK_S), since, existing_objects=3)
        finally:
            os.kill(api_server, signal.SIGCONT)
        left = re.search(r"could not delete the demo's objects from the cluster of \S+: (.*) left \(", d.text)
        assert left, d.text[-4000:]
        pv = "triton-models-ocr-text-recognizer"
        assert left.group(1) == f"bm -n ocr text-recognizer, pvc -n ocr triton-models, pv {pv}", left.group(0)
        assert "interrupted: not everything the demo started could be stopped or deleted" in d.text
        assert [p.name.startswith("run-") for p in run_dir.iterdir()] == [True], "its logs are kept"
        # what it says to run deletes what is left (kubectl waits for each deletion to finish)
        commands = re.search(r"to delete them: (.*)$", d.text, re.MULTILINE)
        assert commands, d.text[-4000:]
        for command in commands.group(1).split("; "):
            assert command.startswith(f"kubectl --kubeconfig={info.kubeconfig} delete "), command
            devcluster.kubectl(info.kubeconfig, *command.split()[2:], timeout_s=120)
        left_over = devcluster.kubectl(info.kubeconfig, "get", "bm,pvc", "-n", "ocr", "-o", "name").stdout
        assert left_over.strip() == ""
        assert devcluster.kubectl(info.kubeconfig, "get", "pv", pv, "--ignore-not-found").stdout.strip() == ""


def test_demo_stops_everything_on_sigterm_and_exits_143(tmp_path: Path, demos: list[Demo]) -> None:
    # What a CI job's timeout or `kill` sends: the same cleanup as Ctrl-C, and 128 + SIGTERM like `batchfill serve`.
    run_dir = tmp_path / "demo"
    d = Demo(run_dir, "--duration", "3")
    demos.append(d)
    # once a tritonserver serves a Ready pod, everything runs: control plane, operator, tritonservers
    d.wait_for("tritonserver pid", 300)
    running = _survivors(run_dir)
    assert any("tritonserver" in p for p in running), "\n".join(running) + _triton_logs(run_dir)
    assert any("batchfill.cli run" in p for p in running), running
    os.kill(d.proc.pid, signal.SIGTERM)  # the demo process only, as a supervisor would
    assert d.wait_exit(demo.stop_timeout_s() + SLACK_S) == 143, d.text[-4000:]
    assert "everything the demo started has been stopped" in d.text
    assert _wait_gone(run_dir) == []
    assert list(run_dir.iterdir()) == []
