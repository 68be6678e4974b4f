"""The pure parts of the dev cluster's real nodes (batchfill.testbed.node): the address plan and its overlap check,
the rendered CNI, containerd and kubelet configurations, mountinfo parsing, the leftovers' sysctl comparison,
the state record's round trip, and building the kubelet only when real nodes ask for it."""

from __future__ import annotations

import io
import ipaddress
import os
import tomllib
from pathlib import Path

import pytest
from rich.console import Console

from batchfill.testbed.devcluster.nodes import fake_node, gpu_labels
from batchfill.testbed.devcluster.state import ClusterState
from batchfill.testbed.node import cgroups, cni, containerd, kubelet, mountns
from batchfill.testbed.node.cleanup import leftovers, mounts_under, sysctl_changes
from batchfill.testbed.node.lifecycle import RealNodeError, check_plans
from batchfill.testbed.node.plan import MAX_REAL_NODES, AddressPlanError, overlaps, plan_node, plan_nodes
from batchfill.testbed.node.record import RealNode, RealNodes
from batchfill.testbed.process import Process, proc_stat


def test_plan_of_the_first_two_nodes() -> None:
    a, b = plan_nodes("127.37.0.0/16", 2)
    assert (a.name, a.netns, a.veth_host, a.cgroup_root) == ("real-node-0", "bf-37-0", "bf37n0h", "/batchfill-37-0")
    assert (a.host_ip, a.node_ip, a.link, a.pod_cidr, a.gateway_ip) == (
        "10.37.0.1", "10.37.0.2", "10.37.0.0/30", "10.37.1.0/24", "10.37.1.1",
    )  # fmt: skip
    assert (b.host_ip, b.node_ip, b.link, b.pod_cidr) == ("10.37.0.5", "10.37.0.6", "10.37.0.4/30", "10.37.2.0/24")
    assert a.private_block == "10.37.0.0/16"


def test_plans_are_disjoint_and_inside_the_private_block() -> None:
    plans = plan_nodes("127.254.0.0/16", MAX_REAL_NODES)
    block = ipaddress.IPv4Network("10.254.0.0/16")
    nets = [ipaddress.IPv4Network(p.link) for p in plans] + [ipaddress.IPv4Network(p.pod_cidr) for p in plans]
    assert all(n.subnet_of(block) for n in nets)
    assert all(not x.overlaps(y) for i, x in enumerate(nets) for y in nets[i + 1 :])
    for p in plans:
        assert ipaddress.IPv4Address(p.node_ip) in ipaddress.IPv4Network(p.link)
        assert ipaddress.IPv4Address(p.host_ip) in ipaddress.IPv4Network(p.link)
        assert len(p.veth_host) <= 15  # IFNAMSIZ - 1
    assert len({p.netns for p in plans}) == MAX_REAL_NODES


@pytest.mark.parametrize(
    ("block", "count"), [("127.5.0.0/24", 1), ("10.5.0.0/16", 1), ("127.5.0.0/16", MAX_REAL_NODES + 1)]
)
def test_plan_rejects_bad_blocks_and_counts(block: str, count: int) -> None:
    with pytest.raises(AddressPlanError):
        plan_nodes(block, count)


def test_plan_rejects_octets_outside_the_pod_block_range() -> None:
    with pytest.raises(AddressPlanError):
        plan_node(1, 0)
    with pytest.raises(AddressPlanError):
        plan_node(5, -1)


def test_overlaps_names_the_clashing_networks_and_ignores_default_and_ipv6() -> None:
    plans = plan_nodes("127.9.0.0/16", 1)
    machine = ["default", "192.0.2.0/24", "10.0.0.0/8", "10.9.3.0/24", "10.10.0.0/16", "fe80::/64", "127.0.0.0/8"]
    assert overlaps(plans, machine) == ["10.0.0.0/8 overlaps 10.9.0.0/16", "10.9.3.0/24 overlaps 10.9.0.0/16"]
    assert overlaps(plans, ["192.0.2.2/24", "0.0.0.0/0"]) == []


def test_check_plans_refuses_overlaps_and_taken_namespaces() -> None:
    plans = plan_nodes("127.9.0.0/16", 2)
    check_plans(plans, ["192.0.2.0/24"], ["bf-8-0"])
    with pytest.raises(RealNodeError, match=r"10\.9\.0\.0/30 overlaps"):
        check_plans(plans, ["10.9.0.0/30"], [])
    with pytest.raises(RealNodeError, match="bf-9-1"):
        check_plans(plans, [], ["bf-9-1"])


