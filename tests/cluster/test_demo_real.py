"""`batchfill demo --real-nodes` (`make demo REAL=1`) as a user runs it: the example on the operator's real pods.

Checked: exit 0 with the SLA held; the Triton pod Running on the real node with the GPU the device plugin
allocated (the node's Allocated resources and the container's NVIDIA_VISIBLE_DEVICES); ``kubectl get bm`` under
load with FILL and QUEUE MS filled in from the real Prometheus; no HoldMetricsUnknown Warning; the load sent
through the Service; and that nothing it started survives the run or a Ctrl-C during the load (processes, the
node's namespaces, mounts, veths, cgroups).
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchfill.cli import demo
from batchfill.testbed.node.cleanup import mounts_under

from .conftest import USE_EXISTING
from .support import require_real_node_tools
from .test_demo import SLACK_S, Demo, _wait_gone, demos  # noqa: F401 - demos is a fixture

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(USE_EXISTING, reason="the demo starts its own cluster with a real node"),
]
#: conftest.py builds the kubelet at collection time (outside the test's timeout) when this is selected.
NEEDS_KUBELET = True


@pytest.fixture(autouse=True)
def _root_and_tools() -> None:
    require_real_node_tools()


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """A short run directory: pytest's tmp_path is too deep for the node's containerd sockets (104 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="bfd-"))
    yield path / "d"
    shutil.rmtree(path, ignore_errors=True)


def _node_netns() -> list[str]:
    import subprocess

    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith("bf-")]


def _assert_nothing_left(run_dir: Path, netns_before: list[str]) -> None:
    assert _wait_gone(run_dir, 10.0) == []
    assert mounts_under(run_dir) == []
    assert sorted(_node_netns()) == sorted(netns_before)


def test_real_node_demo_serves_from_the_pods_within_the_sla(run_dir: Path, demos: list[Demo]) -> None:  # noqa: F811
    before = _node_netns()
    d = Demo(run_dir, "--real-nodes", "--duration", "40")
    demos.append(d)
    code = d.wait_exit(1200)
    out = d.text
    assert code == 0, out[-8000:]
    # the pod Running on the real node, with the GPU the device plugin allocated
    assert re.search(
        r"text-recognizer-triton-\S+\s+1/1\s+Running\s+\d+\s+\S+\s+10\.\d+\.1\.\d+\s+real-node-0\s", out
    ), out
    assert re.search(r"nvidia\.com/gpu\s+1\s+1\n", out), out
    assert re.search(r"NVIDIA_VISIBLE_DEVICES=fake-gpu-real-node-0-\d\n", out), out
    assert "BATCHFILL_TRITON_CPU_IMAGE=batchfill.local/tritonserver:" in out, out
    # the operator decided on real signals: FILL and QUEUE MS filled in under load, no Prometheus trouble
    # (PLACEMENT, status.placement.mode, is empty or Dedicated for a model without spec.placement)
    row = re.search(r"ocr\s+text-recognizer\s+500\s+(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+(?:Dedicated\s+)?True", out)
    assert row, out
    assert 0 < float(row.group(3)) <= 1, row.group(0)
    assert float(row.group(4)) >= 0, row.group(0)
    assert not re.search(r"Warning\s+HoldMetricsUnknown", out), out
    assert "job serviceMonitor/ocr/text-recognizer-triton/0" in out, out
    # the load went through the Service, answered within T
    assert "through Service ocr/text-recognizer-triton" in out, out
    table = re.search(
        r"│\s*text-recognizer-triton-\S+\s*│\s*[0-9.]+\s*│\s*[0-9.]+\s*│\s*[0-9.]+\s*│\s*(\d+)/0\s*│", out
    )
    assert table, out
    assert int(table.group(1)) > 0, out
    match = re.search(r"SLA kept: worst server p99 ([0-9.]+) ms against T = 450 ms", out)
    assert match, out
    assert 0 < float(match.group(1)) <= 450, out
    _assert_nothing_left(run_dir, before)
    assert list(run_dir.iterdir()) == [], "the demo left its working directory behind"


@pytest.mark.parametrize(
    ("step", "marker", "delay_s"),
    [
        ("node start", "real-node-0: node IP", 0.0),
        ("image import", "advertises 4 nvidia.com/gpu", 0.5),
        ("pods starting", "with the profile measured here", 2.0),
        ("load", "through Service ocr/text-recognizer-triton", 3.0),
    ],
    ids=["node start", "image import", "pods starting", "load"],
)
def test_real_node_demo_ctrl_c_at_any_step_stops_everything(
    run_dir: Path,
    demos: list[Demo],  # noqa: F811
    step: str,
    marker: str,
    delay_s: float,
) -> None:
    before = _node_netns()
    d = Demo(run_dir, "--real-nodes", "--duration", "120", sigint="default")
    demos.append(d)
    d.wait_for(marker, 1200)
    time.sleep(delay_s)
    since = d.interrupt()
    code = d.wait_exit(demo.stop_timeout_s(real_nodes=True) + SLACK_S)
    assert code == 130, d.text[-6000:]
    said = re.search(r"stopping what the demo started: .* \(at most (\d+) s\)", d.text)
    assert said, d.text[-4000:]
    assert float(said.group(1)) <= demo.stop_timeout_s(real_nodes=True), d.text[-4000:]
    assert time.monotonic() - since <= float(said.group(1)) + SLACK_S, step
    assert "everything the demo started has been stopped" in d.text, d.text[-4000:]
    _assert_nothing_left(run_dir, before)
