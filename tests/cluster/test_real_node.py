"""A real node (kubelet + containerd + CNI in its own network namespace) in the local dev cluster, end to end:
``cluster_up(real_nodes=1)`` -> the node is Ready -> a busybox pod runs on it with an IP in the node's pod
CIDR, ``kubectl logs`` works, its HTTP server answers from the root namespace -> ``cluster_down`` -> nothing the
node made is left (:func:`batchfill.testbed.node.leftovers`, and an independent look at /proc/mounts, the
network namespaces, the links, the cgroup directories and the kernel sysctls a kubelet would change). The second
test runs ``up`` and ``down`` as separate commands with a crash of the node's kubelet and containerd between.

This test starts a cluster of its own (the session's ``kube`` cluster has no real nodes). It needs root
(network namespaces, mounts, cgroups) and the Debian packages of the Makefile's DEB_PACKAGES.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from batchfill.testbed import devcluster
from batchfill.testbed.devcluster.state import ClusterState
from batchfill.testbed.node import REAL_NODE_LABEL, RealNodes, leftovers, real_nodes
from batchfill.testbed.node.cleanup import pids_in_netns
from batchfill.testbed.node.images import busybox_image

from .support import skip_or_fail, wait_for

pytestmark = pytest.mark.cluster
#: conftest.py builds the kubelet at collection time (outside the test's timeout) when this is selected.
NEEDS_KUBELET = True

SYSCTLS = ("kernel.panic", "kernel.panic_on_oops", "vm.overcommit_memory", "net.ipv4.ip_forward")
HTTP_PORT = 8080


def _sysctls() -> dict[str, str]:
    return {n: Path("/proc/sys", n.replace(".", "/")).read_text().strip() for n in SYSCTLS}


def _cgroup_dirs() -> set[str]:
    return {str(p) for p in Path("/sys/fs/cgroup").glob("*/*") if p.is_dir()}


def _netns() -> set[str]:
    return set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split())


def _links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def _mounts_under(run_dir: Path) -> list[str]:
    return [line for line in Path("/proc/mounts").read_text().splitlines() if str(run_dir) in line]


@pytest.fixture
def machine_before() -> dict[str, Any]:
    """What the independent leak check compares with, taken before the cluster starts."""
    return {"sysctls": _sysctls(), "cgroups": _cgroup_dirs(), "netns": _netns(), "links": _links()}


def _require_root_and_tools() -> None:
    if os.geteuid() != 0:
        skip_or_fail("real nodes need root (network namespaces, mounts, cgroups)")
    missing = [t for t in ("containerd", "runc", "ctr", "umoci", "skopeo", "ip") if shutil.which(t) is None]
    if missing:
        skip_or_fail(f"real nodes need {missing} (the Makefile's DEB_PACKAGES)")


@pytest.fixture
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[devcluster.ClusterInfo, Path]]:
    _require_root_and_tools()
    run_dir = tmp_path_factory.mktemp("realnode")
    try:
        info = devcluster.cluster_up(run_dir, 0, 0, real_nodes=1, die_with_parent=True, quiet=True)
    except BaseException:
        devcluster.cluster_down(run_dir, quiet=True)
        raise
    try:
        yield info, run_dir
    finally:
        if run_dir.exists():
            devcluster.cluster_down(run_dir, quiet=True)


def _web_pod(image: str) -> dict[str, Any]:
    script = f"echo hello-from-real-node > /www/index.html; echo serving; exec /bin/httpd -f -v -p {HTTP_PORT} -h /www"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {
            "nodeSelector": {REAL_NODE_LABEL: "real"},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "web", "image": image, "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", script]}
            ],
        },
    }


def _http_get(url: str) -> str | None:
    """The body, or None while the server does not answer."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy: the pod IP is local
    try:
        with opener.open(url, timeout=5) as r:
            return str(r.read().decode())
    except OSError:
        return None


def _ours(names: set[str], octet: int) -> set[str]:
    """The names a real node of the cluster with pod block octet ``octet`` may make (other dev clusters on the
    machine may make theirs meanwhile): its namespace, links and cgroups, pod namespaces ``cni-*`` and
    containerd's own cgroups."""
    marks = (f"bf-{octet}-", f"bf{octet}n", f"batchfill-{octet}-", "cni-")
    return {n for n in names if any(m in n for m in marks) or n.rsplit("/", 1)[-1] in ("k8s.io", "default")}