def test_cni_conflist_is_bridge_host_local_portmap_loopback_on_the_pod_cidr() -> None:
    plan = plan_node(12, 3)
    conf = cni.conflist(plan, Path("/run/x/ipam"))
    assert [p["type"] for p in conf["plugins"]] == ["bridge", "portmap", "loopback"]
    bridge = conf["plugins"][0]
    assert (bridge["bridge"], bridge["isGateway"], bridge["ipMasq"]) == ("bf-cni0", True, False)
    ipam = bridge["ipam"]
    assert ipam["type"] == "host-local"
    assert ipam["ranges"] == [[{"subnet": "10.12.4.0/24", "gateway": "10.12.4.1"}]]
    assert ipam["routes"] == [{"dst": "10.12.0.0/16"}]  # no default route out of the test bed
    assert ipam["dataDir"] == "/run/x/ipam"


def test_containerd_config_keeps_everything_under_the_node_dir() -> None:
    paths = containerd.ContainerdPaths(Path("/r/real-node-0/containerd"))
    doc = tomllib.loads(containerd.config_toml(paths, "batchfill.local/busybox:abc", Path("/r/real-node-0/cni")))
    assert doc["version"] == 2
    assert "io.containerd.snapshotter.v1.aufs" in doc["disabled_plugins"]  # it would modprobe aufs
    assert (doc["root"], doc["state"]) == ("/r/real-node-0/containerd/root", "/r/real-node-0/containerd/state")
    assert doc["grpc"]["address"] == "/r/real-node-0/containerd/containerd.sock"
    assert doc["plugins"]["io.containerd.internal.v1.opt"]["path"] == "/r/real-node-0/containerd/opt"
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "batchfill.local/busybox:abc"
    assert cri["restrict_oom_score_adj"] is True
    assert cri["netns_mounts_under_state_dir"] is True
    assert cri["containerd"]["snapshotter"] == "overlayfs"
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert runc == {"SystemdCgroup": False, "Root": "/r/real-node-0/containerd/runc"}
    assert cri["cni"] == {"bin_dir": "/usr/lib/cni", "conf_dir": "/r/real-node-0/cni", "max_conf_num": 1}


def test_kubelet_config_fields_that_matter_here() -> None:
    plan = plan_node(7, 0)
    root = Path("/r/real-node-0/kubelet")
    conf = kubelet.kubelet_config(plan, root, Path("/r/pki/ca.crt"), Path("/r/real-node-0/containerd/containerd.sock"))
    assert conf["kind"] == "KubeletConfiguration"
    assert (conf["address"], conf["readOnlyPort"], conf["healthzBindAddress"]) == ("10.7.0.2", 0, "127.0.0.1")
    assert conf["failCgroupV1"] is False
    assert (conf["cgroupDriver"], conf["cgroupRoot"]) == ("cgroupfs", "/batchfill-7-0")
    assert conf["protectKernelDefaults"] is True
    assert conf["authentication"]["anonymous"]["enabled"] is False
    assert conf["authentication"]["webhook"]["enabled"] is True
    assert conf["authentication"]["x509"]["clientCAFile"] == "/r/pki/ca.crt"
    assert conf["authorization"]["mode"] == "Webhook"
    assert conf["containerRuntimeEndpoint"] == "unix:///r/real-node-0/containerd/containerd.sock"
    assert conf["imageGCHighThresholdPercent"] == 100
    assert conf["podCIDR"] == "10.7.1.0/24"
    assert conf["podLogsDir"] == "/r/real-node-0/pod-logs"
    argv = kubelet.command(Path("/b/kubelet"), plan, Path("c.yaml"), Path("k"), root, Path("/r/pki2"))
    assert "--node-ip=10.7.0.2" in argv
    assert "--hostname-override=real-node-0" in argv
    assert "--node-labels=batchfill.dev/node=real" in argv
    assert conf["nodeStatusUpdateFrequency"] == "2s"
    gpu = kubelet.command(Path("/b/kubelet"), plan, Path("c.yaml"), Path("k"), root, Path("/r/pki2"), gpu_labels(4))
    (labels,) = [a.removeprefix("--node-labels=") for a in gpu if a.startswith("--node-labels=")]
    assert dict(kv.split("=", 1) for kv in labels.split(",")) == {
        "batchfill.dev/node": "real", "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920",
        "node.kubernetes.io/instance-type": "fake-4x-a100",
    }  # fmt: skip
    # The kwok GPU nodes carry the same labels.
    assert gpu_labels(4).items() <= fake_node("gpu-node-0", 0, 4, "127.9.0.0/16")["metadata"]["labels"].items()
    assert kubelet.node_subject("real-node-0") == "/O=system:nodes/CN=system:node:real-node-0"


