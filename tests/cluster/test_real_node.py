"""A real node (kubelet + containerd + CNI in its own network namespace) in the local dev cluster, end to end:
``cluster_up(real_nodes=1)`` -> the node is Ready -> a busybox pod runs on it with an IP in the node's pod
CIDR, ``kubectl logs`` works, its HTTP server answers from the root namespace -> ``cluster_down`` -> nothing the
node made is left (:func:`batchfill.testbed.node.leftovers`, and an independent look at /proc/mounts, the
network namespaces, the links, the cgroup directories and the kernel sysctls a kubelet would change). The second
test runs ``up`` and ``down`` as separate commands with a crash of the node's kubelet and containerd between. The
third goes through the node's fake GPUs: the kubelet advertises what the fake-GPU device plugin registered, a pod
gets a device's ID in ``NVIDIA_VISIBLE_DEVICES``, a pod asking for more than are free waits with the scheduler's
reason until the first is deleted, and the plugin registers again after the kubelet restarts.

This test starts a cluster of its own (the session's ``kube`` cluster has no real nodes). It needs root
(network namespaces, mounts, cgroups) and the Debian packages of the Makefile's DEB_PACKAGES.
"""

from __future__ import annotations

import os
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
from batchfill.testbed.devcluster.nodes import GPU_PRODUCT, GPU_RESOURCE, gpu_labels
from batchfill.testbed.devcluster.state import ClusterState
from batchfill.testbed.gpu_plugin import device_ids
from batchfill.testbed.node import REAL_NODE_LABEL, RealNodes, gpus_allocatable, leftovers, real_nodes, restart_kubelet
from batchfill.testbed.node.cleanup import pids_in_netns
from batchfill.testbed.node.images import busybox_image

from .support import require_real_node_tools, wait_for

pytestmark = pytest.mark.cluster
#: conftest.py builds the kubelet at collection time (outside the test's timeout) when this is selected.
NEEDS_KUBELET = True

SYSCTLS = ("kernel.panic", "kernel.panic_on_oops", "vm.overcommit_memory", "net.ipv4.ip_forward")
HTTP_PORT = 8080
#: Fake GPUs per real node (cluster_up's default real_node_gpus).
GPUS = 4


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


@pytest.fixture
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[devcluster.ClusterInfo, Path]]:
    require_real_node_tools()
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
    require_real_node_tools()
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