def test_real_node_runs_a_pod_and_leaves_nothing(
    real_cluster: tuple[devcluster.ClusterInfo, Path], machine_before: dict[str, Any]
) -> None:
    info, run_dir = real_cluster
    state = ClusterState.load(run_dir)
    assert state is not None
    real = RealNodes.from_record(state.real_nodes)
    assert [n.name for n in real.nodes] == ["real-node-0"]
    assert [n.record() for n in real_nodes(run_dir)] == [n.record() for n in real.nodes]
    node = real.nodes[0]
    assert node.kubelet_root == run_dir / "real-node-0" / "kubelet"
    assert node.device_plugin_dir.is_dir()

    with devcluster.api_client(info.kubeconfig) as api:
        core: Any = client.CoreV1Api(api)
        n = core.read_node("real-node-0")
        assert n.metadata.labels[REAL_NODE_LABEL] == "real"
        assert n.spec.pod_cidr == node.plan.pod_cidr
        assert any(a.type == "InternalIP" and a.address == node.plan.node_ip for a in n.status.addresses)
        assert any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)

        t0 = time.monotonic()
        core.create_namespaced_pod("default", _web_pod(busybox_image()[0]))

        def running() -> Any:
            p = core.read_namespaced_pod("web", "default")
            return p if p.status.phase == "Running" and p.status.pod_ip else None

        pod = wait_for("pod web Running on real-node-0", running, timeout_s=120)
        print(f"pod Running {time.monotonic() - t0:.1f} s after create")
        assert pod.spec.node_name == "real-node-0"
        prefix = node.plan.pod_cidr.rsplit(".", 1)[0] + "."
        assert pod.status.pod_ip.startswith(prefix), (pod.status.pod_ip, node.plan.pod_cidr)

    logs = wait_for("kubectl logs of web", lambda: devcluster.kubectl(info, "logs", "web", check=False).stdout)
    assert "serving" in logs
    body = wait_for("the pod's HTTP server", lambda: _http_get(f"http://{pod.status.pod_ip}:{HTTP_PORT}/index.html"))
    assert body.strip() == "hello-from-real-node"
    # exec goes API server -> kubelet (node IP) -> containerd's stream server; the projected ServiceAccount
    # token is a tmpfs the kubelet mounts in its own mount namespace, seen by runc through the shared node dir.
    token_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    listing = devcluster.kubectl(info, "exec", "web", "--", "/bin/ls", token_dir).stdout.split()
    assert {"ca.crt", "namespace", "token"} <= set(listing)

    devcluster.cluster_down(run_dir, quiet=True)
    _assert_nothing_left(real, run_dir, machine_before)


def _assert_nothing_left(real: RealNodes, run_dir: Path, before: dict[str, Any]) -> None:
    """``leftovers`` finds nothing, and neither does an independent look at the machine."""
    assert not run_dir.exists()
    assert leftovers(real) == []
    assert _mounts_under(run_dir) == []
    assert _sysctls() == before["sysctls"]
    octet = real.nodes[0].plan.octet
    assert _ours(_cgroup_dirs() - before["cgroups"], octet) == set()
    assert _ours(_netns() - before["netns"], octet) == set()
    assert _ours(_links() - before["links"], octet) == set()


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "batchfill.cli", "dev-cluster", *args], check=True, timeout=300,
                   capture_output=True)  # fmt: skip


def test_down_in_another_process_after_the_kubelet_and_containerd_crashed(
    tmp_path_factory: pytest.TempPathFactory, machine_before: dict[str, Any]
) -> None:
    """``up`` and ``down`` are separate commands; the node's kubelet and containerd are SIGKILLed in between, so
    their container shims and containers are left running for ``down`` to find by namespace and cgroup."""
    _require_root_and_tools()
    run_dir = tmp_path_factory.mktemp("realnode-crash")
    _cli("up", "--run-dir", str(run_dir), "--gpu-nodes", "0", "--real-nodes", "1")
    try:
        info = devcluster.cluster_up(run_dir, 0, 0, real_nodes=1, quiet=True)
        assert info.reused  # the same set of real nodes: reused, not restarted
        state = ClusterState.load(run_dir)
        assert state is not None
        real = RealNodes.from_record(state.real_nodes)
        node = real.nodes[0]
        with devcluster.api_client(info.kubeconfig) as api:
            core: Any = client.CoreV1Api(api)
            core.create_namespaced_pod("default", _web_pod(busybox_image()[0]))
            wait_for("pod web Running", lambda: core.read_namespaced_pod("web", "default").status.phase == "Running",
                     timeout_s=120)  # fmt: skip
        for name in ("kubelet", "containerd"):
            os.kill(node.processes[name].pid, signal.SIGKILL)
        wait_for(
            "kubelet and containerd gone", lambda: not any(node.processes[n].alive() for n in ("kubelet", "containerd"))
        )
        assert pids_in_netns(node.netns_inode), "the container shims should outlive containerd"
        _cli("down", "--run-dir", str(run_dir))
    finally:
        if run_dir.exists():
            devcluster.cluster_down(run_dir, quiet=True)
    _assert_nothing_left(real, run_dir, machine_before)