MOUNTINFO = r"""22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 27 254:0 /tmp/run/real-node-0 /tmp/run/real-node-0 rw shared:1 - ext4 /dev/vda rw
51 50 0:40 / /tmp/run/real-node-0/kubelet/pods/u/volumes/kubernetes.io~projected/tok rw shared:1 - tmpfs tmpfs rw
52 50 0:41 / /tmp/run/real-node-0/containerd/state/a\040b/rootfs rw shared:1 - overlay overlay rw
53 27 0:42 / /tmp/run/real-node-00 rw - tmpfs tmpfs rw
"""


def test_mountinfo_parsing_and_mounts_under_deepest_first() -> None:
    parsed = cgroups.parse_mountinfo(MOUNTINFO)
    assert ("/tmp/run/real-node-0/containerd/state/a b/rootfs", "overlay") in parsed
    assert cgroups.hierarchies(MOUNTINFO) == [Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/unified")]
    found = mounts_under(Path("/tmp/run/real-node-0"), MOUNTINFO)
    assert found[-1] == "/tmp/run/real-node-0"  # the node dir's own bind mount goes last
    assert set(found) == {
        "/tmp/run/real-node-0",
        "/tmp/run/real-node-0/kubelet/pods/u/volumes/kubernetes.io~projected/tok",
        "/tmp/run/real-node-0/containerd/state/a b/rootfs",
    }  # not /tmp/run/real-node-00


def test_sysctl_changes_lists_only_changed_values() -> None:
    before = {"kernel.panic": "1", "vm.overcommit_memory": "0", "net.ipv4.ip_forward": "0"}
    now = {"kernel.panic": "10", "vm.overcommit_memory": "0", "net.ipv4.ip_forward": "0"}
    assert sysctl_changes(before, now) == ["sysctl kernel.panic 1 -> 10"]
    assert sysctl_changes(before, dict(before)) == []


def test_kubelet_sysctl_view_binds_a_file_per_value(tmp_path: Path) -> None:
    files = mountns.write_values(tmp_path / "v")
    binds = mountns.sysctl_binds(files)
    assert binds["/proc/sys/vm/overcommit_memory"].read_text() == "1\n"
    assert binds["/proc/sys/kernel/panic"].read_text() == "10\n"
    assert binds["/proc/sys/kernel/panic_on_oops"].read_text() == "1\n"
    pairs = mountns.bind_points({str(tmp_path / "target"): tmp_path / "src", **binds})
    assert (str(tmp_path / "src"), str(tmp_path / "target")) in pairs
    assert (tmp_path / "src").is_dir()
    assert (tmp_path / "target").is_dir()


def test_real_nodes_record_round_trips_through_the_cluster_state(tmp_path: Path) -> None:
    node = RealNode(plan_node(21, 0), tmp_path / "real-node-0", netns_inode=4026532999)
    node.processes["kubelet"] = Process(pid=123, start_ticks=456, exe="/b/kubelet", name="kubelet-real-node-0")
    real = RealNodes([node], {"kernel.panic": "1"})
    state = ClusterState(server="https://127.0.0.1:1", kubeconfig="k", bin_dir="b", ports={}, real_nodes=real.record())
    state.save(tmp_path)
    loaded = ClusterState.load(tmp_path)
    assert loaded is not None
    back = RealNodes.from_record(loaded.real_nodes)
    assert back.sysctls == {"kernel.panic": "1"}
    (n,) = back.nodes
    assert n.plan == node.plan
    assert n.netns_inode == 4026532999
    assert n.device_plugin_dir == tmp_path / "real-node-0" / "kubelet" / "device-plugins"
    assert n.processes["kubelet"].record() == {"pid": 123, "start_ticks": 456, "exe": "/b/kubelet"}
    assert not back.running(1)  # PID 123 is not that kubelet
    assert n.gpus == 0
    assert n.expected_processes == ("apiproxy", "containerd", "kubelet")
    assert RealNodes.from_record({}).nodes == []


def test_a_node_with_gpus_records_them_and_runs_the_device_plugin(tmp_path: Path) -> None:
    """``running`` needs the ``gpu-plugin`` process of a node with GPUs, alive, and the asked GPU count."""
    node = RealNode(plan_node(21, 0), tmp_path / "real-node-0", gpus=4)
    assert node.expected_processes == ("apiproxy", "containerd", "kubelet", "gpu-plugin")
    back = RealNodes.from_record(RealNodes([node]).record()).nodes[0]
    assert back.gpus == 4
    stat = proc_stat(os.getpid())
    assert stat is not None
    argv0 = Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode()
    alive = Process(pid=os.getpid(), start_ticks=int(stat[19]), exe=argv0)  # this test's own process
    assert alive.alive()
    node.processes = dict.fromkeys(("apiproxy", "containerd", "kubelet"), alive)
    real = RealNodes([node])
    assert not real.running(1)  # no device plugin
    node.processes["gpu-plugin"] = alive
    assert real.running(1)
    assert real.running(1, 4)
    assert not real.running(1, 2)  # another GPU count: cluster_up starts afresh


def test_leftovers_of_a_node_that_made_nothing_is_only_a_changed_sysctl(tmp_path: Path) -> None:
    panic = Path("/proc/sys/kernel/panic").read_text().strip()
    # Octet 2's node 63 (10.2.0.252/30, netns bf-2-63) is made by no test; its directory does not exist.
    node = RealNode(plan_node(2, 63), tmp_path / "never-made")
    other = str(int(panic) + 1)
    assert leftovers(RealNodes([node], {"kernel.panic": panic})) == []
    assert leftovers(RealNodes([node], {"kernel.panic": other})) == [f"sysctl kernel.panic {other} -> {panic}"]


def test_ensure_binaries_builds_the_kubelet_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from batchfill.testbed import devcluster
    from batchfill.testbed.devcluster.binaries import VERSION_OF

    monkeypatch.setenv("BATCHFILL_K8S_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("BATCHFILL_BUILD_KUBELET", raising=False)
    bins = devcluster.bin_dir()
    bins.mkdir(parents=True)
    for name in devcluster.BINARIES:
        (bins / name).write_text("#!/bin/sh\n")
        (bins / f".{name}.version").write_text(VERSION_OF[name] + "\n")
    stage = devcluster.kwok_stages_dir() / "node" / "fast" / "node-initialize.yaml"
    stage.parent.mkdir(parents=True)
    stage.write_text("kind: Stage\n")
    # A stand-in for scripts/build-k8s.sh: builds the kubelet when BATCHFILL_BUILD_KUBELET=1, as the real one does.
    script = tmp_path / "build.sh"
    script.write_text(
        'echo "$BATCHFILL_BUILD_KUBELET" >> "$BATCHFILL_K8S_CACHE/asked"\n'
        'if [ "$BATCHFILL_BUILD_KUBELET" = 1 ]; then\n'
        f'  d="$BATCHFILL_K8S_CACHE/{devcluster.K8S_VERSION}/bin"; echo x > "$d/kubelet"; '
        f'echo {devcluster.K8S_VERSION} > "$d/.kubelet.version"\n'
        "fi\n"
    )
    monkeypatch.setenv("BATCHFILL_BUILD_K8S_SCRIPT", str(script))
    assert devcluster.missing_binaries() == []
    assert devcluster.missing_binaries(kubelet=True) == ["kubelet"]
    assert devcluster.ensure_binaries(quiet_console()) == bins  # nothing missing: no build
    assert not (tmp_path / "cache" / "asked").exists()
    assert devcluster.ensure_binaries(quiet_console(), kubelet=True) == bins
    assert (tmp_path / "cache" / "asked").read_text() == "1\n"
    assert devcluster.missing_binaries(kubelet=True) == []


def quiet_console() -> Console:
    return Console(file=io.StringIO(), log_path=False)


def test_cpu_shares_map_onto_the_cgroup_v2_weight_range() -> None:
    assert [cgroups.cpu_weight_v2(s) for s in (0, 2, 1024, cgroups.NODE_CPU_SHARES, 262144, 10**6)] == [
        1, 1, 39, 313, 10000, 10000,
    ]  # fmt: skip