def _gpu_pod(name: str, image: str, gpus: int) -> dict[str, Any]:
    """A busybox pod asking for ``gpus`` nvidia.com/gpu on a real node of the product the GPU labels name."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {REAL_NODE_LABEL: "real", "nvidia.com/gpu.product": GPU_PRODUCT},
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": image, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "env; exec sleep 3600"],
                "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
            }],
        },
    }  # fmt: skip


def _gpu_owners(node: Any) -> set[str]:
    """The field managers that own ``status.capacity["nvidia.com/gpu"]`` of ``node``."""
    return {
        m.manager
        for m in node.metadata.managed_fields or []
        if '"f:nvidia.com/gpu"' in str(m.fields_v1).replace("'", '"') and "f:capacity" in str(m.fields_v1)
    }


def _visible_devices(info: devcluster.ClusterInfo, pod: str) -> list[str]:
    out = devcluster.kubectl(info, "exec", pod, "--", "/bin/sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES").stdout
    return out.strip().split(",")


def _registrations(log: Path) -> int:
    return log.read_text().count(f"registered {GPUS} {GPU_RESOURCE}")


def test_real_node_gpus_come_from_the_device_plugin(
    real_cluster: tuple[devcluster.ClusterInfo, Path], machine_before: dict[str, Any]
) -> None:
    info, run_dir = real_cluster
    (node,) = real_nodes(run_dir)
    assert node.gpus == GPUS
    plugin = node.processes["gpu-plugin"]
    assert plugin.alive()
    ids = device_ids(node.name, GPUS)
    image = busybox_image()[0]
    plugin_log = node.log_path("gpu-plugin")
    assert _registrations(plugin_log) == 1
    with devcluster.api_client(info.kubeconfig) as api:
        core: Any = client.CoreV1Api(api)
        # (a) capacity and allocatable come from the kubelet's device manager, not from a patch of ours.
        n = core.read_node(node.name)
        assert n.status.capacity[GPU_RESOURCE] == str(GPUS)
        assert n.status.allocatable[GPU_RESOURCE] == str(GPUS)
        assert _gpu_owners(n) == {"kubelet"}, [m.manager for m in n.metadata.managed_fields]
        assert gpu_labels(GPUS).items() <= n.metadata.labels.items()

        # (b) one GPU: the container sees the device's ID as from the NVIDIA plugin.
        t0 = time.monotonic()
        core.create_namespaced_pod("default", _gpu_pod("gpu-one", image, 1))
        wait_for("pod gpu-one Running", lambda: core.read_namespaced_pod("gpu-one", "default").status.phase
                 == "Running", timeout_s=120)  # fmt: skip
        print(f"1-GPU pod Running {time.monotonic() - t0:.1f} s after create")
        (one,) = _visible_devices(info, "gpu-one")
        assert one in ids
        logs = wait_for("env in the log of gpu-one", lambda: devcluster.kubectl(info, "logs", "gpu-one").stdout)
        assert f"NVIDIA_VISIBLE_DEVICES={one}" in logs.split()
        assert "BATCHFILL_FAKE_GPU=1" in logs.split()

        # (c) all GPUs while one is taken: Pending with the scheduler's reason, scheduled once it is freed.
        core.create_namespaced_pod("default", _gpu_pod("gpu-all", image, GPUS))

        def unschedulable() -> Any:
            pod = core.read_namespaced_pod("gpu-all", "default")
            cond = next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)
            return cond if cond is not None and cond.status == "False" else None

        cond = wait_for("gpu-all Unschedulable", unschedulable)
        assert cond.reason == "Unschedulable", cond
        assert f"Insufficient {GPU_RESOURCE}" in cond.message, cond
        assert core.read_namespaced_pod("gpu-all", "default").spec.node_name is None
        t0 = time.monotonic()
        core.delete_namespaced_pod("gpu-one", "default", grace_period_seconds=0)
        wait_for("pod gpu-all Running", lambda: core.read_namespaced_pod("gpu-all", "default").status.phase
                 == "Running", timeout_s=120)  # fmt: skip
        print(f"{GPUS}-GPU pod Running {time.monotonic() - t0:.1f} s after the 1-GPU pod was deleted")
        assert sorted(_visible_devices(info, "gpu-all")) == sorted(ids)

    # (d) the kubelet restarts: the plugin (the same process) serves and registers again.
    t0 = time.monotonic()
    new = restart_kubelet(run_dir, node.name, die_with_parent=True)
    assert new.pid != node.processes["kubelet"].pid
    wait_for("the plugin registered again", lambda: _registrations(plugin_log) >= 2, timeout_s=120)
    t_reg = time.monotonic() - t0
    wait_for(f"{GPU_RESOURCE}={GPUS} allocatable again", lambda: gpus_allocatable(info.kubeconfig, {node.name: GPUS}),
             timeout_s=120)  # fmt: skip
    print(f"kubelet restart: plugin registered again {t_reg:.1f} s, allocatable {GPUS} {time.monotonic() - t0:.1f} s "
          "after SIGTERM")  # fmt: skip
    assert plugin.alive()
    assert real_nodes(run_dir)[0].processes["gpu-plugin"].pid == plugin.pid
    assert "serving and registering again" in plugin_log.read_text()
    state = ClusterState.load(run_dir)
    assert state is not None
    real = RealNodes.from_record(state.real_nodes)
    assert real.running(1, GPUS)

    devcluster.cluster_down(run_dir, quiet=True)
    assert not plugin.alive()
    _assert_nothing_left(real, run_dir, machine_before)
