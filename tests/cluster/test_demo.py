"""`batchfill demo`, the README's first command, run as a user runs it: a subprocess with its own control plane.

It starts its own dev cluster (not the session's), so it needs the built binaries but not the ``kube`` fixture.
Checked: exit code, what it prints for the user (the profile measured on this machine next to the declared one,
the plan and load sized from it, printer columns, the derived config, pods on GPU nodes, the real tritonserver's
p99 against T), and that nothing it started survives the end of the run or Ctrl-C.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from batchfill.api.spec import ProfilePoint
from batchfill.api.validate import load_model
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


def _demo(run_dir: Path, *args: str) -> subprocess.Popen[str]:
    if devcluster.missing_binaries():
        devcluster.ensure_binaries()
    env = dict(os.environ, COLUMNS="200")
    return subprocess.Popen(
        [sys.executable, "-m", "batchfill.cli", "demo", "--run-dir", str(run_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )


def _read_until(proc: subprocess.Popen[str], marker: str, timeout_s: float) -> str:
    """The demo's output up to and including the first line holding ``marker`` (or all of it, if it ends first)."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            break
    return "".join(lines)


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


def _survivors(run_dir: Path) -> list[str]:
    """Processes whose command line or KUBECONFIG mentions ``run_dir`` (tritonservers, etcd, the operator...)."""
    found = []
    needle = str(run_dir).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if needle in cmdline or needle in environ:
            found.append(f"{proc.name}: {cmdline.replace(bytes(1), b' ')[:200]!r}")
    return found


def _wait_gone(run_dir: Path, timeout_s: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := _survivors(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_demo_serves_the_example_within_its_sla_and_cleans_up(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    proc = _demo(run_dir, "--duration", "8")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-6000:]
    # what a user checks
    assert re.search(r"NAMESPACE\s+NAME\s+SLA\s+REPLICAS\s+DESIRED\s+FILL\s+QUEUE MS\s+READY", out), out
    assert re.search(r"ocr\s+text-recognizer\s+500\s+1\s+.*True", out), out
    for rendered in ("max_batch_size:", "dynamic_batching {", "kind: KIND_GPU"):
        assert rendered in out, out
    assert re.search(r"text-recognizer-triton-\S+\s+gpu-node-\d\s+1\s+True\s+[0-9a-f]{16}", out), out
    assert "Deployed" in out, out
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


def test_demo_keep_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    proc = _demo(run_dir, "--duration", "3", "--keep")
    text = _read_until(proc, "Ctrl-C stops everything", 600)
    assert "the demo stays up" in text, text[-6000:]
    kubeconfig = re.search(r"export KUBECONFIG=(\S+)", text)
    assert kubeconfig, text
    # the cluster is usable from outside while the demo holds it
    listed = devcluster.kubectl(kubeconfig.group(1), "get", "bm", "-n", "ocr", "-o", "name").stdout
    assert listed.strip() == "batchedmodel.batchfill.io/text-recognizer"
    assert _survivors(run_dir), "nothing of the demo is running while it says it stays up"

    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, rest[-4000:]
    assert "everything the demo started has been stopped" in rest
    assert _wait_gone(run_dir) == []
    assert list(run_dir.iterdir()) == []


def test_demo_stops_everything_on_sigterm_and_exits_143(tmp_path: Path) -> None:
    # What a CI job's timeout or `kill` sends: the same cleanup as Ctrl-C, and 128 + SIGTERM like `batchfill serve`.
    run_dir = tmp_path / "demo"
    proc = _demo(run_dir, "--duration", "3")
    # once a tritonserver serves a Ready pod, everything runs: control plane, operator, tritonservers
    text = _read_until(proc, "tritonserver pid", 300)
    running = _survivors(run_dir)
    assert any("tritonserver" in p for p in running), text[-4000:]
    assert any("batchfill.cli run" in p for p in running), running
    os.kill(proc.pid, signal.SIGTERM)  # the demo process only, as a supervisor would
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, rest[-4000:]
    assert "everything the demo started has been stopped" in rest
    assert _wait_gone(run_dir) == []
    assert list(run_dir.iterdir()) == []
